"""The multi-model table: the registry in the main process (loads, unloads, the archives and their
staging in Triton) and the records every front worker invokes models by."""
