"""`python -m serve` is the `serve` command."""

from serve.cli import main

main()
