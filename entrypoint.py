#!/usr/bin/env python3
"""Container and command-line entrypoint: hands argv to `recipe.cli.main` (through `console_main`)."""

# First (issue 50): a signal while the recipe's modules load ends the program quietly (recipe.process_exit, stdlib only).
from recipe.process_exit import quiet_start

quiet_start()

from recipe.cli import console_main  # noqa: E402  (after quiet_start: its imports take most of a second)

if __name__ == "__main__":
    console_main()
