"""Prompt lengths in tokens as verl counts them: the chat-templated text plus every image's tokens.

verl 0.9.1 drops every training row whose prompt is longer than `data.max_prompt_length`
(`filter_overlong_prompts=True`), without a word, and image tokens count: for a Qwen-VL model each
image becomes one `<|image_pad|>` per merged patch. This module counts a row the way verl's
RLHFDataset does before it filters (verl/utils/dataset/rl_dataset.py, `doc2len`): the row's
messages with each `<image>` placeholder turned into an image item, the processor's chat template,
each image through verl's own `process_image` (Qwen-VL's resize), then the processor's token ids.

Nothing here is imported by `plan`: counting needs the model's processor (transformers and
torchvision) and verl, which only the images and the trainer extra have.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: verl's RLHFDataset splits message text on these placeholders (`_build_messages`).
_PLACEHOLDER = re.compile(r"(<image>|<video>)")
#: The share of rows a suggested MAX_PROMPT_LENGTH keeps.
KEEP_SHARE = 0.99


def verl_messages(prompt: Sequence[Mapping[str, Any]], n_images: int) -> list[dict[str, Any]]:
    """The row's chat messages as verl hands them to the processor: `<image>` -> `{"type": "image"}` items.

    Text-only rows (no images) keep their string content, as verl leaves them.
    """
    messages: list[dict[str, Any]] = []
    for message in prompt:
        content = message["content"]
        if n_images and isinstance(content, str):
            items: list[dict[str, Any]] = []
            for piece in _PLACEHOLDER.split(content):
                if piece == "<image>":
                    items.append({"type": "image"})
                elif piece == "<video>":
                    items.append({"type": "video"})
                elif piece:
                    items.append({"type": "text", "text": piece})
            content = items
        messages.append({"role": message["role"], "content": content})
    return messages


@dataclass(frozen=True)
class RowLength:
    """One row's prompt: all its tokens, and how many of them are image tokens."""

    tokens: int
    image_tokens: int


class PromptCounter:
    """Counts prompts with one model's processor, as verl's dataset does before it filters."""

    def __init__(self, model_dir: Path) -> None:
        # lazy: transformers is heavy or absent where this module is imported; loaded only here
        from transformers import AutoProcessor
        # lazy: verl is heavy or absent where this module is imported; loaded only here
        from verl.utils.dataset.vision_utils import process_image

        self._processor = AutoProcessor.from_pretrained(str(model_dir))
        self._process_image = process_image
        image_processor = getattr(self._processor, "image_processor", None)
        # verl's RLHFDataset resizes with the image processor's patch size (rl_dataset.py: image_patch_size).
        self._patch_size = int(getattr(image_processor, "patch_size", 14) or 14)
        pad = getattr(self._processor, "image_token", None)
        self._image_token_id = self._processor.tokenizer.convert_tokens_to_ids(pad) if pad else None

    def count(self, row: Mapping[str, Any]) -> RowLength:
        """The row's prompt length in tokens (text and images); images are `{bytes, path}` or PIL images."""
        from PIL import Image  # lazy: PIL is heavy or absent where this module is imported; loaded only here

        images = [
            self._process_image(image if isinstance(image, Image.Image) else {"bytes": bytes(image["bytes"])},
                                self._patch_size)
            for image in (row.get("images") or [])
        ]  # fmt: skip
        messages = verl_messages(row["prompt"], len(images))
        text = self._processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        if images:
            ids = self._processor(text=[text], images=images)["input_ids"][0]
        else:
            ids = self._processor.tokenizer(text=text, add_special_tokens=False)["input_ids"]
        ids = list(ids)
        image_tokens = ids.count(self._image_token_id) if self._image_token_id is not None and images else 0
        return RowLength(len(ids), image_tokens)


@dataclass(frozen=True)
class PromptLengths:
    """The prompt lengths of one split, with the share a length limit keeps."""

    tokens: tuple[int, ...]
    """Every row's prompt length, sorted."""
    image_tokens: tuple[int, ...]
    """Every row's image tokens, in the same rows' order as read (not sorted with `tokens`)."""

    @classmethod
    def of(cls, lengths: Iterable[RowLength]) -> PromptLengths:
        rows = list(lengths)
        return cls(tuple(sorted(row.tokens for row in rows)), tuple(row.image_tokens for row in rows))

    def percentile(self, share: float) -> int:
        """The smallest length that at least `share` of the rows fit within (nearest rank)."""
        if not self.tokens:
            return 0
        rank = max(1, math.ceil(share * len(self.tokens)))
        return self.tokens[rank - 1]

    def dropped_by(self, max_prompt_length: int) -> int:
        """How many rows verl would drop with this `data.max_prompt_length`."""
        return sum(1 for tokens in self.tokens if tokens > max_prompt_length)

    def summary(self) -> dict[str, Any]:
        """Rows, min / median / p99 (the length that keeps 99 %) / max tokens, and image tokens per row (mean, max)."""
        if not self.tokens:
            return {"rows": 0}
        return {
            "rows": len(self.tokens),
            "min": self.tokens[0],
            "median": self.percentile(0.5),
            "p99": self.percentile(KEEP_SHARE),
            "max": self.tokens[-1],
            "image_tokens_mean": round(sum(self.image_tokens) / len(self.image_tokens), 2),
            "image_tokens_max": max(self.image_tokens),
        }

    def to_manifest(self) -> dict[str, Any]:
        """The summary and every prompt's length (sorted), for prepare-data's manifest.json (`run` reads it back)."""
        return {**self.summary(), "tokens": list(self.tokens)}

    def describe(self) -> str:
        """One line: `N prompts: min A, median B, p99 C, max D tokens (image tokens: mean E, max F)`."""
        s = self.summary()
        if not s["rows"]:
            return "no prompts"
        return (
            f"{s['rows']} prompts: min {s['min']}, median {s['median']}, p99 {s['p99']}, max {s['max']} tokens "
            f"(text and images; image tokens per prompt: mean {s['image_tokens_mean']:g}, max {s['image_tokens_max']})"
        )


def count_parquet(path: Path, counter: PromptCounter) -> PromptLengths:
    """The prompt lengths of every row of a verl parquet file (prompt and images columns)."""
    import pyarrow.parquet as pq  # lazy: pyarrow is heavy or absent where this module is imported; loaded only here

    columns = [name for name in ("prompt", "images") if name in pq.read_schema(path).names]
    table = pq.read_table(path, columns=columns)
    return PromptLengths.of(counter.count(row) for row in table.to_pylist())

