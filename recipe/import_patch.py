"""A patch of one of verl's modules in the process that runs it: at once when the module is loaded, else the
moment it is imported.

Nothing is imported ahead of its time (a Ray worker that never needs the module pays nothing, and on npu
megatron is not imported before MindSpeed patches it), and a patch is applied only to the verl versions it was
read against; another version is left alone, and a warning names what is left out.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
from collections.abc import Callable, Sequence
from importlib import metadata
from types import ModuleType
from typing import Any

logger = logging.getLogger("recipe.import_patch")

#: What a patch does to a module it is given: True when the module is (now) patched.
Patch = Callable[[ModuleType], bool]


class PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds `target` with the other finders, and patches it right after it executes."""

    def __init__(self, target: str, patch: Patch) -> None:
        self.target = target
        self.patch = patch

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if fullname != self.target:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        exec_module = spec.loader.exec_module

        def exec_and_patch(module: ModuleType) -> None:
            exec_module(module)
            self.patch(module)

        spec.loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


def verl_is_one_of(versions: Sequence[str], left_out: str) -> bool:
    """Whether the installed verl is one of `versions`; when another is, a warning says that `left_out` is not done."""
    try:
        installed = metadata.version("verl")
    except metadata.PackageNotFoundError:
        return False
    if installed not in versions:
        logger.warning("verl %s: %s (checked against verl %s only)", installed, left_out, ", ".join(versions))
        return False
    return True


def patch_when_imported(target: str, patch: Patch) -> bool:
    """`patch` applied to module `target` in this process: now when it is loaded (its result), else once it is
    imported (True). Called again (every Ray worker task runs the setup hook), it adds no second finder."""
    module = sys.modules.get(target)
    if module is not None:
        return patch(module)
    if not any(isinstance(finder, PatchOnImport) and finder.target == target for finder in sys.meta_path):
        sys.meta_path.insert(0, PatchOnImport(target, patch))
    return True
