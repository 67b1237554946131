"""The bench's synthetic prompts: a fixed question and an image of its own in each, in `prepare-data geo3k`'s layout.

Each row is converted by the recipe's own `convert_geo3k` and written with the same parquet schema,
so verl reads, filters and batches them exactly as it does geo3k. Every image differs (its row's
number is drawn on it), so vLLM's multimodal cache and prefix cache cannot serve one prompt from
another's work, as they could not in a real run. The same row count gives the same bytes.

Neighbouring rows differ in length too: row i asks FILLER i mod FILLER_CYCLE times. With every
prompt the same length and every response the same (ignore_eos), every sequence of a batch has
one length, and verl 0.9.1 crashes in the actor update of a VLM: `left_right_2_no_padding`
(verl/workers/utils/padding.py) lets torch's `as_nested_tensor` pick the ragged dimension of the
(4, length) mrope position ids, which for equal lengths is the 4, and `maybe_fix_3d_position_ids`
then declares the length ragged ("split_with_sizes expects split_sizes to sum exactly to 194 ...
but got split_sizes=[4, 4, 4, 4]", found by the CPU e2e's bench run). A real batch of geo3k
never has one length; a batch of one prompt's samples alone (TRAIN_BATCH_SIZE=1) still would.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from recipe.atomic import atomic_write
from recipe.data.specs import SPECS, convert_geo3k, output_features

#: A geo3k-sized figure: 448 x 448 pixels, 196 image tokens for Qwen3.5's 16-pixel patches merged 2 x 2.
IMAGE_SIZE = 448
#: The question of every row (the answer is the row's number, which verl's geo3k reward can score).
QUESTION = "Which number is written in the figure? Describe the figure in detail, then give the number."
#: Test rows at most: verl loads the validation file even with validation off.
MAX_TEST_ROWS = 8
#: A sentence row i repeats i mod FILLER_CYCLE times, so that neighbouring rows differ in length (module docstring).
FILLER = " Look closely."
FILLER_CYCLE = 8


def _picture(number: int) -> bytes:
    """A grid with `number` written on it, as a PNG of IMAGE_SIZE x IMAGE_SIZE (the same bytes for the same number)."""
    from PIL import Image, ImageDraw  # lazy: Pillow, only when run writes the bench data

    image = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    for offset in range(0, IMAGE_SIZE, 32):
        draw.line([(offset, 0), (offset, IMAGE_SIZE)], fill=(200, 200, 200))
        draw.line([(0, offset), (IMAGE_SIZE, offset)], fill=(200, 200, 200))
    draw.text((IMAGE_SIZE // 3, IMAGE_SIZE // 2), str(number), fill=(0, 0, 0))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def bench_row(index: int, split: str) -> dict[str, Any]:
    """Row `index` of a split, as `prepare-data geo3k` writes a row."""
    problem = "<image>" + QUESTION + FILLER * (index % FILLER_CYCLE)
    source = {"images": [{"bytes": _picture(index), "path": None}], "problem": problem, "answer": str(index)}
    return convert_geo3k(source, index, split)


def _write(path: Path, rows: list[dict[str, Any]]) -> None:
    import datasets  # lazy: datasets, only when run writes the bench data

    dataset = datasets.Dataset.from_list(rows, features=output_features(SPECS["geo3k"]))
    # A reader never sees half a file, and a planted link is replaced, not written through.
    atomic_write(path, lambda out: dataset.to_parquet(out))


def write_bench_data(directory: Path, train_rows: int, test_rows: int) -> tuple[Path, Path]:
    """Write `train.parquet` and `test.parquet` under `directory` (made if missing); returns their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    train, test = directory / "train.parquet", directory / "test.parquet"
    _write(train, [bench_row(index, "train") for index in range(train_rows)])
    _write(test, [bench_row(train_rows + index, "test") for index in range(test_rows)])
    return train, test


def row_counts(train_batch_size: int, steps: int) -> tuple[int, int]:
    """(train rows, test rows) for `steps` steps of `train_batch_size` prompts."""
    return train_batch_size * steps, min(train_batch_size, MAX_TEST_ROWS)
