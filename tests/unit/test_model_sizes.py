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

from recipe.model_sizes import QWEN3_5_35B_A3B_CONFIG, SizesInvalid, SizesUnknown, sizes_from_config
from recipe.models import QWEN3_5_35B_A3B, architecture_from_config, load_architecture
from recipe.smoke import shipped_model_dir

torch = pytest.importorskip("torch", reason="the counts are checked against models transformers builds (torch)")
modeling = pytest.importorskip(
    "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe", reason="transformers with Qwen3.5-MoE (the trainer extra)"
)
configuration = pytest.importorskip("transformers.models.qwen3_5_moe.configuration_qwen3_5_moe")


def _transformers_count(config: dict[str, Any]) -> tuple[int, int]:
    """(all parameters, the vision tower's) of the model transformers builds from `config` (a text-only one when
    config.json is not nested)."""
    with torch.device("meta"):
        if "text_config" in config:
            model = modeling.Qwen3_5MoeForConditionalGeneration(configuration.Qwen3_5MoeConfig(**config))
        else:
            model = modeling.Qwen3_5MoeForCausalLM(configuration.Qwen3_5MoeTextConfig(**config))
    named = list(model.named_parameters())
    return sum(p.numel() for _, p in named), sum(p.numel() for name, p in named if ".visual." in name)


def _transformers_active(config: dict[str, Any]) -> int:
    """The language model's parameters one token multiplies by in the model transformers builds: every one but the
    vision tower's and the input embedding (a lookup), the routed experts' at num_experts_per_tok of num_experts, and
    the output layer (the embedding again when tied)."""
    text = config.get("text_config", config)
    with torch.device("meta"):
        if "text_config" in config:
            model = modeling.Qwen3_5MoeForConditionalGeneration(configuration.Qwen3_5MoeConfig(**config))
        else:
            model = modeling.Qwen3_5MoeForCausalLM(configuration.Qwen3_5MoeTextConfig(**config))
    active, share = 0.0, text["num_experts_per_tok"] / text["num_experts"]
    for name, parameter in model.named_parameters():  # a tied lm_head is the embedding's object, listed once
        if ".visual." in name:
            continue
        if name.endswith("embed_tokens.weight"):
            active += parameter.numel() if model.get_output_embeddings().weight is parameter else 0
        else:
            active += parameter.numel() * (share if ".mlp.experts." in name else 1)
    return round(active)


def test_the_built_in_profile_has_qwen3_5_35b_a3b_s_35_1_billion_parameters() -> None:
    sizes = sizes_from_config(QWEN3_5_35B_A3B_CONFIG)
    assert (sizes.total, sizes.vision) == _transformers_count(QWEN3_5_35B_A3B_CONFIG)
    # "A3B": the weights one token's forward multiplies by (the run report's MFU counts 2 FLOPs each).
    assert sizes.active_per_token == _transformers_active(QWEN3_5_35B_A3B_CONFIG) == 2_946_429_568
    assert sizes.total == 35_107_181_936
    assert (sizes.hidden_size, sizes.vocab_size, sizes.num_layers, sizes.moe_ffn_hidden_size, sizes.num_kv_heads) == (
        2048, 248320, 40, 512, 2
    )
    # 10 full-attention layers x K and V x 2 KV heads x 256 x bf16; 30 DeltaNet layers of 32 x 128 x 128 fp32 state.
    assert sizes.kv_bytes_per_token == 10 * 2 * 2 * 256 * 2
    assert sizes.state_bytes_per_sequence == 30 * ((2 * 2048 + 4096) * 3 * 2 + 32 * 128 * 128 * 4)


def test_the_built_in_profile_is_the_layout_s_built_in_architecture() -> None:
    assert architecture_from_config(QWEN3_5_35B_A3B_CONFIG, QWEN3_5_35B_A3B.name) == QWEN3_5_35B_A3B


def test_the_smoke_model_s_counts() -> None:
    config = json.loads((shipped_model_dir() / "config.json").read_text())
    sizes = sizes_from_config(config)
    assert (sizes.total, sizes.vision) == _transformers_count(config)
    assert sizes.active_per_token == _transformers_active(config)
    assert load_architecture(shipped_model_dir()).sizes == sizes


_heads = st.sampled_from([1, 2, 4])


@st.composite
def qwen3_5_configs(draw: st.DrawFn) -> dict[str, Any]:
    """Small Qwen3.5-MoE configs: layer mixes, gates, ties, expert and vision sizes (transformers always builds a vision tower)."""
    layers = draw(st.integers(1, 5))
    kinds = draw(st.lists(st.sampled_from(["full_attention", "linear_attention"]), min_size=layers, max_size=layers))
    kinds[draw(st.integers(0, layers - 1))] = "full_attention"  # at least one: a model without is refused (no KV cache)
    kv = draw(_heads)
    # Layer kinds listed, or every interval-th layer full (transformers derives the list the same way).
    pattern = draw(st.one_of(st.just({"layer_types": kinds}),
                             st.integers(1, layers).map(lambda i: {"full_attention_interval": i})))
    text = {
        "hidden_size": draw(st.sampled_from([16, 32, 48])),
        "vocab_size": draw(st.integers(8, 64)),
        "num_hidden_layers": layers,
        **pattern,
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
        "shared_expert_intermediate_size": draw(st.sampled_from([0, 8, 16])),
    }
    if draw(st.booleans()):  # a text-only config.json: the text model's keys at the top, no vision tower
        return {**text, "tie_word_embeddings": draw(st.booleans())}
    # Where the tie is written: the top level, or (ignored by transformers) only the text model's.
    tie = draw(st.booleans())
    config: dict[str, Any] = {"tie_word_embeddings": tie, "text_config": text} if draw(st.booleans()) else {
        "text_config": {**text, "tie_word_embeddings": tie}}
    config["vision_config"] = {
        "depth": draw(st.integers(1, 2)), "hidden_size": 16, "intermediate_size": draw(st.sampled_from([8, 24])),
        "num_heads": 2, "in_channels": 3, "patch_size": 2, "temporal_patch_size": draw(st.sampled_from([1, 2])),
        "spatial_merge_size": draw(st.integers(1, 3)), "out_hidden_size": text["hidden_size"], "num_position_embeddings": 16,
    }  # fmt: skip
    return config


@settings(max_examples=40, deadline=None)
@given(qwen3_5_configs())
def test_every_generated_config_counts_as_transformers_builds_it(config: dict[str, Any]) -> None:
    sizes = sizes_from_config(config)
    assert (sizes.total, sizes.vision) == _transformers_count(config)


_KEYS = ["hidden_size", "vocab_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
         "linear_num_value_heads", "moe_intermediate_size", "linear_conv_kernel_dim"]  # fmt: skip
_NOT_A_COUNT = st.one_of(
    st.just("x" * 60),  # shown cut to its first 40 characters
    st.booleans(), st.floats(allow_nan=True), st.integers(max_value=-1), st.text(max_size=5), st.lists(st.integers(), max_size=2),
    # Past MAX_COUNT: no model has it, and the estimate's floats would overflow (2**1030).
    st.integers(min_value=2**31), st.just(2**1030),
)


@settings(max_examples=60, deadline=None)
@given(key=st.sampled_from(_KEYS), value=_NOT_A_COUNT)
def test_a_count_that_is_not_a_whole_number_is_named(key: str, value: Any) -> None:
    """The key and the value as config.json has it (a long one cut, a list or object by its type)."""
    config = json.loads(json.dumps(QWEN3_5_35B_A3B_CONFIG))
    config["text_config"][key] = value
    with pytest.raises(SizesInvalid) as caught:
        sizes_from_config(config)
    shown = json.dumps(value)[:40] if isinstance(value, (int, float, str)) else type(value).__name__
    assert str(caught.value) == (
        f"config.json {key}={shown}: must be a whole number from 1 to 2147483647 (0 would leave the memory "
        "estimate's term for it empty)"
    )


@settings(max_examples=20, deadline=None)
@given(key=st.sampled_from(_KEYS), value=_NOT_A_COUNT)
def test_plan_refuses_a_count_no_model_has_in_one_line(tmp_path_factory: pytest.TempPathFactory, key: str, value: Any) -> None:
    """Bad input, not an unknown model: exit 2 naming MODEL_PATH and the key, never a skipped estimate or a traceback."""
    from recipe.errors import RecipeConfigError
    from recipe.models import load_architecture

    folder = tmp_path_factory.mktemp("model")
    config = json.loads(json.dumps(QWEN3_5_35B_A3B_CONFIG))
    config["text_config"][key] = value
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(RecipeConfigError) as caught:
        load_architecture(folder)
    assert len(caught.value.problems) >= 1 and all(f"MODEL_PATH={str(folder)!r}" in p for p in caught.value.problems)


@pytest.mark.parametrize("section", ["text_config", "vision_config"])
@pytest.mark.parametrize("value", [[], "x", 3])
def test_a_section_that_is_not_an_object_is_named(section: str, value: Any) -> None:
    config = json.loads(json.dumps(QWEN3_5_35B_A3B_CONFIG))
    config[section] = value
    with pytest.raises(SizesUnknown) as caught:
        sizes_from_config(config)
    assert str(caught.value) == f"config.json {section} must be a JSON object"


def test_every_layer_is_full_attention_with_an_interval_of_1_and_0_is_refused() -> None:
    config = json.loads(json.dumps(QWEN3_5_35B_A3B_CONFIG))
    config["text_config"]["full_attention_interval"] = 1
    assert sizes_from_config(config).state_bytes_per_sequence == 0
    config["text_config"]["full_attention_interval"] = 0
    with pytest.raises(SizesInvalid) as caught:
        sizes_from_config(config)
    assert str(caught.value).startswith("config.json full_attention_interval=0: must be a whole number from 1 to ")
    config["text_config"]["full_attention_interval"] = 41  # past the 40 layers: none is full attention, no KV cache
    with pytest.raises(SizesInvalid, match="no full_attention layer among the 40"):
        sizes_from_config(config)


@pytest.mark.parametrize("key", ["head_dim", "hidden_size", "vocab_size", "linear_key_head_dim", "num_experts_per_tok",
                                 "linear_conv_kernel_dim", "moe_intermediate_size"])  # fmt: skip
@pytest.mark.parametrize("section", ["text_config", "vision_config"])
def test_a_zero_that_would_empty_a_term_of_the_estimate_is_refused_by_name(key: str, section: str) -> None:
    """Well-typed but degenerate (issue 40): a size of 0 passes a type check and would make a term 0; named instead."""
    config = json.loads(json.dumps(QWEN3_5_35B_A3B_CONFIG))
    if key not in config[section]:
        key = {"head_dim": "patch_size", "vocab_size": "spatial_merge_size"}.get(key, "depth")
    config[section][key] = 0
    with pytest.raises(SizesInvalid, match=f"config.json {key}=0: must be a whole number from 1 "):
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


_COUNTED = sorted(
    [("text_config", key) for key in QWEN3_5_35B_A3B_CONFIG["text_config"] if key not in ("attn_output_gate", "mamba_ssm_dtype")]
    + [("vision_config", key) for key in QWEN3_5_35B_A3B_CONFIG["vision_config"]]
)


@pytest.mark.parametrize(("section", "key"), _COUNTED)
def test_a_count_left_out_is_named_not_guessed(section: str, key: str) -> None:
    """transformers fills a missing key with its class default (head_dim 256, 16 linear key heads, ...), which is no
    guess the estimate can make for another model: the estimate is skipped, naming what config.json lacks."""
    config = json.loads(json.dumps(QWEN3_5_35B_A3B_CONFIG))
    del config[section][key]
    with pytest.raises(SizesUnknown, match=key if key != "full_attention_interval" else "layer_types"):
        sizes_from_config(config)


def test_deltanet_keys_without_a_layer_pattern_are_named() -> None:
    config = json.loads(json.dumps(QWEN3_5_35B_A3B_CONFIG))
    del config["text_config"]["full_attention_interval"]
    with pytest.raises(SizesUnknown) as caught:
        sizes_from_config(config)
    assert str(caught.value) == "config.json has Gated DeltaNet keys but neither layer_types nor full_attention_interval"


def test_the_recurrent_state_takes_mamba_ssm_dtype() -> None:
    """float32 in Qwen3.5's config (and when absent); a bf16 state is half the recurrent part."""
    config = json.loads(json.dumps(QWEN3_5_35B_A3B_CONFIG))
    fp32 = sizes_from_config(config).state_bytes_per_sequence
    config["text_config"]["mamba_ssm_dtype"] = "bfloat16"
    assert sizes_from_config(config).state_bytes_per_sequence == fp32 - 30 * 32 * 128 * 128 * 2
    del config["text_config"]["mamba_ssm_dtype"]
    assert sizes_from_config(config).state_bytes_per_sequence == fp32


def test_a_model_without_gated_deltanet_is_all_full_attention() -> None:
    config = json.loads(json.dumps(QWEN3_5_35B_A3B_CONFIG))
    for key in ("full_attention_interval", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                "linear_value_head_dim", "linear_conv_kernel_dim"):  # fmt: skip
        del config["text_config"][key]
    sizes = sizes_from_config(config)
    assert sizes.state_bytes_per_sequence == 0 and sizes.kv_bytes_per_token == 40 * 2 * 2 * 256 * 2
