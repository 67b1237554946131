"""recipe.export.cpu_layers' layer specs by direct calls: which local module stands where Transformer Engine's would.

megatron-core builds Qwen3.5's hybrid block, and Megatron-Bridge its vision tower, from what these specs name;
test_qwen35_export.py builds and exports the whole model with them (minutes under mutmut, so not in its selection).
Here each spec is read without building anything.
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace
from typing import Any

import pytest

from tests.support.needs import MEGATRON_BRIDGE, TRAINER_EXTRA, needs
from tests.support.torch_threads import single_threaded_torch  # noqa: F401  (mutmut forks)

torch = needs("torch", install=TRAINER_EXTRA)
needs("megatron.bridge", install=MEGATRON_BRIDGE)

from megatron.core.models.backends import LocalSpecProvider  # noqa: E402
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear  # noqa: E402
from megatron.core.transformer.attention import SelfAttention  # noqa: E402
from megatron.core.transformer.dot_product_attention import DotProductAttention  # noqa: E402
from megatron.core.transformer.enums import AttnMaskType  # noqa: E402
from megatron.core.transformer.identity_op import IdentityOp  # noqa: E402
from megatron.core.transformer.transformer_layer import TransformerLayer  # noqa: E402

from recipe.export.cpu_layers import (  # noqa: E402
    DELTANET_MODULES,
    SPECS_MODULE,
    VISION_MODULE,
    DeltaNetKernels,
    _no_forward,
    attention_spec,
    layer_replacements,
    norm_class,
    norm_linear_class,
    replaced,
    spec_provider,
    vision_layer_spec,
)


def test_the_spec_provider_is_local_with_the_norm_fused_into_the_next_linear_as_with_te() -> None:
    provider = spec_provider()
    assert isinstance(provider, LocalSpecProvider)
    assert provider.fuse_layernorm_and_linear() is True
    assert provider.column_parallel_layer_norm_linear() is norm_linear_class()
    assert provider.layer_norm() is norm_class()
    assert provider.layer_norm(rms_norm=True, for_qk=True, has_residual=True) is norm_class()


@pytest.mark.parametrize("qk_layernorm", [True, False])
def test_the_attention_spec_is_causal_self_attention_with_its_input_norm_fused(qk_layernorm: bool) -> None:
    spec = attention_spec(SimpleNamespace(qk_layernorm=qk_layernorm))
    assert spec.module is SelfAttention
    assert spec.params == {"attn_mask_type": AttnMaskType.causal}
    assert spec.metainfo == {"fuse_input_layernorm": True}
    parts = spec.submodules
    assert (parts.linear_qkv, parts.core_attention, parts.linear_proj) == (norm_linear_class(), DotProductAttention,
                                                                          RowParallelLinear)  # fmt: skip
    norm = norm_class() if qk_layernorm else None
    assert (parts.q_layernorm, parts.k_layernorm) == (norm, norm)


def test_the_vision_layer_attends_without_a_mask_and_fuses_both_norms_into_the_linears() -> None:
    spec = vision_layer_spec()
    assert spec.module is TransformerLayer
    layer = spec.submodules
    attention = layer.self_attention
    assert attention.module is SelfAttention and attention.params == {"attn_mask_type": AttnMaskType.no_mask}
    parts = attention.submodules
    assert (parts.linear_qkv, parts.core_attention, parts.linear_proj) == (norm_linear_class(), DotProductAttention,
                                                                          RowParallelLinear)  # fmt: skip
    assert layer.pre_mlp_layernorm is IdentityOp  # the norm is in linear_fc1
    mlp = layer.mlp.keywords["submodules"]
    assert (mlp.linear_fc1, mlp.linear_fc2) == (norm_linear_class(), RowParallelLinear)
    assert layer.self_attn_bda is layer.mlp_bda and callable(layer.mlp_bda)


def kernels() -> DeltaNetKernels:
    return DeltaNetKernels(*(lambda *args, which=name: which for name in DeltaNetKernels._fields))


def test_the_replacements_go_where_te_and_fla_would_be() -> None:
    given = kernels()
    table = layer_replacements(given)
    assert list(table) == [SPECS_MODULE, VISION_MODULE, *DELTANET_MODULES]
    specs = table[SPECS_MODULE]
    assert set(specs) == {"_get_backend_spec_provider", "_get_self_attention_module_spec"}
    assert isinstance(specs["_get_backend_spec_provider"](SimpleNamespace()), LocalSpecProvider)
    assert specs["_get_backend_spec_provider"](SimpleNamespace()).fuse_layernorm_and_linear() is True
    assert specs["_get_self_attention_module_spec"] is attention_spec
    assert table[VISION_MODULE] == {
        "get_vit_layer_with_transformer_engine_spec": vision_layer_spec,
        "TENorm": norm_class(),
        "TEColumnParallelLinear": ColumnParallelLinear,
        "TERowParallelLinear": RowParallelLinear,
    }
    common, gdn = (table[name] for name in DELTANET_MODULES)
    assert common == {"HAVE_FLA": True, "l2norm": given.l2norm, "causal_conv1d": given.causal_conv1d,
                      "chunk_gated_delta_rule": given.chunk_gated_delta_rule}  # fmt: skip
    # gdn.py imports two of the kernels by name and has no HAVE_FLA or l2norm of its own.
    assert gdn == {"causal_conv1d": given.causal_conv1d, "chunk_gated_delta_rule": given.chunk_gated_delta_rule}


def test_every_replacement_names_an_attribute_megatron_has_and_is_put_back() -> None:
    table = layer_replacements(kernels())
    modules = {name: importlib.import_module(name) for name in table}
    before: dict[tuple[str, str], Any] = {(m, a): getattr(modules[m], a) for m, attrs in table.items() for a in attrs}
    with replaced(table):
        for module, attribute in before:
            assert getattr(modules[module], attribute) is table[module][attribute]
    assert all(getattr(modules[m], a) is value for (m, a), value in before.items())


@pytest.mark.parametrize("name", DeltaNetKernels._fields)
def test_a_kernel_the_export_builds_with_refuses_to_run_naming_itself(name: str) -> None:
    with pytest.raises(RuntimeError) as refused:
        _no_forward(name)(torch.zeros(1), scale=1.0)
    assert str(refused.value) == f"{name}: the CPU export builds Qwen3.5 to load and write weights, never to run it"
