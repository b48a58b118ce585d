"""`serve`'s main process: the command, the endpoint's owner (health, the multi-model table, sessions),
the worker pool and the start-up rules."""
