#!/usr/bin/env python3
"""Container and command-line entrypoint: hands argv to `recipe.cli.main` (through `console_main`)."""

from recipe.cli import console_main

if __name__ == "__main__":
    console_main()
