"""The smoke dataset's generator by direct calls: the ranges of its questions, the exact files, their
reproducibility from the seed, and train and test never sharing a question."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.needs import needs

from recipe.smoke.arithmetic import Problem, problems, write_dataset

pa = needs("pyarrow", install="needs pyarrow (the trainer extra)")
import pyarrow.parquet as pq  # noqa: E402


@pytest.mark.parametrize(
    ("problem", "question", "solution"),
    [
        (Problem(12, "+", 7), "What is 12 + 7?", "12 + 7 = 19\n#### 19"),
        (Problem(40, "-", 15), "What is 40 - 15?", "40 - 15 = 25\n#### 25"),
        (Problem(6, "*", 7), "What is 6 * 7?", "6 * 7 = 42\n#### 42"),
    ],
)
def test_each_operator_asks_and_answers_in_gsm8k_form(problem: Problem, question: str, solution: str) -> None:
    assert (problem.question, problem.solution) == (question, solution)


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
    assert pq.read_schema(train).names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    schema = pq.read_schema(train)
    assert schema.field("prompt").type == pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
    assert schema.field("reward_model").type == pa.struct([("style", pa.string()), ("ground_truth", pa.string())])
    assert schema.field("extra_info").type == pa.struct(
        [("split", pa.string()), ("index", pa.int64()), ("answer", pa.string()), ("question", pa.string())]
    )


def test_no_question_repeats_within_or_across_splits(tmp_path: Path) -> None:
    # More rows than one draw tends to give unique questions: the generator draws again until it has enough.
    train, test = write_dataset(tmp_path, seed=1, train_rows=300, test_rows=100)
    questions = [row["extra_info"]["question"] for path in (train, test) for row in _rows(path)]  # type: ignore[index]
    assert len(questions) == len(set(questions)) == 400


def test_the_same_seed_writes_the_same_rows_and_another_seed_others(tmp_path: Path) -> None:
    def written(name: str, seed: int) -> list[list[dict[str, object]]]:
        folder = tmp_path / name
        folder.mkdir()
        return [_rows(path) for path in write_dataset(folder, seed=seed, train_rows=8, test_rows=4)]

    first = written("a", 5)
    assert first == written("b", 5)
    assert first != written("c", 6)


def test_seed_0_writes_the_rows_the_smoke_run_was_measured_on(tmp_path: Path) -> None:
    # prepare_smoke_assets reuses built assets whose fingerprint (shipped files, seed) matches: a change to the
    # generator that moves these rows must change that fingerprint too, or old data would be reused silently.
    train, test = write_dataset(tmp_path, seed=0, train_rows=3, test_rows=2)
    assert [row["extra_info"]["question"] for row in _rows(train)] == [  # type: ignore[index]
        "What is 97 - 53?", "What is 33 + 65?", "What is 51 - 38?"
    ]
    assert [row["extra_info"]["question"] for row in _rows(test)] == ["What is 74 - 45?", "What is 64 + 17?"]  # type: ignore[index]
