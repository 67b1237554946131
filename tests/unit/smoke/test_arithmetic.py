"""The smoke dataset's generator by direct calls: the ranges of its problems, the images that carry them, the
exact files (geo3k's layout), their reproducibility from the seed, and train and test never sharing a problem."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.needs import needs

from recipe.smoke.arithmetic import IMAGE_SIZE, QUESTION, Problem, picture, problems, write_dataset

pa = needs("pyarrow", install="needs pyarrow (the trainer extra)")
import pyarrow.parquet as pq  # noqa: E402


@pytest.mark.parametrize(
    ("problem", "expression", "result"),
    [(Problem(12, "+", 7), "12 + 7", 19), (Problem(40, "-", 15), "40 - 15", 25), (Problem(6, "*", 7), "6 * 7", 42)],
)
def test_each_operator_shows_its_expression_and_computes_it(problem: Problem, expression: str, result: int) -> None:
    assert (problem.expression, problem.result) == (expression, result)


def test_the_picture_is_a_small_png_that_shows_only_its_problem() -> None:
    import io

    from PIL import Image

    seen = {}
    for problem in (Problem(12, "+", 7), Problem(12, "-", 7), Problem(21, "+", 7), Problem(6, "*", 7)):
        data = picture(problem)
        assert data == picture(problem)  # the same bytes every call: files reproducible from the seed
        with Image.open(io.BytesIO(data)) as image:
            assert (image.format, image.size, image.mode) == ("PNG", (IMAGE_SIZE, IMAGE_SIZE), "RGB")
            pixels = image.tobytes()
        assert len(set(pixels)) > 1, "nothing drawn"
        seen[pixels] = problem
    # Another operator or operand is another picture: the question can only be answered from the image.
    assert len(seen) == 4


@given(st.integers(0, 2**32), st.integers(1, 60))
def test_questions_stay_in_their_ranges(seed: int, count: int) -> None:
    # Sums and differences of 0..99 (never below zero), products of 2..12: short prompts a tiny model can tokenize.
    drawn = problems(count, random.Random(seed))
    assert len(drawn) == count
    for problem in drawn:
        if problem.operator == "*":
            assert 2 <= problem.left <= 12 and 2 <= problem.right <= 12
        else:
            assert 0 <= problem.left <= 99 and 0 <= problem.right <= 99
            assert problem.operator == "+" or problem.left >= problem.right


def test_every_operator_and_both_ends_of_the_ranges_occur() -> None:
    drawn = problems(5000, random.Random(0))
    assert {p.operator for p in drawn} == {"+", "-", "*"}
    for operator, low, high in (("*", 2, 12), ("+", 0, 99)):
        chosen = [p for p in drawn if p.operator == operator]
        assert (min(p.left for p in chosen), max(p.left for p in chosen)) == (low, high)
        assert (min(p.right for p in chosen), max(p.right for p in chosen)) == (low, high)
    # A subtraction whose operands were drawn the other way round is swapped, not redrawn or dropped.
    assert any(p.operator == "-" and p.left > p.right for p in drawn)


def _rows(path: Path) -> list[dict[str, object]]:
    return pq.read_table(path).to_pylist()  # type: ignore[no-any-return]


def test_the_files_hold_the_asked_rows_indexed_by_split(tmp_path: Path) -> None:
    train, test = write_dataset(tmp_path, seed=3, train_rows=40, test_rows=9)
    assert (train, test) == (tmp_path / "train.parquet", tmp_path / "test.parquet")
    for path, split, count in ((train, "train", 40), (test, "test", 9)):
        rows = _rows(path)
        assert [row["extra_info"]["index"] for row in rows] == list(range(count))  # type: ignore[index]
        assert {row["extra_info"]["split"] for row in rows} == {split}  # type: ignore[index]
        # One image per row, its bytes inside, and one placeholder for it in front of the question.
        assert all(len(row["images"]) == 1 and row["images"][0]["bytes"] for row in rows)  # type: ignore[arg-type,index]
        assert {row["prompt"][0]["content"].split("?")[0] + "?" for row in rows} == {"<image>" + QUESTION}  # type: ignore[index]
    # geo3k's columns in its order, as `prepare-data geo3k` writes them (images right after the prompt).
    assert pq.read_schema(train).names == ["data_source", "prompt", "images", "ability", "reward_model", "extra_info"]
    schema = pq.read_schema(train)
    assert schema.field("prompt").type == pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
    assert schema.field("images").type == pa.list_(pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    assert schema.field("reward_model").type == pa.struct([("style", pa.string()), ("ground_truth", pa.string())])
    assert schema.field("extra_info").type == pa.struct(
        [("split", pa.string()), ("index", pa.int64()), ("answer", pa.string()), ("question", pa.string())]
    )


def _problems_of(rows: list[dict[str, object]]) -> list[bytes]:
    return [row["images"][0]["bytes"] for row in rows]  # type: ignore[index]


def test_no_problem_repeats_within_or_across_splits(tmp_path: Path) -> None:
    # More rows than one draw tends to give unique problems: the generator draws again until it has enough.
    train, test = write_dataset(tmp_path, seed=1, train_rows=300, test_rows=100)
    images = [image for path in (train, test) for image in _problems_of(_rows(path))]
    assert len(images) == len(set(images)) == 400


def test_the_same_seed_writes_the_same_bytes_and_another_seed_others(tmp_path: Path) -> None:
    def written(name: str, seed: int) -> list[bytes]:
        folder = tmp_path / name
        folder.mkdir()
        return [path.read_bytes() for path in write_dataset(folder, seed=seed, train_rows=8, test_rows=4)]

    first = written("a", 5)
    assert first == written("b", 5)
    assert first[0] != written("c", 6)[0]


def test_seed_0_writes_the_rows_the_smoke_run_was_measured_on(tmp_path: Path) -> None:
    # prepare_smoke_assets reuses built assets whose fingerprint (shipped files, seed, library versions) matches: a
    # change to the generator that moves these rows must change that fingerprint too (BUILD_VERSION), or old data
    # would be reused silently.
    train, test = write_dataset(tmp_path, seed=0, train_rows=3, test_rows=2)
    assert [row["reward_model"]["ground_truth"] for row in _rows(train)] == ["44", "98", "13"]  # type: ignore[index]
    assert [row["reward_model"]["ground_truth"] for row in _rows(test)] == ["29", "81"]  # type: ignore[index]
    assert _problems_of(_rows(train))[0] == picture(Problem(97, "-", 53))
