"""A small generated arithmetic dataset in verl's parquet format, scored by verl's own gsm8k rule.

Rows look like the recipe's GSM8K rows: `data_source` "openai/gsm8k" makes verl's
`default_compute_score` use its gsm8k scorer, which gives 1.0 when the last
`#### <number>` of a response equals `reward_model.ground_truth`, else 0.
The same seed always gives the same rows, so the files are reproducible.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipe.data.specs import convert_gsm8k

_OPERATORS = ("+", "-", "*")


@dataclass(frozen=True)
class Problem:
    """One question with its worked answer."""

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
    def question(self) -> str:
        """The question as the user asks it."""
        return f"What is {self.left} {self.operator} {self.right}?"

    @property
    def solution(self) -> str:
        """A worked answer ending in GSM8K's `#### N` line."""
        return f"{self.left} {self.operator} {self.right} = {self.result}\n#### {self.result}"


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


def to_row(problem: Problem, index: int, split: str) -> dict[str, Any]:
    """One problem as one verl row: converted exactly like a row of `prepare-data gsm8k`."""
    return convert_gsm8k({"question": problem.question, "answer": problem.solution}, index, split)


def parquet_schema() -> Any:
    """The Arrow schema of the written files (column order as verl's examples write them)."""
    import pyarrow as pa

    string = pa.string()
    return pa.schema(
        [
            ("data_source", string),
            ("prompt", pa.list_(pa.struct([("role", string), ("content", string)]))),
            ("ability", string),
            ("reward_model", pa.struct([("style", string), ("ground_truth", string)])),
            (
                "extra_info",
                pa.struct([("split", string), ("index", pa.int64()), ("answer", string), ("question", string)]),
            ),
        ]
    )


def write_split(path: Path, rows: list[dict[str, Any]]) -> None:
    """Write `rows` as one parquet file (the caller makes the directory swap atomic)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows, schema=parquet_schema()), path)


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
