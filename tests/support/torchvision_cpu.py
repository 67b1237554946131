"""Lets PyPI's torchvision 0.28.0 import with the CPU build of torch 2.13.0 (test-side only; the images have theirs).

The smoke data carry images, and Qwen3-VL's processors (verl's dataset and agent loop, vLLM's
engine, the recipe's prompt-length count) need torchvision's transforms. The test venvs install
torchvision 0.28.0 (the only release for torch 2.13 that the package index serves here; the
`test` extra and .ci/install-e2e.sh) without other dependencies. Its wheel is a CUDA build: its `_C` extension cannot
load against the CPU torch, and then `torchvision/_meta_registrations.py` fails on import with
"operator torchvision::nms does not exist", because it registers fake kernels for operators that
`_C` would have defined. Defining those operators' schemas (no kernels) just before torchvision is
first imported lets its Python layer load: the image and video transforms the processors use are
plain torch. Nothing on this path calls the detection operators themselves (nms, roi_align, ...);
a call would fail with "no kernel registered", not compute something wrong.
"""

from __future__ import annotations

import importlib.abc
import sys
from typing import Any

#: The operators torchvision's `_C` defines (torchvision/csrc/ops/*.cpp, TORCH_LIBRARY_FRAGMENT), as schemas only.
_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "int sampling_ratio, bool aligned) -> Tensor",
    "_roi_align_backward(Tensor grad, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "SymInt batch_size, SymInt channels, SymInt height, SymInt width, int sampling_ratio, bool aligned) -> Tensor",
    "roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width) "
    "-> (Tensor, Tensor)",
    "_roi_pool_backward(Tensor grad, Tensor rois, Tensor argmax, float spatial_scale, SymInt pooled_height, "
    "SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, SymInt width) -> Tensor",
    "ps_roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "int sampling_ratio) -> (Tensor, Tensor)",
    "_ps_roi_align_backward(Tensor grad, Tensor rois, Tensor channel_mapping, float spatial_scale, "
    "SymInt pooled_height, SymInt pooled_width, int sampling_ratio, SymInt batch_size, SymInt channels, "
    "SymInt height, SymInt width) -> Tensor",
    "ps_roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width) "
    "-> (Tensor, Tensor)",
    "_ps_roi_pool_backward(Tensor grad, Tensor rois, Tensor channel_mapping, float spatial_scale, "
    "SymInt pooled_height, SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, "
    "SymInt width) -> Tensor",
    "deform_conv2d(Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, SymInt stride_h, "
    "SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, SymInt dilation_w, SymInt groups, "
    "SymInt offset_groups, bool use_mask) -> Tensor",
    "_deform_conv2d_backward(Tensor grad, Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, "
    "SymInt stride_h, SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, SymInt dilation_w, "
    "SymInt groups, SymInt offset_groups, bool use_mask) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
)
_LIBRARIES: list[Any] = []  # a torch.library.Library's definitions live as long as the object


def define_torchvision_schemas() -> None:
    """Define torchvision's operator schemas in torch's dispatcher, once per process."""
    import torch

    if _LIBRARIES:
        return
    library = torch.library.Library("torchvision", "DEF")
    for schema in _SCHEMAS:
        library.define(schema)
    _LIBRARIES.append(library)


class _SchemasBeforeTorchvision(importlib.abc.MetaPathFinder):
    """Runs define_torchvision_schemas when `torchvision` is first imported, then steps aside."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        if fullname == "torchvision":
            sys.meta_path.remove(self)
            define_torchvision_schemas()
        return None


def install() -> None:
    """Define the schemas just before `torchvision` is first imported in this process (idempotent)."""
    if "torchvision" in sys.modules or any(isinstance(f, _SchemasBeforeTorchvision) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _SchemasBeforeTorchvision())
