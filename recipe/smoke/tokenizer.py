"""The smoke model's tokenizer, built offline: byte-level BPE plus Qwen's special tokens.

Every byte is one token (ids 0-255 are the byte values), so any text, any digit and any
random model output round-trips without an unknown token, and nothing has to be
downloaded or trained. After the bytes come Qwen3.5's special tokens in Qwen's own order
(chat markers, then the vision markers whose ids the shipped config.json names), then
reserved tokens, and last a few whole texts that are one token each (TEXT_TOKENS), up to the
model's vocabulary size, so that the tokenizer and the embedding table have exactly the same
size, as vLLM and Megatron-Bridge expect.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from recipe.data.specs import GEO3K_INSTRUCTION

SHIPPED = Path(__file__).with_name("shipped")

#: Qwen3.5's special tokens, in the order of its own vocabulary (248044 = <|endoftext|> ...).
QWEN_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
BYTE_TOKENS = 256
#: Texts that are one (ordinary, not special) token each, as a real vocabulary makes common text a few tokens:
#: geo3k's instruction, which every smoke prompt ends with, would otherwise be 214 byte tokens, three quarters of
#: each prompt, and would triple what the CPU e2e computes per step (Qwen3.5's own tokenizer makes it about 45).
TEXT_TOKENS: tuple[str, ...] = (GEO3K_INSTRUCTION,)
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"


@cache
def shipped_model_config() -> dict[str, Any]:
    """The shipped config.json of the smoke model, parsed."""
    config: dict[str, Any] = json.loads((SHIPPED / "config.json").read_text(encoding="utf-8"))
    return config


def vocab_size() -> int:
    """The model's vocabulary size; the tokenizer has exactly this many tokens."""
    return int(shipped_model_config()["text_config"]["vocab_size"])


def special_tokens() -> list[str]:
    """Qwen's special tokens, then `<|reserved_N|>` up to the vocabulary size less the TEXT_TOKENS."""
    reserved = vocab_size() - BYTE_TOKENS - len(QWEN_SPECIAL_TOKENS) - len(TEXT_TOKENS)
    if reserved < 0:
        raise ValueError(
            f"vocab_size {vocab_size()} is too small for {BYTE_TOKENS} bytes, the special tokens and the text tokens"
        )
    return [*QWEN_SPECIAL_TOKENS, *(f"<|reserved_{i}|>" for i in range(reserved))]


def token_id(token: str) -> int:
    """The id a special token gets (bytes first, then the specials in order)."""
    return BYTE_TOKENS + special_tokens().index(token)


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character table, which the ByteLevel pre-tokenizer emits."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shifted)
            shifted += 1
    return table


def chat_template() -> str:
    """The shipped Qwen-style ChatML template (text, image and video items)."""
    return (SHIPPED / "chat_template.jinja").read_text(encoding="utf-8")


def build_tokenizer() -> Any:
    """A transformers fast tokenizer over the byte-level BPE; `save_pretrained` writes its files."""
    # lazy: tokenizers is heavy or absent where this module is imported; loaded only here
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    # lazy: transformers is heavy or absent where this module is imported; loaded only here
    from transformers import PreTrainedTokenizerFast

    vocab = {char: byte for byte, char in _byte_alphabet().items()}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    core.decoder = decoders.ByteLevel()
    # Added in one call so their ids follow the bytes in order: 256, 257, ...
    core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special_tokens()])
    # Ordinary tokens: kept when decoding with skip_special_tokens, matched in the raw text before the bytes.
    core.add_tokens([AddedToken(t, special=False, normalized=False) for t in TEXT_TOKENS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        chat_template=chat_template(),
        model_max_length=int(shipped_model_config()["text_config"]["max_position_embeddings"]),
        clean_up_tokenization_spaces=False,
    )
    if len(tokenizer) != vocab_size():
        raise RuntimeError(f"tokenizer has {len(tokenizer)} tokens, the model {vocab_size()}")
    return tokenizer
