"""Ending a process with its own exit code, also where Ray's driver ran in it.

`ray.shutdown()` leaves Ray's native threads running (its GCS client's I/O loop and gRPC's
timers and event engine; Ray 2.60 has no call that ends them). When the interpreter then exits,
C++ static destructors run under those threads, and the process can die of SIGSEGV after all its
work is done: exit status 139 in place of the command's own. A Kubernetes Job reads that as a
failed run and starts it again. Ray ends its own worker processes with `os._exit` for this
reason (ray-project/ray#18899); a process of ours that connected a driver (the multi-node
readiness wait, the shared-storage check) ends the same way, after flushing what it wrote.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import traceback
from collections.abc import Callable
from typing import NoReturn

#: Ray's compiled core; loaded by `import ray`, and the library whose threads outlive ray.shutdown().
RAY_CORE_MODULE = "ray._raylet"


def ray_core_loaded() -> bool:
    """Whether this process loaded Ray's compiled core (and may have run a driver's native threads)."""
    return RAY_CORE_MODULE in sys.modules


def flush_outputs() -> None:
    """Write out what logging, stdout and stderr still hold (os._exit would drop it)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or its reader left: nothing more can reach it
            pass


def exit_process(code: int) -> NoReturn:
    """End the process with exit status CODE.

    Without Ray's core loaded, a normal exit (atexit handlers, finalizers). With it, flush the
    outputs and end at once with os._exit, skipping the interpreter's teardown that Ray's
    leftover threads can crash.
    """
    if not ray_core_loaded():
        sys.exit(code)
    flush_outputs()
    os._exit(code)


def exit_status(code: object) -> int:
    """The exit status sys.exit(CODE) gives: None is 0, an int itself, anything else is printed and is 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


class Terminated(BaseException):
    """SIGTERM arrived (`docker stop`, Kubernetes ending a pod): unwinds like Ctrl-C's KeyboardInterrupt."""


def _terminated(signum: int, _frame: object) -> None:
    raise Terminated(signum)


def _quiet_exit(signum: int, _frame: object) -> None:
    """A signal while the recipe's modules load: the shell's status for it (130, 143), no traceback."""
    os._exit(128 + signum)


def quiet_start() -> None:
    """From here until run_program takes over, a signal ends the program quietly with the shell's status.

    The first call of entrypoint.py and of `python -m recipe`, before the recipe's modules load (most of a
    second). A SIGINT this process was started ignoring (a background job) stays ignored.
    """
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, _quiet_exit)
    signal.signal(signal.SIGTERM, _quiet_exit)


def run_program(main: Callable[[], int]) -> NoReturn:
    """Run MAIN as the whole program and end the process with its status (exit_process).

    Also when MAIN ends by SystemExit (argparse's --help, --version and usage errors) or by an
    exception (its traceback is printed, status 1), which would otherwise reach the teardown.
    A signal ends it with the shell's status for that signal and no traceback: Ctrl-C
    (KeyboardInterrupt) 130, SIGTERM 143 (the README's exit table). Both unwind MAIN first, so its
    `finally` blocks run; a part of MAIN that passes them on to a child (`run`'s trainer) sets its
    own handler meanwhile.
    """
    if signal.getsignal(signal.SIGINT) is _quiet_exit:
        # quiet_start's handler for the start-up: from here on Ctrl-C unwinds MAIN (KeyboardInterrupt, below).
        signal.signal(signal.SIGINT, signal.default_int_handler)
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        code = main()
    except SystemExit as stop:
        code = exit_status(stop.code)
    except KeyboardInterrupt:
        code = 128 + signal.SIGINT
    except Terminated:
        code = 128 + signal.SIGTERM
    except Exception:  # noqa: BLE001  (the program's last word: print it as the interpreter would)
        traceback.print_exc()
        code = 1
    finally:
        signal.signal(signal.SIGTERM, previous)
    exit_process(code)
