"""pytest's own end, where a test ran a Ray driver inside the pytest process (hooks for a conftest).

Ray's native threads outlive ray.shutdown(), and the interpreter's teardown can then crash
(recipe/process_exit.py): CI saw `3947 passed` followed by a segmentation fault, exit status
139. After pytest has written its reports, a pytest process that loaded Ray's core ends with
its session's exit status through recipe.process_exit, as the recipe's own commands do.

Only where pytest is the program: a tool that calls pytest.main() in its own process
(mutmut's test runs) must get control back.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from recipe.process_exit import exit_process, ray_core_loaded

_SESSION = pytest.StashKey[pytest.Session]()


def is_pytest_the_program(argv0: str) -> bool:
    """Whether ARGV0 (sys.argv[0]) says pytest is the program: the `pytest` script or `python -m pytest`."""
    path = Path(argv0)
    return path.name in ("pytest", "py.test") or path.parts[-2:] == ("pytest", "__main__.py")


def pytest_sessionstart(session: pytest.Session) -> None:
    """Keep the session: its exit status is final only when pytest unconfigures."""
    session.config.stash[_SESSION] = session


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """The last hook: end here (reports written) where Ray's core is loaded and pytest owns the process."""
    session = config.stash.get(_SESSION, None)
    if session is None or not ray_core_loaded() or not is_pytest_the_program(sys.argv[0]):
        return
    config.get_terminal_writer().flush()
    exit_process(int(session.exitstatus))
