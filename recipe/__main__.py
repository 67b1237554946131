"""`python -m recipe`: the same command line as entrypoint.py and the `grpo-recipe` script."""

import os
import signal


def _quiet_exit(signum: int, _frame: object) -> None:
    """A signal while the recipe's modules load: the shell's status for it (130, 143), no traceback."""
    os._exit(128 + signum)


# As entrypoint.py: from the first statement of this module on (the package's own __init__ is a docstring).
_quiet_exit.quiet_start = True  # type: ignore[attr-defined]  # how run_program knows it
if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
    signal.signal(signal.SIGINT, _quiet_exit)
signal.signal(signal.SIGTERM, _quiet_exit)

from recipe.cli import console_main  # noqa: E402  (after the handlers: its imports take most of a second)

console_main()
