"""The smoke data's image rows as verl's agent loop hands them to the processor: prompt text and image."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any


def smoke_rows(train_file: Path, count: int) -> list[dict[str, Any]]:
    """The first `count` rows of the training parquet, as written (images as {bytes, path})."""
    import pyarrow.parquet as pq

    return pq.read_table(train_file).to_pylist()[:count]  # type: ignore[no-any-return]


def prompt_and_image(processor: Any, row: dict[str, Any]) -> tuple[str, Any]:
    """The row's chat-templated prompt (its `<image>` an image item, as verl builds it) and its decoded RGB image."""
    from PIL import Image

    from recipe.data.prompt_lengths import verl_messages

    text = processor.apply_chat_template(verl_messages(row["prompt"], 1), add_generation_prompt=True, tokenize=False)
    return text, Image.open(io.BytesIO(row["images"][0]["bytes"])).convert("RGB")
