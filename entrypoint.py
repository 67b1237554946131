#!/usr/bin/env python3
"""Container and command-line entrypoint: hands argv to `recipe.cli.main` (through `console_main`)."""

import os
import signal


def _quiet_exit(signum: int, _frame: object) -> None:
    """A signal while the recipe's modules load: the shell's status for it (130, 143), no traceback."""
    os._exit(128 + signum)


# From the first statement on (issue 50): run_program takes over once the modules are loaded. A SIGINT this process
# was started ignoring (a background job) stays ignored.
_quiet_exit.quiet_start = True  # type: ignore[attr-defined]  # how run_program knows it
if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
    signal.signal(signal.SIGINT, _quiet_exit)
signal.signal(signal.SIGTERM, _quiet_exit)

from recipe.cli import console_main  # noqa: E402  (after the handlers: its imports take most of a second)

if __name__ == "__main__":
    console_main()
