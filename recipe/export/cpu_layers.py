"""Qwen3.5's Megatron model built from local (non-Transformer Engine) layers, for a CPU-only machine.

megatron-core 0.19.2 builds Qwen3.5's hybrid block (Gated DeltaNet + gated attention) and
Megatron-Bridge 0.6.2 its vision tower from Transformer Engine modules only:
- `experimental_attention_variant_module_specs._get_backend_spec_provider` always answers
  TESpecProvider (NameError `TESpecProvider` without TE), and its gated-attention spec comes
  from `get_gpt_layer_with_transformer_engine_spec`;
- `modelling_qwen3_vl/model.py` builds the vision layers from `get_vit_layer_with_transformer_engine_spec`,
  TENorm and TE's parallel linears;
- `ssm/gated_delta_net/common.py:141` refuses to build without fla (`FLA is not installed`), and
  lines 230-249 (like `modelling_qwen3_vl/rope.py:134`) place tensors on `torch.cuda.current_device()`.

The replacements keep Transformer Engine's parameter names (`linear_qkv.layer_norm_weight`, ...),
so Megatron-Bridge's Qwen3.5 mappings and verl's checkpoints are unchanged. `export` only needs
the module structure and the parameter names: `cpu_build()` puts DeltaNet kernels there that
refuse to run. The CPU e2e (tests/e2e/cpu) installs the same layers with torch kernels.
"""

from __future__ import annotations

import importlib
import types
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from functools import cache, partial
from typing import Any, NamedTuple

#: Where each replacement goes: megatron-core's hybrid-block specs, Megatron-Bridge's Qwen3-VL model.
SPECS_MODULE = "megatron.core.models.gpt.experimental_attention_variant_module_specs"
VISION_MODULE = "megatron.bridge.models.qwen_vl.modelling_qwen3_vl.model"
DELTANET_MODULES = ("megatron.core.ssm.gated_delta_net.common", "megatron.core.ssm.gated_delta_net.gdn")


class DeltaNetKernels(NamedTuple):
    """The three fla functions megatron-core's Gated DeltaNet calls (fla's signatures)."""

    l2norm: Callable[..., Any]
    causal_conv1d: Callable[..., Any]
    chunk_gated_delta_rule: Callable[..., Any]


def _norm(x: Any, weight: Any, bias: Any, eps: float, rms: bool, zero_centered: bool) -> Any:
    """RMSNorm or LayerNorm as Transformer Engine computes them (zero-centred gamma: weight + 1)."""
    import torch  # lazy: torch is heavy or absent where this module is imported; loaded only here
    import torch.nn.functional as F  # lazy: torch is heavy or absent where this module is imported; loaded only here

    gamma = weight + 1 if zero_centered else weight
    if rms:
        as_float = x.float()
        normed = as_float * torch.rsqrt(as_float.pow(2).mean(-1, keepdim=True) + eps)
        return (normed * gamma.float()).to(x.dtype)
    return F.layer_norm(x, (x.shape[-1],), gamma, bias, eps)


def _norm_parameters(module: Any, config: Any, size: int, eps: float) -> tuple[Any, Any]:
    """(gamma, beta) of a norm as Transformer Engine makes them: gamma zeros when zero-centred, no beta for
    RMSNorm; records the norm's kind on `module`."""
    import torch  # lazy: torch is heavy or absent where this module is imported; loaded only here

    module.norm_eps = eps
    module.norm_rms = config.normalization == "RMSNorm"
    module.norm_zero_centered = bool(config.layernorm_zero_centered_gamma)
    init = torch.zeros if module.norm_zero_centered else torch.ones
    gamma = torch.nn.Parameter(init(size, dtype=config.params_dtype))
    beta = None if module.norm_rms else torch.nn.Parameter(torch.zeros(size, dtype=config.params_dtype))
    return gamma, beta


@cache
def norm_class() -> type:
    """TENorm's stand-in: `weight` (and `bias` for LayerNorm), zero-centred gamma as the config says."""
    import torch  # lazy: torch is heavy or absent where this module is imported; loaded only here

    class LocalNorm(torch.nn.Module):
        def __init__(self, config: Any, hidden_size: int, eps: float = 1e-5, **_unused: Any) -> None:
            super().__init__()
            self.config = config
            self.weight, self.bias = _norm_parameters(self, config, hidden_size, eps)
            if config.sequence_parallel:
                self.weight.sequence_parallel = True

        def forward(self, x: Any) -> Any:
            return _norm(x, self.weight, self.bias, self.norm_eps, self.norm_rms, self.norm_zero_centered)

    return LocalNorm


@cache
def norm_linear_class() -> type:
    """TELayerNormColumnParallelLinear's stand-in: a norm, then megatron-core's ColumnParallelLinear."""
    # lazy: megatron is heavy or absent where this module is imported; loaded only here
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear

    # lazy: megatron is heavy or absent where this module is imported; loaded only here
    from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

    class LocalNormColumnParallelLinear(ColumnParallelLinear):  # type: ignore[misc]
        def __init__(self, input_size: int, output_size: int, *, config: Any, **kwargs: Any) -> None:
            known = ("init_method", "gather_output", "bias", "skip_bias_add", "is_expert",
                     "skip_weight_param_allocation", "tp_comm_buffer_name", "tp_group", "name")  # fmt: skip
            super().__init__(input_size, output_size, config=config, **{k: v for k, v in kwargs.items() if k in known})
            # TE's names for the fused norm's parameters, which Megatron-Bridge's mappings use.
            self.layer_norm_weight, self.layer_norm_bias = _norm_parameters(
                self, config, input_size, config.layernorm_epsilon
            )

        def forward(self, input_: Any, weight: Any = None, runtime_gather_output: Any = None) -> Any:
            normed = _norm(input_, self.layer_norm_weight, self.layer_norm_bias, self.norm_eps, self.norm_rms,
                           self.norm_zero_centered)  # fmt: skip
            return super().forward(normed, weight=weight, runtime_gather_output=runtime_gather_output)

        def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: Any = None) -> Any:
            # The norm's parameters are replicated across tensor-parallel ranks, as in TE's module.
            state = self.state_dict(prefix="", keep_vars=True)
            return make_sharded_tensors_for_checkpoint(state, prefix, {"weight": 0, "bias": 0}, sharded_offsets)

    return LocalNormColumnParallelLinear


def spec_provider() -> Any:
    """megatron-core's LocalSpecProvider with the norm fused into the next linear, as TE's provider does."""
    # lazy: megatron is heavy or absent where this module is imported; loaded only here
    from megatron.core.models.backends import LocalSpecProvider

    class CpuSpecProvider(LocalSpecProvider):  # type: ignore[misc]
        def fuse_layernorm_and_linear(self) -> bool:
            return True

        def column_parallel_layer_norm_linear(self) -> type:
            return norm_linear_class()

        def layer_norm(self, rms_norm: bool = False, for_qk: bool = False, has_residual: bool = False) -> type:
            return norm_class()

    return CpuSpecProvider()


def attention_spec(config: Any, backend: Any = None) -> Any:
    """The hybrid block's (gated) full-attention spec from local modules, input norm fused as with TE."""
    # lazy: megatron is heavy or absent where this module is imported; loaded only here
    from megatron.core.tensor_parallel.layers import RowParallelLinear

    # lazy: megatron is heavy or absent where this module is imported; loaded only here
    from megatron.core.transformer.attention import (
        SelfAttention,
        SelfAttentionSubmodules,
    )

    # lazy: megatron is heavy or absent where this module is imported; loaded only here
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    # lazy: megatron is heavy or absent where this module is imported; loaded only here
    from megatron.core.transformer.enums import AttnMaskType

    # lazy: megatron is heavy or absent where this module is imported; loaded only here
    from megatron.core.transformer.spec_utils import ModuleSpec

    qk_norm = norm_class() if config.qk_layernorm else None
    return ModuleSpec(
        module=SelfAttention,
        params={"attn_mask_type": AttnMaskType.causal},
        submodules=SelfAttentionSubmodules(
            linear_qkv=norm_linear_class(),
            core_attention=DotProductAttention,
            linear_proj=RowParallelLinear,
            q_layernorm=qk_norm,
            k_layernorm=qk_norm,
        ),
        metainfo={"fuse_input_layernorm": True},
    )


def vision_layer_spec() -> Any:
    """The vision tower's layer from local modules: non-causal attention, norms fused into the linears."""
    # lazy: megatron is heavy or absent where this module is imported; loaded only here
    from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add

    # lazy: megatron is heavy or absent where this module is imported; loaded only here
    from megatron.core.tensor_parallel.layers import RowParallelLinear

    # lazy: megatron is heavy or absent where this module is imported; loaded only here
    from megatron.core.transformer.attention import (
        SelfAttention,
        SelfAttentionSubmodules,
    )

    # lazy: megatron is heavy or absent where this module is imported; loaded only here
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    # lazy: megatron is heavy or absent where this module is imported; loaded only here
    from megatron.core.transformer.enums import AttnMaskType

    # lazy: megatron is heavy or absent where this module is imported; loaded only here
    from megatron.core.transformer.identity_op import IdentityOp

    # lazy: megatron is heavy or absent where this module is imported; loaded only here
    from megatron.core.transformer.mlp import MLP, MLPSubmodules

    # lazy: megatron is heavy or absent where this module is imported; loaded only here
    from megatron.core.transformer.spec_utils import ModuleSpec

    # lazy: megatron is heavy or absent where this module is imported; loaded only here
    from megatron.core.transformer.transformer_layer import (
        TransformerLayer,
        TransformerLayerSubmodules,
    )

    attention = SelfAttentionSubmodules(
        linear_qkv=norm_linear_class(), core_attention=DotProductAttention, linear_proj=RowParallelLinear
    )
    mlp = MLPSubmodules(linear_fc1=norm_linear_class(), linear_fc2=RowParallelLinear)
    return ModuleSpec(
        module=TransformerLayer,
        submodules=TransformerLayerSubmodules(
            self_attention=ModuleSpec(
                module=SelfAttention, params={"attn_mask_type": AttnMaskType.no_mask}, submodules=attention
            ),
            self_attn_bda=get_bias_dropout_add,
            pre_mlp_layernorm=IdentityOp,
            mlp=partial(MLP.as_mlp_submodule, submodules=mlp),
            mlp_bda=get_bias_dropout_add,
        ),
    )


def layer_replacements(kernels: DeltaNetKernels) -> dict[str, dict[str, Any]]:
    """Module name -> {attribute: its CPU replacement}, for every module that builds Qwen3.5 from TE."""
    # lazy: megatron is heavy or absent where this module is imported; loaded only here
    from megatron.core.tensor_parallel.layers import (
        ColumnParallelLinear,
        RowParallelLinear,
    )

    deltanet = {"HAVE_FLA": True, **kernels._asdict()}
    return {
        SPECS_MODULE: {
            "_get_backend_spec_provider": lambda config: spec_provider(),
            "_get_self_attention_module_spec": attention_spec,
        },
        VISION_MODULE: {
            "get_vit_layer_with_transformer_engine_spec": vision_layer_spec,
            "TENorm": norm_class(),
            "TEColumnParallelLinear": ColumnParallelLinear,
            "TERowParallelLinear": RowParallelLinear,
        },
        # gdn.py imports causal_conv1d and chunk_gated_delta_rule by name; it has no HAVE_FLA/l2norm.
        DELTANET_MODULES[0]: deltanet,
        DELTANET_MODULES[1]: {k: v for k, v in deltanet.items() if hasattr(kernels, k) and k != "l2norm"},
    }


def _no_forward(name: str) -> Callable[..., Any]:
    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError(f"{name}: the CPU export builds Qwen3.5 to load and write weights, never to run it")

    return refuse


#: What `export` puts where fla's kernels would be: the model is built, never run.
EXPORT_KERNELS = DeltaNetKernels(*(_no_forward(name) for name in DeltaNetKernels._fields))


@contextmanager
def replaced(replacements: Mapping[str, Mapping[str, Any]]) -> Iterator[None]:
    """Set the attributes (importing their modules), then put the originals back."""
    saved: list[tuple[types.ModuleType, str, Any]] = []
    try:
        for module_name, attributes in replacements.items():
            module = importlib.import_module(module_name)
            for attribute, value in attributes.items():
                saved.append((module, attribute, getattr(module, attribute)))
                setattr(module, attribute, value)
        yield
    finally:
        for module, attribute, value in reversed(saved):
            setattr(module, attribute, value)


@contextmanager
def cpu_build() -> Iterator[None]:
    """While building a Megatron-Bridge model on a CPU-only machine: local layers for Qwen3.5.

    Also answers `torch.cuda.current_device()` with "cpu", where GDN's and mRoPE's constructors
    place tensors. Models without DeltaNet or vision tower (Qwen3, Qwen3-MoE) build as before.
    """
    import torch  # lazy: torch is heavy or absent where this module is imported; loaded only here

    original = torch.cuda.current_device
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    try:
        with replaced(layer_replacements(EXPORT_KERNELS)):
            yield
    finally:
        torch.cuda.current_device = original  # type: ignore[assignment]
