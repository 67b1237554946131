#!/usr/bin/env python3
"""Container and command-line entrypoint: hands argv to `recipe.cli.main`."""

import sys

from recipe.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
