"""A small generated arithmetic dataset with an image in every row, in the layout of `prepare-data geo3k`.

The real job trains on Geometry3k, where every prompt carries an image, so the smoke rows do
too: each row's image shows the expression (`37 + 45`, drawn with PIL) and its text only asks
for the value of the expression in the image, so the question cannot be answered without it.
Rows are converted by the recipe's own `convert_geo3k` and written with the same parquet
schema as `prepare-data geo3k` (images as undecoded `{bytes, path}` structs with the
`datasets` Image feature), so what the smoke run trains on is the real row format, geo3k's
instruction included. The smoke run scores responses with its own reward
(recipe/smoke/reward.py); `reward_model.ground_truth` is the exact answer, as geo3k's is.
The same seed always gives the same bytes, so the files are reproducible.
"""

from __future__ import annotations

import io
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipe.data.specs import SPECS, convert_geo3k, output_features

_OPERATORS = ("+", "-", "*")

#: Every row's question: the numbers are only in the image.
QUESTION = "What is the value of the expression in the image?"
#: The drawn image, in pixels: the smoke processor's smallest (4096 pixels), 4 image tokens after the 2x2 merge.
IMAGE_SIZE = 64


@dataclass(frozen=True)
class Problem:
    """One expression (what the image shows) and its value."""

    left: int
    operator: str
    right: int

    @property
    def result(self) -> int:
        """The exact answer."""
        if self.operator == "+":
            return self.left + self.right
        if self.operator == "-":
            return self.left - self.right
        return self.left * self.right

    @property
    def expression(self) -> str:
        """What the image shows."""
        return f"{self.left} {self.operator} {self.right}"


def problems(count: int, rng: random.Random) -> list[Problem]:
    """`count` problems; subtraction never goes below zero, products stay small."""
    out: list[Problem] = []
    for _ in range(count):
        operator = rng.choice(_OPERATORS)
        if operator == "*":
            left, right = rng.randint(2, 12), rng.randint(2, 12)
        else:
            left, right = rng.randint(0, 99), rng.randint(0, 99)
            if operator == "-" and right > left:
                left, right = right, left
        out.append(Problem(left, operator, right))
    return out


def picture(problem: Problem) -> bytes:
    """The problem's expression drawn black on white, as a PNG of IMAGE_SIZE x IMAGE_SIZE (same bytes each call)."""
    from PIL import (  # lazy: PIL is heavy or absent where this module is imported; loaded only here
        Image,
        ImageDraw,
    )

    image = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), (255, 255, 255))
    ImageDraw.Draw(image).text((4, IMAGE_SIZE // 2 - 6), problem.expression, fill=(0, 0, 0))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def to_row(problem: Problem, index: int, split: str) -> dict[str, Any]:
    """One problem as one verl row, converted exactly like a row of `prepare-data geo3k`."""
    source = {
        "images": [{"bytes": picture(problem), "path": None}],
        "problem": "<image>" + QUESTION,
        "answer": str(problem.result),
    }
    return convert_geo3k(source, index, split)


def write_split(path: Path, rows: list[dict[str, Any]]) -> None:
    """Write `rows` as one parquet file with `prepare-data geo3k`'s schema (the caller makes the swap atomic)."""
    import datasets  # lazy: datasets is heavy or absent where this module is imported; loaded only here

    features = output_features(SPECS["geo3k"])
    datasets.Dataset.from_list(rows, features=features).to_parquet(str(path))


def write_dataset(directory: Path, seed: int, train_rows: int, test_rows: int) -> tuple[Path, Path]:
    """Generate and write `train.parquet` and `test.parquet`; returns their paths.

    Train and test questions never overlap, so validation measures something.
    """
    rng = random.Random(seed)
    pool: list[Problem] = []
    seen: set[Problem] = set()
    while len(pool) < train_rows + test_rows:
        for problem in problems(train_rows + test_rows, rng):
            if problem not in seen and len(pool) < train_rows + test_rows:
                seen.add(problem)
                pool.append(problem)
    splits = {"train": pool[:train_rows], "test": pool[train_rows:]}
    paths: dict[str, Path] = {}
    for split, chosen in splits.items():
        paths[split] = directory / f"{split}.parquet"
        write_split(paths[split], [to_row(p, i, split) for i, p in enumerate(chosen)])
    return paths["train"], paths["test"]
