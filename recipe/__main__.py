"""`python -m recipe`: the same command line as entrypoint.py and the `grpo-recipe` script."""

import sys

from recipe.cli import main

sys.exit(main())
