"""The sizes' edges: the largest count accepted, a one-wide conv, a flat config's stray vision, `plan --json`'s form.

Plain arithmetic on config.json dicts (no transformers): test_model_sizes.py checks the counts against built models.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from recipe.model_sizes import MAX_COUNT, QWEN3_5_35B_A3B_CONFIG, sizes_from_config


def _config() -> dict[str, Any]:
    return json.loads(json.dumps(QWEN3_5_35B_A3B_CONFIG))


def test_a_count_of_exactly_max_count_is_accepted() -> None:
    config = _config()
    config["text_config"]["vocab_size"] = MAX_COUNT
    sizes = sizes_from_config(config)
    assert sizes.vocab_size == 2**31 - 1 and sizes.embedding == (2**31 - 1) * 2048


def test_a_conv_one_wide_keeps_no_conv_state() -> None:
    """vLLM keeps the last kernel - 1 inputs per channel: none for a kernel of 1, only the recurrent state."""
    config = _config()
    config["text_config"]["linear_conv_kernel_dim"] = 1
    assert sizes_from_config(config).state_bytes_per_sequence == 30 * 32 * 128 * 128 * 4


def test_a_flat_config_is_a_text_model_even_beside_a_vision_config() -> None:
    """Without `text_config` transformers builds the causal LM alone: a stray `vision_config` adds no tower."""
    config = _config()
    flat = {**config["text_config"], "tie_word_embeddings": False, "vision_config": config["vision_config"]}
    assert sizes_from_config(flat).vision == 0
    assert sizes_from_config(config).vision > 0


def test_plan_json_form_is_every_count_and_the_total() -> None:
    sizes = sizes_from_config(_config())
    assert sizes.to_dict() == {field.name: getattr(sizes, field.name) for field in dataclasses.fields(sizes)} | {
        "total": 35_107_181_936
    }
