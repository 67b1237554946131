"""Megatron-Bridge 0.6.2 and megatron-core 0.19.2 on CPU with Python 3.11: two import shims, tests only.

Both packages declare Python >= 3.12 and import GPU-only packages; on CPU with 3.11 they work
after these, shared by tests/bridge (the exports) and tests/e2e (the trainer's Megatron engine):
- `typing.override` (new in 3.12) from typing_extensions;
- a stand-in for `transformer_engine`, given ONLY to megatron/bridge/peft/lora_layers.py, which
  imports it unconditionally at module level for LoRA classes the tests never build. Every other
  importer still gets ImportError, so megatron-core keeps choosing its local (non-TE) code paths.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
import typing
from typing import Any

LORA_LAYERS = "megatron/bridge/peft/lora_layers.py"


class _StubModule(types.ModuleType):
    """Any attribute: a fresh class for Capitalised names (isinstance checks fail), else a submodule."""

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        value: Any = type(attr, (), {}) if attr[:1].isupper() else _StubModule(f"{self.__name__}.{attr}")
        setattr(self, attr, value)
        return value


class _LoraOnlyTransformerEngine(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves `transformer_engine*` only when the import comes from Megatron-Bridge's lora_layers.py."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] != "transformer_engine":
            return None
        frame = sys._getframe(1)
        while frame is not None:
            if frame.f_code.co_filename.replace("\\", "/").endswith(LORA_LAYERS):
                return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
            frame = frame.f_back
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def install_shims() -> None:
    """The two shims above; idempotent."""
    if not hasattr(typing, "override"):
        import typing_extensions

        typing.override = typing_extensions.override  # type: ignore[attr-defined]
    if not any(isinstance(f, _LoraOnlyTransformerEngine) for f in sys.meta_path):
        sys.meta_path.insert(0, _LoraOnlyTransformerEngine())
