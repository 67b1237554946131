"""The run's inputs, built offline: a tiny dense Qwen3 with the recipe's tokenizer, the recipe's smoke data.

The recipe's smoke model (Qwen3.5-MoE: Gated DeltaNet, MoE) cannot run on CPU (docs/smoke.md);
the dense Qwen3 keeps the rest of the smoke profile: its byte-level tokenizer and chat template
(recipe.smoke.tokenizer), its vocabulary size, and its arithmetic rows (recipe.smoke.arithmetic).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

#: Attention head size: vLLM's CPU attention supports 32..512 (64 here keeps 2 KV heads cheap).
HEAD_DIM = 32
SEED = 0


@dataclass(frozen=True)
class Assets:
    """Where the model and the data are."""

    model: Path
    train_file: Path
    val_file: Path


def build_assets(root: Path, moe: bool = False) -> Assets:
    """Build (replacing what is there) the model under root/model and the data under root/data.

    `moe`: a tiny Qwen3-MoE (4 experts, 2 per token) instead of the dense Qwen3.
    """
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    from recipe.smoke import arithmetic
    from recipe.smoke.prepare import TEST_ROWS, TRAIN_ROWS
    from recipe.smoke.tokenizer import EOS_TOKEN, PAD_TOKEN, build_tokenizer, shipped_model_config, token_id, vocab_size

    if root.exists():
        shutil.rmtree(root)
    model_dir, data_dir = root / "model", root / "data"
    model_dir.mkdir(parents=True)
    data_dir.mkdir()
    config_class, model_class = (Qwen3MoeConfig, Qwen3MoeForCausalLM) if moe else (Qwen3Config, Qwen3ForCausalLM)
    experts = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64} if moe else {}
    config = config_class(
        **experts,
        vocab_size=vocab_size(),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=HEAD_DIM,
        max_position_embeddings=int(shipped_model_config()["text_config"]["max_position_embeddings"]),
        tie_word_embeddings=False,
        bos_token_id=token_id(PAD_TOKEN),
        eos_token_id=token_id(EOS_TOKEN),
        pad_token_id=token_id(PAD_TOKEN),
        torch_dtype="bfloat16",
    )
    torch.manual_seed(SEED)
    model_class(config).to(torch.bfloat16).save_pretrained(model_dir)
    build_tokenizer().save_pretrained(model_dir)
    GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    ).save_pretrained(model_dir)
    train, val = arithmetic.write_dataset(data_dir, SEED, TRAIN_ROWS, TEST_ROWS)
    return Assets(model_dir, train, val)
