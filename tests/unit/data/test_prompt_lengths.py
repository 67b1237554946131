"""Prompt lengths with image tokens: the arithmetic of the report, and `run`'s warning from the manifest it reads back
(hostile: any bytes are an answer or a reason, never a traceback). The count itself needs the model's processor and
torchvision: tests/e2e/test_image_data.py checks it against verl's own filter."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from recipe.data.prompt_lengths import PromptLengths, RowLength, verl_messages
from recipe.run.prompt_budget import prompt_budget_warning, recorded_lengths


def lengths(*tokens: int) -> PromptLengths:
    return PromptLengths.of(RowLength(n, 0) for n in tokens)


def test_messages_are_verls_image_items_in_place_of_each_placeholder() -> None:
    prompt = [{"role": "user", "content": "<image>Find x.<image> Both."}]
    assert verl_messages(prompt, 2) == [{"role": "user", "content": [
        {"type": "image"}, {"type": "text", "text": "Find x."}, {"type": "image"}, {"type": "text", "text": " Both."},
    ]}]  # fmt: skip
    assert verl_messages(prompt, 0) == prompt  # a text row keeps its string, as verl leaves it


def test_percentiles_drops_and_the_line_people_read() -> None:
    counted = PromptLengths.of([RowLength(300, 4), RowLength(100, 0), RowLength(200, 64), RowLength(400, 4)])
    assert counted.tokens == (100, 200, 300, 400)
    assert (counted.percentile(0.5), counted.percentile(0.99), counted.percentile(0.75)) == (200, 400, 300)
    assert [counted.dropped_by(n) for n in (99, 100, 250, 400)] == [4, 3, 2, 0]
    assert counted.describe() == (
        "4 prompts: min 100, median 200, p99 400, max 400 tokens "
        "(text and images; image tokens per prompt: mean 18, max 64)"
    )
    assert lengths().describe() == "no prompts" and lengths().percentile(0.99) == 0


@given(st.lists(st.integers(0, 5000), min_size=1, max_size=300))
def test_the_suggested_length_keeps_at_least_99_percent_and_is_one_of_the_lengths(tokens: list[int]) -> None:
    counted = lengths(*tokens)
    keep = counted.percentile(0.99)
    assert keep in tokens
    assert counted.dropped_by(keep) <= 0.01 * len(tokens)
    # The smallest such length: one token less drops more than 1 %, or nothing is shorter.
    shorter = [n for n in tokens if n < keep]
    assert not shorter or counted.dropped_by(max(shorter)) > 0.01 * len(tokens)


def test_the_warning_names_the_limit_the_share_and_the_length_that_keeps_99_percent() -> None:
    counted = lengths(*([500] * 97), 1100, 1200, 1300)
    assert prompt_budget_warning(counted, 1300) is None
    assert prompt_budget_warning(lengths(*([500] * 99), 1300), 1024) is None  # 1 % dropped: not more than 1 %
    assert prompt_budget_warning(counted, 1024) == (
        "data.max_prompt_length=1024: verl will drop 3 of the 100 training rows (3.0 %) as too long, without a word "
        "(their prompts, counted with their images by prepare-data, are longer); 1200 keeps 99 %: "
        "`data.max_prompt_length=1200` (in OVERRIDES, or after `--` of plan and run); plan shows what it costs in memory"
    )


# --- the manifest `run` reads back ---------------------------------------------------------------------------------


def manifest(folder: Path, tokens: Any, rows: bytes = b"rows", sha: str | None = None) -> Path:
    """train.parquet (stand-in bytes) and a manifest.json as prepare-data writes it, with `tokens` as the lengths."""
    import hashlib

    train = folder / "train.parquet"
    train.write_bytes(rows)
    record = {
        "dataset": "geo3k",
        "files": {"train": {"file": "train.parquet", "rows": 3, "sha256": sha or hashlib.sha256(rows).hexdigest()}},
        "prompt_tokens": {"train": {"rows": 3, "tokens": tokens}},
    }
    (folder / "manifest.json").write_text(json.dumps(record))
    return train


def test_a_manifest_for_this_file_gives_its_lengths(tmp_path: Path) -> None:
    assert recorded_lengths(manifest(tmp_path, [3, 1, 2])) == lengths(1, 2, 3)


@pytest.mark.parametrize(
    ("tokens", "sha", "reason"),
    [
        ([1, 2], "0" * 64, "describes another train.parquet (its sha256 differs): run prepare-data again"),
        ([1, "2"], None, "prompt_tokens.train.tokens is not a list of token counts"),
        ([1, -2], None, "prompt_tokens.train.tokens is not a list of token counts"),
        ([1, True], None, "prompt_tokens.train.tokens is not a list of token counts"),
        ([1, 2.0], None, "prompt_tokens.train.tokens is not a list of token counts"),
        ({"a": 1}, None, "prompt_tokens.train.tokens is not a list of token counts"),
    ],
)
def test_a_manifest_that_does_not_hold_for_this_file_is_a_reason(
    tmp_path: Path, tokens: Any, sha: str | None, reason: str
) -> None:
    answer = recorded_lengths(manifest(tmp_path, tokens, sha=sha))
    assert isinstance(answer, str) and answer.endswith(reason)


@pytest.mark.parametrize(
    ("drop", "reason"),
    [
        (("files", "train", "sha256"), "files.train names no sha256 of train.parquet: run prepare-data again"),
        (("files", "train", "file"), "names no file train.parquet"),
        (("files",), "names no file train.parquet"),
        (("prompt_tokens", "train", "tokens"), "prompt_tokens.train.tokens is not a list of token counts"),
        (("prompt_tokens", "train"), "prompt_tokens.train.tokens is not a list of token counts"),
        (("prompt_tokens",), "prompt_tokens.train.tokens is not a list of token counts"),
    ],
)
def test_a_manifest_with_a_field_missing_is_a_reason_naming_it(tmp_path: Path, drop: tuple[str, ...],
                                                               reason: str) -> None:
    """Issue 52: fields missing, not wrong (a manifest of another version, or edited by hand)."""
    train = manifest(tmp_path, [1, 2])
    record = json.loads((tmp_path / "manifest.json").read_text())
    parent = record
    for key in drop[:-1]:
        parent = parent[key]
    del parent[drop[-1]]
    (tmp_path / "manifest.json").write_text(json.dumps(record))
    answer = recorded_lengths(train)
    assert isinstance(answer, str) and answer.endswith(reason), answer


@pytest.mark.parametrize(
    ("content", "reason"),
    [(b"[" * 100_000 + b"]" * 100_000, "unreadable (nested too deep to be read)"),
     (b"\xff\xfe{", "unreadable (not UTF-8 text (byte 0))"),
     (b"{", "unreadable (not JSON (Expecting property name enclosed in double quotes, line 1 column 2))"),
     (b"[1, 2]", "names no file train.parquet")],
)  # fmt: skip
def test_a_manifest_that_is_no_json_document_of_ours_is_a_reason(tmp_path: Path, content: bytes, reason: str) -> None:
    train = tmp_path / "train.parquet"
    train.write_bytes(b"x")
    (tmp_path / "manifest.json").write_bytes(content)
    assert recorded_lengths(train) == f"{tmp_path / 'manifest.json'}: {reason}"


def test_no_manifest_and_a_text_count_are_reasons(tmp_path: Path) -> None:
    train = tmp_path / "train.parquet"
    train.write_bytes(b"x")
    assert recorded_lengths(train) == f"no manifest.json beside {train} (prepare-data writes one)"
    (tmp_path / "manifest.json").write_text(json.dumps(
        {"files": {"train": {"file": "train.parquet"}}, "prompt_tokens": "not counted: no model at MODEL_PATH=/m"}
    ))  # fmt: skip
    assert recorded_lengths(train) == "prepare-data did not count the prompts (not counted: no model at MODEL_PATH=/m)"


@given(st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_any_manifest_bytes_are_lengths_or_a_reason(content: bytes) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        train = Path(scratch) / "train.parquet"
        train.write_bytes(b"x")
        (Path(scratch) / "manifest.json").write_bytes(content)
        assert isinstance(recorded_lengths(train), PromptLengths | str)


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                    max_leaves=12))  # fmt: skip
def test_any_json_document_is_lengths_or_a_reason(document: Any) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        train = Path(scratch) / "train.parquet"
        train.write_bytes(b"x")
        (Path(scratch) / "manifest.json").write_text(json.dumps(document))
        assert isinstance(recorded_lengths(train), str)  # never prepare-data's shape by chance


@pytest.mark.parametrize(("tokens", "counted"), [([0, 2**31 - 1], True), ([1, 2**31], False)],
                         ids=["0-and-the-largest-int32", "past-int32"])  # fmt: skip
def test_a_token_count_is_a_whole_number_from_0_below_2_to_the_31(tmp_path: Path, tokens: list[int], counted: bool) -> None:
    """The bounds themselves: an empty prompt counts 0 tokens; a count past a signed 32-bit integer is none of
    prepare-data's."""
    answer = recorded_lengths(manifest(tmp_path, tokens))
    assert answer == (lengths(*tokens) if counted else
                      f"{tmp_path / 'manifest.json'}: prompt_tokens.train.tokens is not a list of token counts")  # fmt: skip


def test_each_reason_names_the_manifest_and_the_field_in_full(tmp_path: Path) -> None:
    """The whole line a user reads, not only its end: which manifest, which field, what to do."""
    where = tmp_path / "manifest.json"
    train = manifest(tmp_path, [1, 2], sha="0" * 64)
    assert recorded_lengths(train) == (f"{where} describes another train.parquet (its sha256 differs): run "
                                       "prepare-data again")  # fmt: skip
    record = json.loads(where.read_text())
    del record["files"]["train"]["sha256"]
    where.write_text(json.dumps(record))
    assert recorded_lengths(train) == f"{where}: files.train names no sha256 of train.parquet: run prepare-data again"
    record["files"]["train"] = "train.parquet"  # an entry that is no mapping names no file
    where.write_text(json.dumps(record))
    assert recorded_lengths(train) == f"{where}: names no file train.parquet"
    where.write_text(json.dumps({"files": [], "prompt_tokens": {}}))
    assert recorded_lengths(train) == f"{where}: names no file train.parquet"


def test_a_training_file_that_cannot_be_hashed_is_a_reason(tmp_path: Path) -> None:
    """The manifest names train.parquet, but that name is a folder: nothing ties the lengths to it."""
    train = manifest(tmp_path, [1, 2])
    train.unlink()
    train.mkdir()
    assert recorded_lengths(train) == f"{train}: cannot be hashed (FileRefused)"


def test_no_rows_no_warning_and_the_share_is_said_with_one_decimal() -> None:
    assert prompt_budget_warning(lengths(), 0) is None
    warning = prompt_budget_warning(lengths(*([10] * 985), *([20] * 15)), 10)
    assert warning is not None and warning.startswith(
        "data.max_prompt_length=10: verl will drop 15 of the 1000 training rows (1.5 %) as too long")
    assert "; 20 keeps 99 %: " in warning
    half = prompt_budget_warning(lengths(10, 10, 20, 20), 10)
    assert half is not None and "drop 2 of the 4 training rows (50.0 %)" in half
