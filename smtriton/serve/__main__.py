"""`python -m serve` is the `serve` command."""

from smtriton.serve.owner.cli import main

main()
