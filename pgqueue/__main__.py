"""`python -m pgqueue` runs the CLI."""

from pgqueue.cli import main

main()
