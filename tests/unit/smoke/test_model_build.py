"""The shipped tiny config builds with transformers and runs forward, text and image."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.needs import needs

from recipe.smoke import shipped_model_dir
from recipe.smoke.tokenizer import token_id

CONFIG = json.loads((shipped_model_dir() / "config.json").read_text(encoding="utf-8"))
TEXT, VISION = CONFIG["text_config"], CONFIG["vision_config"]

transformers = needs("transformers", install="needs torch and transformers (the trainer extra)")


@pytest.fixture(scope="module")
def model() -> Any:
    import torch

    config = transformers.AutoConfig.from_pretrained(shipped_model_dir())
    torch.manual_seed(0)
    return transformers.Qwen3_5MoeForConditionalGeneration._from_config(config, dtype=torch.float32).eval()


def test_transformers_reads_the_config_as_qwen3_5_moe() -> None:
    config = transformers.AutoConfig.from_pretrained(shipped_model_dir())
    assert type(config).__name__ == "Qwen3_5MoeConfig"
    assert config.text_config.layer_types == TEXT["layer_types"]
    assert config.vision_config.depth == VISION["depth"]


def test_the_model_builds_small(model: Any) -> None:
    parameters = sum(p.numel() for p in model.parameters())
    assert 1_000_000 < parameters < 20_000_000
    names = {name for name, _ in model.named_parameters()}
    assert any(".linear_attn." in n for n in names) and any(".self_attn." in n for n in names)
    assert any(".mlp.shared_expert." in n for n in names) and any(n.startswith("model.visual.") for n in names)


def test_a_text_forward_pass(model: Any) -> None:
    import torch

    ids = torch.randint(0, TEXT["vocab_size"], (2, 17))
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (2, 17, TEXT["vocab_size"]) and torch.isfinite(logits).all()


def test_a_forward_pass_through_the_vision_tower(model: Any) -> None:
    """One 64x64 image: 4x4 patches of 16 px, merged 2x2 into 4 image tokens."""
    import torch

    patches = 2 * 3 * 16 * 16  # temporal x channels x patch x patch, flattened per patch
    grid = torch.tensor([[1, 4, 4]])
    image_tokens = int(grid.prod()) // VISION["spatial_merge_size"] ** 2
    ids = torch.tensor(
        [
            [token_id("<|im_start|>"), 72, 105, CONFIG["vision_start_token_id"]]
            + [CONFIG["image_token_id"]] * image_tokens
            + [CONFIG["vision_end_token_id"], 63, token_id("<|im_end|>")]
        ]
    )
    with torch.no_grad():
        out = model(
            input_ids=ids,
            pixel_values=torch.randn(int(grid.prod()), patches),
            image_grid_thw=grid,
            mm_token_type_ids=(ids == CONFIG["image_token_id"]).int(),
        )
    assert out.logits.shape == (1, ids.shape[1], TEXT["vocab_size"]) and torch.isfinite(out.logits).all()
