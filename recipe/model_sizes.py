"""How many parameters the model has, grouped by how Megatron places them, and its rollout state per token.

The memory-fit estimate (recipe.memory_fit) needs more of config.json than the layout rules do:
the hidden size, the vocabulary, each layer's kind (full attention or Gated DeltaNet), the
expert sizes, the vision tower. The counts follow the Hugging Face modules of Qwen3.5-MoE
(transformers `qwen3_5_moe`) and are checked against a model built by transformers from the
same config (tests/unit/test_model_sizes.py). The groups are Megatron's (megatron/training/
theoretical_memory_usage.py): split over TP, kept whole on every rank, or split over EP x ETP.
Multi-token-prediction layers (`mtp_num_hidden_layers`) are not counted: the recipe does not
train them.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Mapping

#: bf16 weights in the actor, the reference and vLLM; fp32 for the Gated DeltaNet recurrent state
#: (config.json `mamba_ssm_dtype`, float32 in Qwen3.5's) and the conv state in the weights' dtype.
BF16_BYTES = 2
FP32_BYTES = 4
#: Korthikanti et al. 2022 (arXiv 2205.05198): a transformer layer keeps about 34 x tokens x hidden bytes of
#: activations for its backward pass in bf16 (no attention-score term with flash attention); recipe.memory_fit uses
#: the same factor for the language model's recomputed layer.
VIT_ACTIVATION_FACTOR = 34


@dataclass(frozen=True)
class ModelSizes:
    """Parameter counts by placement, and what vLLM keeps per token and per sequence."""

    hidden_size: int
    vocab_size: int
    tied_embeddings: bool
    num_layers: int
    experts_per_token: int
    moe_ffn_hidden_size: int
    #: Split over TP in every decoder layer, summed over the layers: attention (full or linear) and the shared expert.
    tp_sharded: int
    #: Whole on every rank: norms (the final one too), the router, the shared expert's gate, DeltaNet's A and dt.
    replicated: int
    #: The routed experts of every layer, split over EP x ETP.
    experts: int
    #: One embedding table (vocab x hidden); the output layer is another unless tied.
    embedding: int
    #: The vision tower and its merger (0 for a text model); Megatron-Bridge puts it on the first pipeline stage.
    vision: int
    #: Keys and values of every full-attention layer, per token, all KV heads (bf16).
    kv_bytes_per_token: int
    #: KV heads, for vLLM's split over GEN_TP (a rank holds at least one).
    num_kv_heads: int
    #: Gated DeltaNet conv and recurrent state of every linear-attention layer, per sequence, all heads.
    state_bytes_per_sequence: int
    #: The vision tower's activations kept for the backward pass per image token (0 for a text model): each image
    #: token is spatial_merge_size**2 patches through every vision block, none recomputed.
    vision_activation_bytes_per_image_token: int = 0

    @property
    def total(self) -> int:
        """Every parameter the recipe trains."""
        output = 0 if self.tied_embeddings else self.embedding
        return self.tp_sharded + self.replicated + self.experts + self.embedding + output + self.vision

    @property
    def active_per_token(self) -> int:
        """The language model's weights one token's forward pass multiplies by: attention (full or DeltaNet), the
        shared expert, the router, experts_per_token routed experts of every layer, and the output layer (the input
        embedding is a lookup, no multiply). The vision tower is left out: it runs on image patches, not tokens."""
        routed = self.num_layers * self.experts_per_token * 3 * self.hidden_size * self.moe_ffn_hidden_size
        return self.tp_sharded + self.replicated + routed + self.embedding

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form for `plan --json`."""
        return {**asdict(self), "total": self.total}


class SizesUnknown(ValueError):
    """config.json lacks a number the estimate needs (the layout rules may still hold)."""


class SizesInvalid(SizesUnknown):
    """config.json gives a number no model has (a bool, a float, a negative or past MAX_COUNT): bad input, refused."""


#: The largest count config.json may give (2**31 - 1, far above any model's): the memory estimate
#: multiplies several, and a hostile 2**1030 would overflow its floats instead of being refused.
MAX_COUNT = 2**31 - 1


#: The counts that may be 0 and still describe a model: no shared expert, no learned position table.
ZERO_ALLOWED = frozenset({"shared_expert_intermediate_size", "num_position_embeddings"})


def _int(section: Mapping[str, Any], key: str) -> int:
    """A count config.json must give: its absence is not guessed (transformers' class defaults differ by model).

    Every count is at least 1 but those of ZERO_ALLOWED: a head_dim or a vocab_size of 0 passes
    any type check, and would make a term of the estimate 0 (or a division by it) without a word.
    """
    value = section.get(key)
    if value is None:
        raise SizesUnknown(f"config.json lacks {key}")
    low = 0 if key in ZERO_ALLOWED else 1
    # JSON true/false are Python bools, which are ints; a count is never one.
    if type(value) is not int or not low <= value <= MAX_COUNT:
        shown = json.dumps(value)[:40] if isinstance(value, (int, float, str)) else type(value).__name__
        why = "" if low == 0 else " (0 would leave the memory estimate's term for it empty)"
        raise SizesInvalid(f"config.json {key}={shown}: must be a whole number from {low} to {MAX_COUNT}{why}")
    return value


_LINEAR_KEYS = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
                "linear_conv_kernel_dim")  # fmt: skip


def _layer_kinds(text: Mapping[str, Any], layers: int) -> list[str]:
    """Each decoder layer's kind: `layer_types`, else every `full_attention_interval`-th is full; a config with
    neither and no Gated DeltaNet keys is all full attention (Qwen3-MoE)."""
    kinds = text.get("layer_types")
    if kinds is not None:
        if not isinstance(kinds, list) or len(kinds) != layers or not all(k in ("full_attention", "linear_attention") for k in kinds):
            raise SizesUnknown(f"config.json layer_types: must list {layers} of full_attention / linear_attention")
        return list(kinds)
    if "full_attention_interval" in text:
        interval = _int(text, "full_attention_interval")
        return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]
    if any(key in text for key in _LINEAR_KEYS):
        raise SizesUnknown("config.json has Gated DeltaNet keys but neither layer_types nor full_attention_interval")
    return ["full_attention"] * layers


def _vision_activation_bytes(vision: Mapping[str, Any] | None) -> int:
    """Per image token: merge**2 patches x hidden x depth x Korthikanti's 34 bytes (no recompute assumed)."""
    if vision is None:
        return 0
    if not isinstance(vision, dict):
        raise SizesUnknown("config.json vision_config must be a JSON object")
    patches = _int(vision, "spatial_merge_size") ** 2
    return patches * _int(vision, "hidden_size") * _int(vision, "depth") * VIT_ACTIVATION_FACTOR


def _vision_parameters(vision: Mapping[str, Any] | None) -> int:
    """The ViT of Qwen3-VL / Qwen3.5 (transformers `qwen3_5_moe_vision`): patch and position embeddings, blocks, merger."""
    if vision is None:
        return 0
    if not isinstance(vision, dict):
        raise SizesUnknown("config.json vision_config must be a JSON object")
    h, inner, depth = _int(vision, "hidden_size"), _int(vision, "intermediate_size"), _int(vision, "depth")
    patch = _int(vision, "in_channels") * _int(vision, "temporal_patch_size") * _int(vision, "patch_size") ** 2
    merged = h * _int(vision, "spatial_merge_size") ** 2
    out = _int(vision, "out_hidden_size")
    embeddings = patch * h + h + _int(vision, "num_position_embeddings") * h
    block = (3 * h * h + 3 * h) + (h * h + h) + (h * inner + inner) + (inner * h + h) + 4 * h  # qkv, proj, mlp, 2 norms
    merger = 2 * h + (merged * merged + merged) + (merged * out + out)  # norm, fc1, fc2
    return embeddings + depth * block + merger


def sizes_from_config(config: Mapping[str, Any]) -> ModelSizes:
    """The sizes of the model a parsed config.json describes (a VLM nests its text model under `text_config`).

    Raises SizesUnknown naming the first missing or unusable number.
    """
    text = config.get("text_config", config)
    if not isinstance(text, dict):
        raise SizesUnknown("config.json text_config must be a JSON object")
    h, vocab, layers = _int(text, "hidden_size"), _int(text, "vocab_size"), _int(text, "num_hidden_layers")
    heads, kv_heads, head_dim = _int(text, "num_attention_heads"), _int(text, "num_key_value_heads"), _int(text, "head_dim")
    experts, ffn = _int(text, "num_experts"), _int(text, "moe_intermediate_size")
    shared_ffn = _int(text, "shared_expert_intermediate_size")
    kinds = _layer_kinds(text, layers)
    full, linear = kinds.count("full_attention"), kinds.count("linear_attention")
    if not full:
        # vLLM then keeps no KV cache: the estimate's KV term, and the tokens its pool holds, have nothing to size.
        raise SizesInvalid(
            "config.json layer_types / full_attention_interval: no full_attention layer among the "
            f"{layers}, so the model has no KV cache to size; a Qwen3.5-MoE has one in every few layers"
        )
    if linear:
        key_heads, value_heads, key_head_dim, value_head_dim, conv_kernel = (_int(text, k) for k in _LINEAR_KEYS)
    else:
        key_heads = value_heads = key_head_dim = value_head_dim = conv_kernel = 0
    key_dim, value_dim = key_heads * key_head_dim, value_heads * value_head_dim

    # q_proj is twice the heads' width: Qwen3.5 gates attention's output, and transformers builds the gate whatever
    # config.json's attn_output_gate says (modeling_qwen3_5_moe.py, Qwen3_5MoeAttention).
    full_attention = h * heads * head_dim * 2 + 2 * h * kv_heads * head_dim + heads * head_dim * h
    # in_proj_qkvz, in_proj_ba, the depthwise conv over q, k and v, out_proj (transformers Qwen3_5MoeGatedDeltaNet).
    conv_channels = 2 * key_dim + value_dim
    linear_attention = h * (2 * key_dim + 2 * value_dim) + h * 2 * value_heads + conv_channels * conv_kernel + value_dim * h
    mlp = 3 * h * shared_ffn
    # Two norms, the router, and the shared expert's gate, which transformers builds even for a shared expert of size 0.
    per_layer_replicated = 2 * h + h * experts + h
    replicated = h + layers * per_layer_replicated + full * 2 * head_dim + linear * (2 * value_heads + value_head_dim)
    # The top level decides, as in transformers: a nested text_config's own tie_word_embeddings is not read.
    tied = config.get("tie_word_embeddings") is True
    ssm_bytes = FP32_BYTES if str(text.get("mamba_ssm_dtype", "float32")) == "float32" else BF16_BYTES
    state = linear * (
        conv_channels * max(conv_kernel - 1, 0) * BF16_BYTES
        + value_heads * key_head_dim * value_head_dim * ssm_bytes
    )
    vision = config.get("vision_config") if "text_config" in config else None
    return ModelSizes(
        hidden_size=h,
        vocab_size=vocab,
        tied_embeddings=tied,
        num_layers=layers,
        experts_per_token=_int(text, "num_experts_per_tok"),
        moe_ffn_hidden_size=ffn,
        tp_sharded=full * full_attention + linear * linear_attention + layers * mlp,
        replicated=replicated,
        experts=layers * experts * 3 * h * ffn,
        embedding=vocab * h,
        vision=_vision_parameters(vision),
        kv_bytes_per_token=full * 2 * kv_heads * head_dim * BF16_BYTES,
        num_kv_heads=kv_heads,
        state_bytes_per_sequence=state,
        vision_activation_bytes_per_image_token=_vision_activation_bytes(vision),
    )


#: Qwen3.5-35B-A3B's config.json, the numbers the sizes need (Hugging Face Qwen/Qwen3.5-35B-A3B): what `plan`
#: estimates with before the weights are downloaded.
QWEN3_5_35B_A3B_CONFIG: dict[str, Any] = {
    "tie_word_embeddings": False,
    "text_config": {
        "hidden_size": 2048, "vocab_size": 248320, "num_hidden_layers": 40, "full_attention_interval": 4,
        "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256, "attn_output_gate": True,
        "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
        "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "mamba_ssm_dtype": "float32",
        "num_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512,
    },
    "vision_config": {
        "depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "in_channels": 3, "patch_size": 16,
        "temporal_patch_size": 2, "spatial_merge_size": 2, "out_hidden_size": 2048, "num_position_embeddings": 2304,
    },
}  # fmt: skip
