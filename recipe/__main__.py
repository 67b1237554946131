"""`python -m recipe`: the same command line as entrypoint.py and the `grpo-recipe` script."""

# First, as in entrypoint.py: a signal while the recipe's modules load ends the program quietly.
from recipe.process_exit import quiet_start

quiet_start()

from recipe.cli import console_main  # noqa: E402  (after quiet_start: its imports take most of a second)

console_main()
