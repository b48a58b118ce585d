"""`python -m serve` is the `serve` command."""

from smtriton.serve.cli import main

main()
