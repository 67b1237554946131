"""Megatron-Bridge takes the smoke model for what it is: Qwen3.5-MoE VL, every tensor mapped.

Runs where Megatron-Bridge is installed (the images; on CPU the export test environment of
docs/export.md). Building the Megatron model itself is not tried here: Megatron's Gated
DeltaNet layer spec needs Transformer Engine, which a CPU machine does not have.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
from typing import Any

import pytest

from recipe.smoke import SmokeAssets
from tests.support.needs import MEGATRON_BRIDGE, installed


pytestmark = pytest.mark.skipif(
    not installed("megatron.bridge"),
    reason=f"megatron.bridge is not installed (in the images; on CPU: {MEGATRON_BRIDGE})",
)


@pytest.fixture(scope="module")
def auto_bridge() -> Any:
    """Megatron-Bridge's AutoBridge, after the CPU import shims of tests/bridge where Python needs them."""
    import typing

    if not hasattr(typing, "override") or importlib.util.find_spec("transformer_engine") is None:
        importlib.import_module("tests.support.megatron_py311").install_shims()
    from megatron.bridge import AutoBridge

    return AutoBridge


def test_the_bridge_picks_the_qwen3_5_vl_moe_bridge(built: SmokeAssets, auto_bridge: Any) -> None:
    import torch
    from transformers import AutoConfig

    assert auto_bridge.supports(AutoConfig.from_pretrained(built.model_path))
    bridge = auto_bridge.from_hf_pretrained(str(built.model_path), dtype=torch.bfloat16)
    provider = bridge.to_megatron_provider(load_weights=False)
    assert type(provider).__name__ == "Qwen35VLMoEModelProvider"
    text = json.loads((built.model_path / "config.json").read_text())["text_config"]
    assert provider.num_layers == text["num_hidden_layers"] and provider.num_moe_experts == text["num_experts"]
    assert provider.experimental_attention_variant == "gated_delta_net"
    # Megatron's per-layer pattern: 1 = Gated DeltaNet, 0 = full attention.
    assert list(provider.linear_attention_freq) == [int(k == "linear_attention") for k in text["layer_types"]]
    assert list(provider.mrope_section) == text["rope_parameters"]["mrope_section"]
    assert not provider.mtp_num_layers  # no MTP tensors in the smoke checkpoint, none expected


def test_every_tensor_of_the_checkpoint_has_a_mapping(built: SmokeAssets, auto_bridge: Any) -> None:
    """What the export writes back: a tensor without a mapping would be dropped by strict=False."""
    import torch
    from safetensors import safe_open

    bridge = auto_bridge.from_hf_pretrained(str(built.model_path), dtype=torch.bfloat16)
    registry = bridge._model_bridge.mapping_registry()
    with safe_open(built.model_path / "model.safetensors", "pt") as weights:
        names = list(weights.keys())
    assert [n for n in names if registry.hf_to_megatron_lookup(n) is None] == []
    assert registry.hf_to_megatron_lookup("model.language_model.layers.0.not_a_tensor.weight") is None
