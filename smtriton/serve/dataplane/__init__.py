"""A front worker's protocol-neutral work: the bodies it takes, what it asks of Triton and of the
main process (no HTTP here)."""
