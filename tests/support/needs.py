"""Skip only when a package is truly not installed; a broken install fails with its own error.

`pytest.importorskip("verl")` turns ANY ImportError raised while verl imports into a green
skip whose reason says "not installed": a missing or broken dependency deep inside verl (a
fake `tensordict` was enough) skipped four modules that way, the composition against verl's
real config among them. Here "installed or not" is asked of importlib.util.find_spec, which
runs none of the package's code (for a dotted name it imports the parent packages only);
when the package is there it is imported for real, and whatever that import raises becomes
the test's error, with its real message.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

import pytest


def installed(module: str) -> bool:
    """True when `module` can be found; False only when it (or a parent package of it) is absent.

    A parent package that is there but fails to import raises, as it should.
    """
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError as error:
        if error.name is not None and (module == error.name or module.startswith(error.name + ".")):
            return False
        raise


def needs(module: str, *, install: str) -> ModuleType:
    """`module` imported; a skip naming `install` (the install step that brings it) when it is not installed.

    Usable at module level (before the imports that need it) and inside tests and fixtures.
    """
    if not installed(module):
        pytest.skip(f"{module} is not installed: {install}", allow_module_level=True)
    return importlib.import_module(module)


#: The install steps the suites name (docs/testing.md, "What some tests need").
TRAINER_EXTRA = "pip install -e '.[trainer]'"
TEST_EXTRA = "pip install -e '.[test]'"
MEGATRON_BRIDGE = "bash .ci/install-megatron-bridge.sh (docs/export.md)"
