"""Run a function right after a module has been executed (or at once, if it already was).

Patches must land between a module's definition of a name and its first use by another
module that imports the name directly (`from x import f`), so they hook the import itself.
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

Hook = Callable[[ModuleType], None]
_PENDING: dict[str, list[Hook]] = {}


def log(message: str) -> None:
    """One line on stdout, which verl's Ray workers forward to the trainer's log."""
    print(f"[tests.e2e.cpu] {message}", flush=True)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds a hooked module with the other finders and runs its hooks once it has executed."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        hooks = _PENDING.get(fullname)
        if not hooks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            original(module)
            for hook in _PENDING.pop(fullname, hooks):
                hook(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def after_import(name: str) -> Callable[[Hook], Hook]:
    """Decorator: call the function with module `name` once it is imported."""

    def register(hook: Hook) -> Hook:
        if name in sys.modules:
            hook(sys.modules[name])
        else:
            _PENDING.setdefault(name, []).append(hook)
        return hook

    return register


if not any(isinstance(finder, _PostImportFinder) for finder in sys.meta_path):
    sys.meta_path.insert(0, _PostImportFinder())
