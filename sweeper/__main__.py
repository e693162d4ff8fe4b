"""`python -m sweeper`: the `sweep` command line."""

from sweeper.cli import main

main()
