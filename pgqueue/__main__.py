"""`python -m pgqueue` runs the CLI."""

from pgqueue._cli import main

main()
