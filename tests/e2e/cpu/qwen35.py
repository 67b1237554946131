"""Qwen3.5 (Gated DeltaNet, gated attention, vision tower) on megatron-core 0.19.2 without Transformer Engine or fla.

The layers are the product's (recipe.export.cpu_layers: local modules keeping TE's parameter
names); what only a forward pass needs comes from here: torch versions of the three fla
kernels megatron-core's Gated DeltaNet calls (ssm/gated_delta_net/common.py:43-46, gdn.py:21-22).
fla's kernels are Triton (CUDA) only.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from tests.e2e.cpu.hooks import after_import, log


def l2norm(x: torch.Tensor, dim: int = -1, eps: float = 1e-6, **_unused: Any) -> torch.Tensor:
    """fla.modules.l2norm.l2norm: x / sqrt(sum(x²) + eps) over `dim`."""
    return x * torch.rsqrt((x * x).sum(dim=dim, keepdim=True) + eps)


def _conv_one(sequence: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: Any) -> torch.Tensor:
    """Causal depthwise convolution of one [batch, seq, dim] block with a [dim, width] weight."""
    length = sequence.shape[1]
    out = F.conv1d(
        sequence.transpose(1, 2), weight.unsqueeze(1), bias, padding=weight.shape[-1] - 1, groups=weight.shape[0]
    )[..., :length]
    if activation in ("silu", "swish"):
        out = F.silu(out)
    return out.transpose(1, 2)


def _bounds(cu_seqlens: torch.Tensor) -> list[tuple[int, int]]:
    edges = [int(edge) for edge in cu_seqlens.tolist()]
    return list(zip(edges[:-1], edges[1:]))


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: Any = None,
    initial_state: Any = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    **_unused: Any,
) -> tuple[torch.Tensor, None]:
    """fla.modules.convolution.causal_conv1d for training (no carried state); packed sequences one by one."""
    if initial_state is not None or output_final_state:
        raise NotImplementedError("causal_conv1d on CPU: no carried convolution state (training only)")
    if cu_seqlens is None:
        return _conv_one(x, weight, bias, activation), None
    return torch.cat([_conv_one(x[:, a:b], weight, bias, activation) for a, b in _bounds(cu_seqlens)], dim=1), None


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: Any = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    **_unused: Any,
) -> tuple[torch.Tensor, Any]:
    """fla's chunk_gated_delta_rule through megatron-core's own torch_chunk_gated_delta_rule (common.py:801);
    packed (THD) sequences one at a time, each from a zero state."""
    from megatron.core.ssm.gated_delta_net.common import torch_chunk_gated_delta_rule

    if cu_seqlens is None:
        return torch_chunk_gated_delta_rule(
            q, k, v, g, beta, initial_state=initial_state, output_final_state=output_final_state,
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        )  # fmt: skip
    outputs = [
        torch_chunk_gated_delta_rule(
            q[:, a:b], k[:, a:b], v[:, a:b], g[:, a:b], beta[:, a:b], use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel
        )[0]
        for a, b in _bounds(cu_seqlens)
    ]
    return torch.cat(outputs, dim=1), None


def _install(module_name: str) -> None:
    def replace(module: Any) -> None:
        from recipe.export.cpu_layers import DeltaNetKernels, layer_replacements

        kernels = DeltaNetKernels(l2norm, causal_conv1d, chunk_gated_delta_rule)
        for attribute, value in layer_replacements(kernels)[module_name].items():
            setattr(module, attribute, value)
        log(f"{module_name}: CPU layers (recipe.export.cpu_layers) and torch DeltaNet kernels")

    after_import(module_name)(replace)


def install() -> None:
    """Hook every module recipe.export.cpu_layers replaces attributes of."""
    from recipe.export.cpu_layers import DELTANET_MODULES, SPECS_MODULE, VISION_MODULE

    for name in (SPECS_MODULE, VISION_MODULE, *DELTANET_MODULES):
        _install(name)


install()
