"""The generated smoke data: geo3k's row format, an image in every prompt that alone carries its problem.

verl's loader with the model's processor (it needs torchvision) is tested in tests/e2e/test_image_data.py."""

from __future__ import annotations

import random
from pathlib import Path

from tests.support.needs import needs

from recipe.smoke import SmokeAssets
from recipe.data.specs import GEO3K_INSTRUCTION, SPECS
from recipe.smoke.arithmetic import QUESTION, Problem, picture, problems, to_row

DATA_SOURCE = SPECS["geo3k"].hub_id

pa = needs("pyarrow", install="needs pyarrow (the trainer extra)")
import pyarrow.parquet as pq  # noqa: E402


def test_problems_are_right_and_never_negative() -> None:
    for problem in problems(500, random.Random(7)):
        assert problem.result >= 0
        assert eval(problem.expression) == problem.result  # noqa: S307


def test_a_row_is_a_geo3k_row_whose_numbers_are_only_in_its_image() -> None:
    row = to_row(Problem(12, "+", 7), 3, "train")
    question = "<image>" + QUESTION
    assert row == {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{question} {GEO3K_INSTRUCTION}"}],
        "images": [{"bytes": picture(Problem(12, "+", 7)), "path": None}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "19"},
        "extra_info": {"split": "train", "index": 3, "answer": "19", "question": question},
    }
    assert not any(character.isdigit() for character in row["prompt"][0]["content"])


def test_the_files_have_the_recipes_geo3k_schema(built: SmokeAssets) -> None:
    for path, split in ((built.train_file, "train"), (built.val_file, "test")):
        table = pq.read_table(path)
        assert table.column_names == ["data_source", "prompt", "images", "ability", "reward_model", "extra_info"]
        # The `datasets` Image feature, as prepare-data writes it: verl's loader hands back PIL images.
        assert b"Image" in table.schema.metadata[b"huggingface"]
        rows = table.to_pylist()
        assert {r["data_source"] for r in rows} == {DATA_SOURCE}
        assert [r["extra_info"]["index"] for r in rows] == list(range(len(rows)))
        assert {r["extra_info"]["split"] for r in rows} == {split}
        assert all(len(r["images"]) == 1 for r in rows)


def test_train_and_validation_problems_do_not_overlap(built: SmokeAssets) -> None:
    def images(path: Path) -> set[bytes]:
        return {r[0]["bytes"] for r in pq.read_table(path, columns=["images"]).column(0).to_pylist()}

    assert not images(built.train_file) & images(built.val_file)
