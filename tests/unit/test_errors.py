"""How a refusal reaches the user: one `error:` line per problem, each printable and bounded, and with
--json one document on stdout that a script can read alone."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from recipe.errors import MAX_LINE, RecipeConfigError, one_line, report_errors


def test_the_error_keeps_every_problem_and_reads_as_them_one_per_line() -> None:
    problems = ["TP=3: must divide the model's 16 attention heads", "EP=6: must divide the model's 256 experts"]
    error = RecipeConfigError(problems)
    problems.append("appended later")  # the error keeps its own copy
    assert error.problems == problems[:2]
    assert str(error) == "TP=3: must divide the model's 16 attention heads\nEP=6: must divide the model's 256 experts"


@pytest.mark.parametrize(
    ("length", "shown_length", "more"),
    [(MAX_LINE - 1, MAX_LINE - 1, None), (MAX_LINE, MAX_LINE, None), (MAX_LINE + 1, MAX_LINE - 40, 41), (10**6, MAX_LINE - 40, 10**6 - MAX_LINE + 40)],
)
def test_a_line_is_cut_only_past_the_limit_and_says_how_much_is_left(length: int, shown_length: int, more: int | None) -> None:
    line = one_line("x" * length)
    if more is None:
        assert line == "x" * length
    else:
        # The kept part plus what is cut adds up to the whole value: nothing is lost silently.
        assert line == "x" * shown_length + f"... ({more} more characters)"
        assert shown_length + more == length
        assert len(line) <= MAX_LINE


@given(st.text(max_size=3 * MAX_LINE))
def test_any_text_becomes_one_printable_line_within_the_limit(text: str) -> None:
    line = one_line(text)
    assert line.isprintable() and len(line) <= MAX_LINE


def test_a_forged_line_is_escaped_not_printed() -> None:
    assert one_line("EP=6\nerror: all good\x1b[2K") == "EP=6\\nerror: all good\\x1b[2K"


def test_errors_go_to_stderr_one_line_each_and_stdout_stays_empty_without_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert report_errors("plan", ["TP=3: bad", "PP=0: bad\nforged"], 2, as_json=False) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", "error: TP=3: bad\nerror: PP=0: bad\\nforged\n")


def test_with_json_a_failure_is_one_indented_document_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    assert report_errors("doctor", ["x" * (MAX_LINE + 5), "NNODES=0: bad"], 3, as_json=True) == 3
    out, err = capsys.readouterr()
    document = json.loads(out)
    assert document == {
        "schema_version": 1,
        "command": "doctor",
        "status": "error",
        "exit_code": 3,
        "errors": [one_line("x" * (MAX_LINE + 5)), "NNODES=0: bad"],
    }
    # The same two lines on stderr, for a person watching; the document is indented for them too.
    assert err.splitlines() == [f"error: {line}" for line in document["errors"]]
    assert out == json.dumps(document, indent=2) + "\n"
