"""The shipped tiny config is a Qwen3.5-MoE like Qwen3.5-35B-A3B, only smaller, and builds and runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recipe.layout import ParallelLayout, layout_problems
from recipe.models import QWEN3_5_35B_A3B, architecture_from_config
from recipe.settings import Settings
from recipe.smoke import SMOKE_LAYOUT, shipped_model_dir
from recipe.smoke.tokenizer import token_id

from ..envtools import clear_settings

CONFIG = json.loads((shipped_model_dir() / "config.json").read_text(encoding="utf-8"))
TEXT, VISION = CONFIG["text_config"], CONFIG["vision_config"]


def test_it_is_the_real_models_class_and_type() -> None:
    # Megatron-Bridge (Qwen35VLMoEBridge) and vLLM choose their implementation by these names.
    assert CONFIG["architectures"] == ["Qwen3_5MoeForConditionalGeneration"]
    assert (CONFIG["model_type"], TEXT["model_type"]) == ("qwen3_5_moe", "qwen3_5_moe_text")


def test_it_mixes_gated_deltanet_and_full_attention_like_the_real_model() -> None:
    kinds = TEXT["layer_types"]
    assert len(kinds) == TEXT["num_hidden_layers"]
    # Qwen3.5-35B-A3B: every 4th layer is full attention, the others Gated DeltaNet.
    assert kinds == ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(len(kinds))]
    assert {"full_attention", "linear_attention"} <= set(kinds)


def test_per_head_shapes_are_the_real_models() -> None:
    """Only counts shrink: attention, DeltaNet and rotary kernels see Qwen3.5-35B-A3B's head shapes."""
    assert TEXT["head_dim"] == 256 and TEXT["linear_key_head_dim"] == 128 and TEXT["linear_value_head_dim"] == 128
    assert TEXT["linear_conv_kernel_dim"] == 4
    rope = TEXT["rope_parameters"]
    assert rope["partial_rotary_factor"] == 0.25
    # mRoPE sections must fill half the rotary dimension (256 x 0.25 / 2 = 32).
    assert sum(rope["mrope_section"]) == TEXT["head_dim"] * rope["partial_rotary_factor"] // 2
    assert VISION["hidden_size"] // VISION["num_heads"] == 1152 // 16  # the real vision head size, 72
    assert VISION["out_hidden_size"] == TEXT["hidden_size"]


def test_it_is_a_moe_with_routed_and_shared_experts() -> None:
    assert TEXT["num_experts"] > TEXT["num_experts_per_tok"] > 1
    assert TEXT["shared_expert_intermediate_size"] > 0


def test_the_special_token_ids_are_the_tokenizers() -> None:
    assert CONFIG["image_token_id"] == token_id("<|image_pad|>")
    assert CONFIG["video_token_id"] == token_id("<|video_pad|>")
    assert CONFIG["vision_start_token_id"] == token_id("<|vision_start|>")
    assert CONFIG["vision_end_token_id"] == token_id("<|vision_end|>")
    assert TEXT["eos_token_id"] == token_id("<|im_end|>") and TEXT["pad_token_id"] == token_id("<|endoftext|>")
    generation = json.loads((shipped_model_dir() / "generation_config.json").read_text(encoding="utf-8"))
    assert generation["eos_token_id"] == [token_id("<|im_end|>"), token_id("<|endoftext|>")]


def test_the_processor_files_agree_with_the_vision_tower() -> None:
    for name in ("preprocessor_config.json", "video_preprocessor_config.json"):
        processor = json.loads((shipped_model_dir() / name).read_text(encoding="utf-8"))
        assert processor["patch_size"] == VISION["patch_size"], name
        assert processor["merge_size"] == VISION["spatial_merge_size"], name
        assert processor["temporal_patch_size"] == VISION["temporal_patch_size"], name


def _layout(**sizes: int) -> ParallelLayout:
    values = {name.lower(): value for name, value in SMOKE_LAYOUT.items()} | sizes
    return ParallelLayout(nnodes=1, **values)


def test_the_smoke_layout_respects_the_recipes_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_settings(monkeypatch)
    architecture = architecture_from_config(CONFIG, "smoke")
    settings = Settings(train_batch_size=4, rollout_n=4)
    assert layout_problems(_layout(), architecture, settings, dynamic_batching=False) == []
    # The rules do bite on this model: 8 experts cannot be split 3 ways.
    assert "EP=3: must divide the model's 8 experts" in layout_problems(
        _layout(ep=3, ndevices_per_node=3), architecture, settings, dynamic_batching=False
    )


def test_the_recipe_reads_the_same_architecture_numbers() -> None:
    architecture = architecture_from_config(CONFIG, "smoke")
    assert architecture.num_layers == 4 and architecture.num_experts == 8
    assert (architecture.linear_key_heads, architecture.linear_value_heads) == (2, 4)
    # Same ratios as the real model where the kernels care: GQA groups, DeltaNet value/key heads.
    assert architecture.linear_value_heads // architecture.linear_key_heads == (
        QWEN3_5_35B_A3B.linear_value_heads // QWEN3_5_35B_A3B.linear_key_heads
    )


def test_the_shipped_files_are_valid_json() -> None:
    for path in Path(shipped_model_dir()).glob("*.json"):
        assert isinstance(json.loads(path.read_text(encoding="utf-8")), dict), path
