"""The parameter counts the memory estimate starts from, checked against models that transformers builds.

Each count is compared with the parameters of Qwen3_5MoeForConditionalGeneration built by transformers from
the same config.json on the meta device (no memory, no weights): the built-in Qwen3.5-35B-A3B profile, the
smoke model, and generated configs of every shape the reader accepts.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recipe.model_sizes import QWEN3_5_35B_A3B_CONFIG, SizesUnknown, sizes_from_config
from recipe.models import QWEN3_5_35B_A3B, architecture_from_config, load_architecture
from recipe.smoke import shipped_model_dir

torch = pytest.importorskip("torch", reason="the counts are checked against models transformers builds (torch)")
modeling = pytest.importorskip(
    "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe", reason="transformers with Qwen3.5-MoE (the trainer extra)"
)
configuration = pytest.importorskip("transformers.models.qwen3_5_moe.configuration_qwen3_5_moe")


def _transformers_count(config: dict[str, Any]) -> tuple[int, int]:
    """(all parameters, the vision tower's) of the model transformers builds from `config`."""
    with torch.device("meta"):
        model = modeling.Qwen3_5MoeForConditionalGeneration(configuration.Qwen3_5MoeConfig(**config))
    named = list(model.named_parameters())
    return sum(p.numel() for _, p in named), sum(p.numel() for name, p in named if ".visual." in name)


def test_the_built_in_profile_has_qwen3_5_35b_a3b_s_35_1_billion_parameters() -> None:
    sizes = sizes_from_config(QWEN3_5_35B_A3B_CONFIG)
    assert (sizes.total, sizes.vision) == _transformers_count(QWEN3_5_35B_A3B_CONFIG)
    assert sizes.total == 35_107_181_936
    # 10 full-attention layers x K and V x 2 KV heads x 256 x bf16; 30 DeltaNet layers of 32 x 128 x 128 fp32 state.
    assert sizes.kv_bytes_per_token == 10 * 2 * 2 * 256 * 2
    assert sizes.state_bytes_per_sequence == 30 * ((2 * 2048 + 4096) * 3 * 2 + 32 * 128 * 128 * 4)


def test_the_built_in_profile_is_the_layout_s_built_in_architecture() -> None:
    assert architecture_from_config(QWEN3_5_35B_A3B_CONFIG, QWEN3_5_35B_A3B.name) == QWEN3_5_35B_A3B


def test_the_smoke_model_s_counts() -> None:
    config = json.loads((shipped_model_dir() / "config.json").read_text())
    sizes = sizes_from_config(config)
    assert (sizes.total, sizes.vision) == _transformers_count(config)
    assert load_architecture(shipped_model_dir()).sizes == sizes


_heads = st.sampled_from([1, 2, 4])


@st.composite
def qwen3_5_configs(draw: st.DrawFn) -> dict[str, Any]:
    """Small Qwen3.5-MoE configs: layer mixes, gates, ties, expert and vision sizes (transformers always builds a vision tower)."""
    layers = draw(st.integers(1, 5))
    kinds = draw(st.lists(st.sampled_from(["full_attention", "linear_attention"]), min_size=layers, max_size=layers))
    kv = draw(_heads)
    text = {
        "hidden_size": draw(st.sampled_from([16, 32, 48])),
        "vocab_size": draw(st.integers(8, 64)),
        "num_hidden_layers": layers,
        "layer_types": kinds,
        "num_attention_heads": kv * draw(st.sampled_from([1, 2])),
        "num_key_value_heads": kv,
        "head_dim": draw(st.sampled_from([8, 16])),
        "attn_output_gate": draw(st.booleans()),
        "linear_num_key_heads": (lk := draw(_heads)),
        "linear_num_value_heads": lk * draw(st.sampled_from([1, 2])),
        "linear_key_head_dim": draw(st.sampled_from([4, 8])),
        "linear_value_head_dim": draw(st.sampled_from([4, 8])),
        "linear_conv_kernel_dim": draw(st.integers(2, 4)),
        "num_experts": draw(st.integers(1, 4)),
        "num_experts_per_tok": 1,
        "moe_intermediate_size": draw(st.sampled_from([8, 16])),
        "shared_expert_intermediate_size": draw(st.sampled_from([8, 16])),
    }
    config: dict[str, Any] = {"tie_word_embeddings": draw(st.booleans()), "text_config": text}
    config["vision_config"] = {
        "depth": draw(st.integers(1, 2)), "hidden_size": 16, "intermediate_size": draw(st.sampled_from([8, 24])),
        "num_heads": 2, "patch_size": 2, "temporal_patch_size": draw(st.sampled_from([1, 2])),
        "spatial_merge_size": 2, "out_hidden_size": text["hidden_size"], "num_position_embeddings": 16,
    }  # fmt: skip
    return config


@settings(max_examples=25, deadline=None)
@given(qwen3_5_configs())
def test_every_generated_config_counts_as_transformers_builds_it(config: dict[str, Any]) -> None:
    sizes = sizes_from_config(config)
    assert (sizes.total, sizes.vision) == _transformers_count(config)


_KEYS = ["hidden_size", "vocab_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
         "linear_num_value_heads", "moe_intermediate_size", "linear_conv_kernel_dim"]  # fmt: skip
_NOT_A_COUNT = st.one_of(
    st.booleans(), st.floats(allow_nan=True), st.integers(max_value=-1), st.text(max_size=5), st.lists(st.integers(), max_size=2)
)


@settings(max_examples=60, deadline=None)
@given(key=st.sampled_from(_KEYS), value=_NOT_A_COUNT)
def test_a_count_that_is_not_a_whole_number_is_named(key: str, value: Any) -> None:
    config = json.loads(json.dumps(QWEN3_5_35B_A3B_CONFIG))
    config["text_config"][key] = value
    with pytest.raises(SizesUnknown, match=key):
        sizes_from_config(config)


@pytest.mark.parametrize(
    "change",
    [
        {"layer_types": ["full_attention"]},  # not one per layer
        {"layer_types": "full_attention"},
        {"layer_types": [None] * 40},
    ],
)
def test_layer_kinds_that_do_not_describe_every_layer_are_refused(change: dict[str, Any]) -> None:
    config = json.loads(json.dumps(QWEN3_5_35B_A3B_CONFIG))
    config["text_config"].update(change)
    with pytest.raises(SizesUnknown, match="layer_types"):
        sizes_from_config(config)
