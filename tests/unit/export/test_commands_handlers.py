"""`verify-export` and `export` as users call them: what the flags mean, which directory is checked, which
settings reach the export, and the exact output and exit code of each outcome (0/1 the report's, 2 cannot).

The check and the export themselves are replaced by stand-ins that record their arguments and return a
hand-made ExportReport (or raise): these tests pin the command layer in milliseconds. The real check runs
in test_commands_and_watch.py, the real export in tests/bridge.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from recipe.export import bridge_export, hf_check
from recipe.export.commands import (
    add_export_commands,
    allowed_patterns,
    run_export,
    run_verify_export,
)
from recipe.export.expected import ExportCheckError
from recipe.export.hf_check import DEFAULT_ALLOWED_PATTERNS
from recipe.export.report import ExportReport

DEFAULTS = list(DEFAULT_ALLOWED_PATTERNS)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_export_commands(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(list(argv))


def report(status: str = "complete", directory: str = "/out") -> ExportReport:
    missing = ["model.norm.weight"] if status == "broken" else []
    return ExportReport(
        directory, status, "Qwen3MoeForCausalLM", 2, 2 - len(missing), missing=missing
    )  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("flags", "patterns"),
    [
        ((), DEFAULTS),
        (("--allow", "^a$"), [*DEFAULTS, "^a$"]),
        (("--allow", "^a$", "--allow", "^b$"), [*DEFAULTS, "^a$", "^b$"]),
        (("--no-default-allow",), []),
        (("--no-default-allow", "--allow", "^a$"), ["^a$"]),
    ],
)
@pytest.mark.parametrize(
    "command", [("verify-export", "dir"), ("export", "--out", "o")]
)
def test_allowed_patterns_are_the_defaults_unless_refused_plus_each_allow(
    command: tuple[str, ...], flags: tuple[str, ...], patterns: list[str]
) -> None:
    assert allowed_patterns(parse(*command, *flags)) == patterns


def test_the_default_pattern_is_multi_token_prediction() -> None:
    # The one default: MTP layers, which HF loaders drop (docs/export.md); named in --no-default-allow's help.
    assert DEFAULTS == [r"^mtp\."]


@pytest.mark.parametrize(
    ("flags", "strict", "as_json"),
    [
        ((), None, False),
        (("--strict",), True, False),
        (("--lenient", "--json"), False, True),
    ],
)
def test_export_flags(
    flags: tuple[str, ...], strict: bool | None, as_json: bool
) -> None:
    args = parse("export", "--out", "o", *flags)
    assert (args.out, args.checkpoint_dir, args.model_path, args.strict, args.json) == (
        Path("o"),
        None,
        None,
        strict,
        as_json,
    )


@pytest.mark.parametrize(
    "argv",
    [
        ("export",),
        ("export", "--out", "o", "--strict", "--lenient"),
        ("verify-export",),
    ],
)
def test_export_needs_out_and_one_strictness_and_verify_needs_a_directory(
    argv: tuple[str, ...],
) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse(*argv)
    assert exit_.value.code == 2


def test_verify_export_flags() -> None:
    args = parse("verify-export", "d", "--reference", "r", "--json")
    assert (
        args.directory,
        args.reference,
        args.json,
        args.allow,
        args.no_default_allow,
    ) == (Path("d"), Path("r"), True, [], False)
    assert parse("verify-export", "d").reference is None


@pytest.fixture
def verified(
    monkeypatch: pytest.MonkeyPatch,
) -> list[tuple[Path, list[str], Path | None]]:
    """hf_check.verify_export replaced: records its call; a directory named 'bad' is broken, 'nothing' uncheckable."""
    calls: list[tuple[Path, list[str], Path | None]] = []

    def fake(
        directory: Path, patterns: Any, reference: Path | None = None
    ) -> ExportReport:
        calls.append((directory, list(patterns), reference))
        if directory.name == "nothing":
            raise ExportCheckError(f"{directory}: no config.json\u2028in it")
        return report(
            "broken" if directory.name == "bad" else "complete", str(directory)
        )

    monkeypatch.setattr(hf_check, "verify_export", fake)
    return calls


def hf_export(directory: Path, marker: str) -> Path:
    directory.mkdir(parents=True)
    (directory / marker).write_text("{}")
    return directory


@pytest.mark.parametrize("marker", ["config.json", "model-00001-of-00002.safetensors"])
def test_a_directory_holding_a_checkpoint_is_checked_itself(
    tmp_path: Path, verified: list, marker: str, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = hf_export(tmp_path / "hf", marker)
    # Even when a finished verl save lies below it, which a checkpoint tree would have picked.
    hf_export(
        directory / "global_step_9" / "actor" / "model" / "huggingface", "config.json"
    )
    (directory / "global_step_9" / "actor" / "ckpt_contents.json").write_text("{}")
    assert (
        run_verify_export(
            parse("verify-export", str(directory), "--reference", "ref", "--allow", "x")
        )
        == 0
    )
    assert verified == [(directory, [*DEFAULTS, "x"], Path("ref"))]
    assert (
        capsys.readouterr().out == report("complete", str(directory)).summary() + "\n"
    )


def test_a_checkpoint_tree_checks_its_newest_finished_export(
    tmp_path: Path, verified: list, capsys: pytest.CaptureFixture[str]
) -> None:
    for step, finished in ((1, True), (2, True), (3, False)):
        hf_export(
            tmp_path / f"global_step_{step}" / "actor" / "model" / "huggingface",
            "config.json",
        )
        if finished:
            (
                tmp_path / f"global_step_{step}" / "actor" / "ckpt_contents.json"
            ).write_text("{}")
    assert run_verify_export(parse("verify-export", str(tmp_path), "--json")) == 0
    assert verified == [
        (tmp_path / "global_step_2/actor/model/huggingface", DEFAULTS, None)
    ]
    assert json.loads(capsys.readouterr().out)["directory"] == str(
        tmp_path / "global_step_2/actor/model/huggingface"
    )


def test_a_directory_with_no_export_is_checked_as_given_so_the_error_names_it(
    tmp_path: Path, verified: list, capsys: pytest.CaptureFixture[str]
) -> None:
    nothing = tmp_path / "nothing"
    nothing.mkdir()
    assert run_verify_export(parse("verify-export", str(nothing))) == 2
    assert verified[0][0] == nothing
    out = capsys.readouterr()
    # One line: the U+2028 of a hostile path is escaped, never a second line.
    assert (out.out, out.err) == ("", f"error: {nothing}: no config.json\\u2028in it\n")


def test_an_uncheckable_directory_with_json_is_an_error_document(
    tmp_path: Path, verified: list, capsys: pytest.CaptureFixture[str]
) -> None:
    nothing = tmp_path / "nothing"
    assert run_verify_export(parse("verify-export", str(nothing), "--json")) == 2
    out = capsys.readouterr()
    assert json.loads(out.out) == {
        "schema_version": 1,
        "command": "verify-export",
        "status": "error",
        "exit_code": 2,
        "errors": [f"{nothing}: no config.json\\u2028in it"],
    }
    assert out.err == f"error: {nothing}: no config.json\\u2028in it\n"


def test_a_broken_export_exits_1_with_its_report(
    tmp_path: Path, verified: list, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = hf_export(tmp_path / "bad", "config.json")
    assert run_verify_export(parse("verify-export", str(bad), "--json")) == 1
    assert capsys.readouterr().out == report("broken", str(bad)).to_json() + "\n"


@pytest.fixture
def exported(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """bridge_export.export_latest replaced: records its arguments, prints as Megatron does, returns a report."""
    calls: list[dict[str, Any]] = []

    def fake(
        checkpoint_dir: Path,
        model_path: Path,
        out_dir: Path,
        strict: bool = False,
        allowed_patterns: Any = (),
    ) -> ExportReport:
        calls.append({"checkpoint_dir": checkpoint_dir, "model_path": model_path, "out": out_dir, "strict": strict,
                      "patterns": list(allowed_patterns)})  # fmt: skip
        print("> building GPT model ...")  # megatron-core's own print()
        if out_dir.name == "cannot":
            raise bridge_export.ExportError("no finished verl checkpoint\nsecond line")
        return report("broken" if out_dir.name == "bad" else "lenient", str(out_dir))

    monkeypatch.setattr(bridge_export, "export_latest", fake)
    return calls


@pytest.mark.parametrize(
    ("flags", "default_strict", "strict"),
    [
        ((), False, False),
        ((), True, True),
        (("--strict",), False, True),
        (("--lenient",), True, False),
    ],
)
def test_export_strictness_is_the_flag_else_the_setting(
    exported: list, flags: tuple[str, ...], default_strict: bool, strict: bool
) -> None:
    run_export(
        parse("export", "--out", "o", *flags), Path("ck"), Path("model"), default_strict
    )
    assert exported[0]["strict"] is strict


def test_export_paths_come_from_the_flags_else_the_settings(exported: list) -> None:
    run_export(parse("export", "--out", "o"), Path("ck"), Path("model"), False)
    run_export(
        parse(
            "export",
            "--out",
            "o",
            "--checkpoint-dir",
            "c2",
            "--model-path",
            "m2",
            "--no-default-allow",
        ),
        Path("ck"),
        Path("model"),
        False,
    )
    assert [
        (c["checkpoint_dir"], c["model_path"], c["out"], c["patterns"])
        for c in exported
    ] == [
        (Path("ck"), Path("model"), Path("o"), DEFAULTS),
        (Path("c2"), Path("m2"), Path("o"), []),
    ]


@pytest.mark.parametrize(("out", "code"), [("good", 0), ("bad", 1)])
def test_export_prints_the_report_alone_on_stdout_and_exits_with_its_code(
    exported: list, capsys: pytest.CaptureFixture[str], out: str, code: int
) -> None:
    assert (
        run_export(
            parse("export", "--out", out, "--json"), Path("ck"), Path("m"), False
        )
        == code
    )
    printed = capsys.readouterr()
    assert (
        printed.out
        == report("broken" if out == "bad" else "lenient", out).to_json() + "\n"
    )
    # Megatron's print() lines go to stderr, so that stdout stays one JSON document.
    assert printed.err == "> building GPT model ...\n"


def test_export_prints_the_summary_without_json(
    exported: list, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        run_export(parse("export", "--out", "good"), Path("ck"), Path("m"), False) == 0
    )
    assert capsys.readouterr().out == report("lenient", "good").summary() + "\n"


@pytest.mark.parametrize("as_json", [False, True])
def test_an_export_that_cannot_be_made_exits_2_with_one_error_line(
    exported: list, capsys: pytest.CaptureFixture[str], as_json: bool
) -> None:
    argv = ("export", "--out", "cannot", *(("--json",) if as_json else ()))
    assert run_export(parse(*argv), Path("ck"), Path("m"), False) == 2
    printed = capsys.readouterr()
    assert (
        printed.err
        == "> building GPT model ...\nerror: no finished verl checkpoint\\nsecond line\n"
    )
    if as_json:
        assert json.loads(printed.out) == {
            "schema_version": 1, "command": "export", "status": "error", "exit_code": 2,
            "errors": ["no finished verl checkpoint\\nsecond line"],
        }  # fmt: skip
    else:
        assert printed.out == ""


@pytest.mark.parametrize(
    ("layout", "said"),
    [
        ({"run-record.json": "{}"}, "no global_step_N below it holds one (actor/model/huggingface or actor/huggingface)"),
        ({"latest_checkpointed_iteration.txt": "3"}, "no global_step_N below it holds one"),
        ({"global_step_3/actor/dist_ckpt/x": ""}, "no global_step_N below it holds one"),
        ({"exp/global_step_3/actor/model/huggingface/config.json": "{}"},
         "step 3 has one that verl did not finish saving (no actor/ckpt_contents.json)"),
    ],
)
def test_a_checkpoint_root_with_no_finished_export_is_named_as_one(
    tmp_path: Path, verified: list, capsys: pytest.CaptureFixture[str], layout: dict[str, str], said: str
) -> None:
    """Issue 43: a run's root before its first finished save said "no config.json"; it says what it is and what to give."""
    for name, text in layout.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert run_verify_export(parse("verify-export", str(tmp_path))) == 2
    assert verified == []  # refused before any check
    error = capsys.readouterr().err
    assert error.startswith(f"error: {tmp_path}: a checkpoint root with no finished HF export: {said}"), error
    # The way out names the path shape verl 0.9.1 writes, the one the watcher looks in first.
    assert error.rstrip().endswith("give verify-export a finished step's export, global_step_N/actor/model/huggingface")
