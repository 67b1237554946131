"""The export report as people and programs read it: its summary lines, its JSON, and printable()."""

from __future__ import annotations

import json
import re

from hypothesis import given, strategies as st

from recipe.export.report import ExportReport, ShapeMismatch, printable

#: printable()'s escapes, decoded by a reader of our own (not by the function's own means).
_ESCAPE = re.compile(r"\\(x[0-9a-f]{2}|u[0-9a-f]{4}|U[0-9a-f]{8}|[ntr])")
_SIMPLE = {"n": "\n", "t": "\t", "r": "\r"}


def _unescaped(text: str) -> str:
    return _ESCAPE.sub(lambda m: _SIMPLE.get(m.group(1)) or chr(int(m.group(1)[1:], 16)), text)


@given(text=st.text(st.characters(blacklist_characters="\\"), max_size=40))
def test_printable_is_one_line_that_reads_back_to_the_text(text: str) -> None:
    shown = printable(text)
    assert shown.isprintable() and "\n" not in shown
    assert _unescaped(shown) == text
    if text.isprintable():
        assert shown == text


def _report(**lists: list) -> ExportReport:
    return ExportReport(directory="/ck/hf", status="broken", architecture="Qwen3_5MoeForConditionalGeneration",
                        expected_count=10, present_count=9, **lists)  # fmt: skip


def test_the_summary_names_every_kind_of_difference_with_its_tensors() -> None:
    report = _report(
        errors=["e1"], critical=["c1"], missing=["m1"], shape_mismatches=[ShapeMismatch("s1", [2, 3], [3, 2])],
        ghosts=["g1"], unindexed=["u1"], unexpected=["x1"], dropped=["d1"], allowed=["a1 (^a)"], reference="/ck/ref",
    )  # fmt: skip
    assert report.summary().splitlines() == [
        "HF export /ck/hf: BROKEN (9 tensors present, 10 expected by Qwen3_5MoeForConditionalGeneration)",
        "  compared with reference checkpoint /ck/ref",
        "  errors (1):", "    - e1",
        "  critical (1):", "    - c1",
        "  missing (expected by the model class, in no shard) (1):", "    - m1",
        "  shape mismatches (1):", "    - s1: expected [2, 3], found [3, 2]",
        "  ghosts (listed in the index, not in the shard it names) (1):", "    - g1",
        "  unindexed (in a shard, not in the index: loaders skip them) (1):", "    - u1",
        "  unexpected (in a shard, not expected by the model class) (1):", "    - x1",
        "  dropped (in the reference checkpoint, not in the export) (1):", "    - d1",
        "  allowed differences (1):", "    - a1 (^a)",
        "  NOT usable as a Hugging Face checkpoint: fix the export (see above)",
    ]  # fmt: skip


def test_a_long_list_is_cut_at_the_limit_and_says_how_many_more() -> None:
    at_limit = _report(missing=[f"t{i}" for i in range(3)]).summary(limit=3).splitlines()
    assert "    - t2" in at_limit and not any("more" in line for line in at_limit)
    past = _report(missing=[f"t{i}" for i in range(5)]).summary(limit=3).splitlines()
    assert "    - t2" in past and "    - t3" not in past and "    ... and 2 more (see --json)" in past


def test_the_summary_of_complete_and_lenient_exports_says_they_are_usable() -> None:
    complete = ExportReport("/ck/hf", "complete", "A", 1, 1).summary().splitlines()
    assert complete[-1] == "  every expected tensor is present with the expected shape"
    lenient = ExportReport("/ck/hf", "lenient", "A", 2, 1, allowed=["x (^x)"]).summary().splitlines()
    assert lenient[-1] == "  usable: every difference is allowed"


def test_hostile_names_stay_one_line_each_in_the_summary() -> None:
    lines = _report(missing=["a\nHF export /x: COMPLETE", "b\x1b[2J"]).summary().splitlines()
    assert "    - a\\nHF export /x: COMPLETE" in lines and "    - b\\x1b[2J" in lines


def test_the_json_is_every_field_with_sorted_keys_and_two_space_indent() -> None:
    report = _report(shape_mismatches=[ShapeMismatch("s1", [2], [3])])
    text = report.to_json()
    assert text == json.dumps(json.loads(text), indent=2, sort_keys=True)
    assert json.loads(text)["shape_mismatches"] == [{"name": "s1", "expected": [2], "actual": [3]}]
    assert report.exit_code == 1 and ExportReport("/d", "lenient", "A", 1, 1).exit_code == 0


def test_in_a_name_with_an_unprintable_character_the_printable_others_stay_as_they_are() -> None:
    """Only the unprintable characters are escaped: accented letters, CJK and quotes of the same name are kept."""
    assert printable("experts.naïve\n模型.'w'") == "experts.naïve\\n模型.'w'"


def test_the_summary_lists_twenty_tensors_of_a_kind_by_default() -> None:
    lines = _report(missing=[f"t{i}" for i in range(21)]).summary().splitlines()
    assert "    - t19" in lines and "    - t20" not in lines and "    ... and 1 more (see --json)" in lines
