"""A stand-in for `torchvision`, served only to transformers' image and video processor modules.

Loaded at start-up by every Python process of the e2e run (this folder is on PYTHONPATH,
tests/e2e/harness/plan.py), including the ones that never import verl: vLLM's model-inspection
subprocess imports vllm/model_executor/models/qwen3_5.py -> qwen3_vl.py -> transformers'
qwen2_vl image processor, whose module imports torchvision. .ci/install-e2e.sh removes PyPI's
torchvision (a CUDA build for another torch: "operator torchvision::nms does not exist" with
torch 2.13.0+cpu). The stubs only let those modules load: the run is text-only, nothing calls
them, and transformers' `is_torchvision_available()` still says False (find_spec and the package
metadata are untouched).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any


class _Stub(types.ModuleType):
    """Any attribute exists: capitalised names are empty classes, others sub-stubs."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value: Any = type(name, (), {}) if name[:1].isupper() else _Stub(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


def _from_a_processor_module() -> bool:
    """The import comes from transformers' models/*/image_processing_* or video_processing_* module."""
    frame = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename.replace("\\", "/")
        if "/transformers/models/" in filename and ("/image_processing_" in filename or "/video_processing_" in filename):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


class _TorchvisionStandIn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] != "torchvision" or not _from_a_processor_module():
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _Stub(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


if not any(isinstance(finder, _TorchvisionStandIn) for finder in sys.meta_path):
    sys.meta_path.append(_TorchvisionStandIn())  # last: a real torchvision, where installed, wins
