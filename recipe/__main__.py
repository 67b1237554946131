"""`python -m recipe`: the same command line as entrypoint.py and the `grpo-recipe` script."""

from recipe.cli import console_main

console_main()
