"""`python -m smtriton.serve` is the `serve` command (how tests and the benchmark start it)."""

from smtriton.serve.owner.cli import main

main()
