"""The JSON-safe writer's text: dumps_json_safe's string and dump_json_safe's file and stream, exactly as
written (indent 2 by default, sorted keys, non-ASCII kept as is), and the warnings each logs."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import pytest

from recipe.export.jsonsafe import dump_json_safe, dumps_json_safe

VALUE = {"name": "Qwen3.5 – ĉu", "b": [1, None], "a": 2.5}
INDENTED = '{\n  "a": 2.5,\n  "b": [\n    1,\n    null\n  ],\n  "name": "Qwen3.5 – ĉu"\n}'
ONE_LINE = '{"a": 2.5, "b": [1, null], "name": "Qwen3.5 – ĉu"}'
LOSSY = {"z": 1, "obj": object(), "inf": float("inf")}
LOSSY_TEXT = '{\n  "inf": "inf",\n  "obj": "<object object>",\n  "z": 1\n}'
WARNING = "JSON-safe config: .obj: builtins.object is not JSON; wrote its repr"


def messages(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "recipe.export.jsonsafe"]


def test_dumps_text_is_indented_sorted_and_keeps_non_ascii() -> None:
    assert dumps_json_safe(VALUE) == INDENTED
    assert dumps_json_safe(VALUE, indent=None) == ONE_LINE
    assert dumps_json_safe(VALUE, indent=4).startswith('{\n    "a": 2.5,')


def test_dumps_logs_each_warning_unless_told_not_to(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="recipe.export.jsonsafe"):
        assert dumps_json_safe(LOSSY) == LOSSY_TEXT
    assert messages(caplog) == [(logging.WARNING, WARNING)]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="recipe.export.jsonsafe"):
        assert dumps_json_safe(LOSSY, warn=False) == LOSSY_TEXT
    assert messages(caplog) == []


def test_dump_to_path_writes_the_same_text_in_utf8(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    target = tmp_path / "transformer_config.json"
    with caplog.at_level(logging.WARNING, logger="recipe.export.jsonsafe"):
        assert dump_json_safe(VALUE, target) == []
        assert target.read_bytes() == INDENTED.encode("utf-8")
        notes = dump_json_safe(LOSSY, str(target))
    assert target.read_text(encoding="utf-8") == LOSSY_TEXT
    assert notes == [".obj: builtins.object is not JSON; wrote its repr"]
    assert messages(caplog) == [(logging.WARNING, WARNING)]
    dump_json_safe(VALUE, target, indent=None)
    assert target.read_text(encoding="utf-8") == ONE_LINE


def test_dump_to_stream_writes_the_same_text(caplog: pytest.LogCaptureFixture) -> None:
    stream = io.StringIO()
    with caplog.at_level(logging.WARNING, logger="recipe.export.jsonsafe"):
        notes = dump_json_safe(LOSSY, stream)
    assert stream.getvalue() == LOSSY_TEXT
    assert notes == [".obj: builtins.object is not JSON; wrote its repr"]
    assert messages(caplog) == [(logging.WARNING, WARNING)]
    stream = io.StringIO()
    assert dump_json_safe(VALUE, stream) == []
    assert stream.getvalue() == INDENTED
