"""The byte-level tokenizer: no unknown tokens, Qwen's special tokens, the model's exact vocabulary size."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.needs import needs

from recipe.smoke.tokenizer import QWEN_SPECIAL_TOKENS, special_tokens, token_id, vocab_size

needs("tokenizers", install="needs tokenizers and transformers (the trainer extra)")
needs("transformers", install="needs tokenizers and transformers (the trainer extra)")


@pytest.fixture
def tokenizer() -> Any:
    # Built per test (a few ms): a shared one would tie the build to the first test alone, and mutmut runs
    # only the tests it saw reach a function against that function's mutants.
    from recipe.smoke.tokenizer import build_tokenizer

    return build_tokenizer()


def test_the_vocabulary_is_exactly_the_models(tokenizer: Any) -> None:
    assert len(tokenizer) == vocab_size() == 384
    assert len(special_tokens()) == vocab_size() - 256 - 1  # and one text token


def test_geo3ks_instruction_is_one_ordinary_token_that_decoding_keeps(tokenizer: Any) -> None:
    """The last id is geo3k's instruction: one token inside any text (a smoke prompt is 76 tokens, not 289), kept
    by decoding with skip_special_tokens (it is no special token); text around it stays byte-level."""
    from recipe.data.specs import GEO3K_INSTRUCTION

    text = f"x {GEO3K_INSTRUCTION} y"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids == [ord("x"), ord(" "), 383, ord(" "), ord("y")]
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    # Anything short of the whole instruction is bytes.
    assert len(tokenizer.encode(GEO3K_INSTRUCTION[:-1], add_special_tokens=False)) == len(GEO3K_INSTRUCTION) - 1


def test_special_tokens_follow_the_bytes_in_qwens_order(tokenizer: Any) -> None:
    for offset, token in enumerate(QWEN_SPECIAL_TOKENS):
        assert tokenizer.convert_tokens_to_ids(token) == 256 + offset == token_id(token)
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"


@pytest.mark.parametrize(
    "text",
    # The last: transformers' clean-up would glue " ," and " 's" back together on decode.
    ["What is 12 * 7?\n#### 84", "naïve — 数学 ∑ 🙂", " leading and  double  spaces ", "a , b . c 's d n't ?"],
)
def test_any_text_round_trips_with_one_id_per_byte(tokenizer: Any, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids == list(text.encode("utf-8"))
    assert tokenizer.decode(ids) == text


def test_special_tokens_are_single_tokens_and_skipped_on_request(tokenizer: Any) -> None:
    ids = tokenizer.encode("<|im_start|>hi<|im_end|>", add_special_tokens=False)
    assert ids == [token_id("<|im_start|>"), ord("h"), ord("i"), token_id("<|im_end|>")]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "hi"


def test_the_chat_template_renders_qwen_chatml(tokenizer: Any) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 3?"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tokenizer.apply_chat_template(messages, tokenize=False).endswith("<|im_end|>\n")


def test_the_chat_template_marks_images_and_videos_like_qwen_vl(tokenizer: Any) -> None:
    content = [{"type": "image"}, {"type": "text", "text": "Find x."}, {"type": "video"}]
    text = tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=False)
    assert text == (
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Find x."
        "<|vision_start|><|video_pad|><|vision_end|><|im_end|>\n"
    )


def test_verls_system_prompt_probe_works(tokenizer: Any) -> None:
    """verl's agent loop renders one and two empty user turns to find the template's fixed prefix."""
    verl_chat = needs("verl.utils.tokenizer.chat_template", install="needs verl (the trainer extra)")
    assert verl_chat.initialize_system_prompt(tokenizer) == []


def test_the_byte_alphabet_is_gpt2s(tokenizer: Any) -> None:
    # The ByteLevel pre-tokenizer emits GPT-2's byte -> character table; the vocabulary must use the same one.
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    assert {char: byte for byte, char in bytes_to_unicode().items()} == {
        char: byte for char, byte in tokenizer.get_vocab().items() if byte < 256
    }


def test_the_saved_files_tell_every_reader_not_to_clean_up_spaces(tokenizer: Any, tmp_path: Path) -> None:
    """transformers 4 (and any reader of tokenizer_config.json that honours it) cleans up decoded text when the flag
    is true or unset, gluing " ," and " 's" back; transformers 5 ignores it for BPE. The saved files say false."""
    import json

    tokenizer.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["clean_up_tokenization_spaces"] is False
    assert tokenizer.clean_up_tokenization_spaces is False


def test_the_context_length_is_the_models(tokenizer: Any) -> None:
    from recipe.smoke.tokenizer import shipped_model_config

    assert tokenizer.model_max_length == shipped_model_config()["text_config"]["max_position_embeddings"]


@pytest.mark.parametrize(("size", "reserved"), [(256 + len(QWEN_SPECIAL_TOKENS) + 1, 0), (256 + len(QWEN_SPECIAL_TOKENS) + 3, 2)])
def test_reserved_tokens_fill_the_vocabulary_exactly(monkeypatch: pytest.MonkeyPatch, size: int, reserved: int) -> None:
    from recipe.smoke import tokenizer as module

    monkeypatch.setattr(module, "vocab_size", lambda: size)
    assert special_tokens() == [*QWEN_SPECIAL_TOKENS, *(f"<|reserved_{i}|>" for i in range(reserved))]


def test_a_vocabulary_too_small_for_the_special_tokens_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from recipe.smoke import tokenizer as module

    monkeypatch.setattr(module, "vocab_size", lambda: 270)
    with pytest.raises(ValueError, match=r"^vocab_size 270 is too small for 256 bytes, the special tokens and the text tokens$"):
        special_tokens()


def test_a_special_token_listed_twice_is_refused_as_a_size_mismatch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tokenizer keeps one copy of a repeated token, so it would come out one short of the embedding table, which
    vLLM and Megatron-Bridge refuse far later: the build says so at once, with both sizes."""
    from recipe.smoke import tokenizer as module

    monkeypatch.setattr(module, "QWEN_SPECIAL_TOKENS", (*QWEN_SPECIAL_TOKENS, "<|im_end|>"))
    with pytest.raises(RuntimeError, match=r"^tokenizer has 383 tokens, the model 384$"):
        module.build_tokenizer()
