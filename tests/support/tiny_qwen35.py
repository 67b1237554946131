"""The tiny Qwen3.5-MoE (transformers `qwen3_5_moe`, the recipe's model family) and HF checkpoint loading.

Same shape rules as Qwen3.5-35B-A3B, scaled down: every 4th layer full attention, Gated
DeltaNet otherwise, routed + shared experts, a vision tower. Used by tests/unit/export (the
export check) and tests/bridge (Megatron-Bridge's Qwen3.5 provider). torch and transformers
are imported inside the functions: importing this module costs nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

TINY_TEXT: dict[str, Any] = dict(
    vocab_size=128,
    hidden_size=32,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=16,
    shared_expert_intermediate_size=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    full_attention_interval=4,
    max_position_embeddings=64,
)
TINY_VISION: dict[str, Any] = dict(
    depth=1,
    hidden_size=16,
    intermediate_size=32,
    num_heads=2,
    out_hidden_size=32,
    patch_size=4,
    temporal_patch_size=2,
    spatial_merge_size=2,
)


def tiny_qwen35_config(tie_word_embeddings: bool = False) -> Any:
    """A Qwen3_5MoeConfig of the tiny model (HF class Qwen3_5MoeForConditionalGeneration)."""
    from transformers.models.qwen3_5_moe import Qwen3_5MoeConfig

    config = Qwen3_5MoeConfig(
        text_config=dict(TINY_TEXT, tie_word_embeddings=tie_word_embeddings),
        vision_config=TINY_VISION,
        tie_word_embeddings=tie_word_embeddings,
    )
    config.architectures = ["Qwen3_5MoeForConditionalGeneration"]
    return config


def load_all(directory: Path) -> dict[str, Any]:
    """Every tensor of an HF checkpoint directory (tiny models only)."""
    from safetensors.torch import load_file

    tensors: dict[str, Any] = {}
    for shard in sorted(Path(directory).glob("*.safetensors")):
        tensors.update(load_file(shard))
    return tensors
