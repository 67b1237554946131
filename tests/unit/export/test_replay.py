"""`replay RECORD [--format shell|env-file]`: the exact files it prints, the exact lines it writes on stderr, its exit codes.

What a user relies on, by direct calls (no subprocess, no verl config) so that each case is fast:
- stdout is one file for one reader (docs/reproducibility.md, "Replaying a run record"): a comment naming
  the record, a comment naming the file's reader, one `NAME=value` line per replayable setting in
  name order (never a secret, never ALLOW_DRIFT, never a key the settings model does not name), and
  the extra overrides as one shell-quoted comment; comments are one line, cut at 4,096 characters;
- a plain value (letters, digits and `_ . / : , @ % + = -`) is the same line in both files; in the
  shell file (the default) any other is single-quoted, `'\''` for a quote; in the env-file it is
  written as it is, unless it holds a newline, ends in a carriage return or is longer than 4,096
  characters: then it is a comment naming the setting, and one `replay:` line on stderr;
- stdout is UTF-8 whatever the locale;
- a setting that is no scalar, or a RECORD that is not a run record, is exit 2 with one line;
- each input that changed since the record (recipe version, frameworks, the model's files, the
  data files) is one `replay: FIELD changed since the record: ... then, ... now` line on stderr,
  and each that was not compared says why; only files the record's owner could read are compared
  (its own or everyone's, behind folders it can search).
test_replay_hostile.py runs the written values through the real readers (bash, dash, Compose, docker).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import shutil
import string
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from recipe import __version__
from recipe.provenance import installed_versions
from recipe.record_file import RECORD_NAME, SCHEMA_VERSION
from recipe.replay import Replayed, add_replay_parser, comparable, replay_lines, run_replay
from recipe.replay_files import ENV_FILE, FORMATS, SHELL, UnwritableRecord, setting_line

#: A user id that owns nothing here: a record "of another user" (chown needs root).
OTHER_UID = 4242
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user (chown) needs root")

#: The characters docs/reproducibility.md promises are written as they are in both files: the oracle, typed from the docs.
DOCUMENTED_PLAIN = string.ascii_letters + string.digits + "_./:,@%+=-"
#: The longest value the env-file holds, and where a comment is cut (docker's reader stops at a 64 KiB line).
MAX_LINE = 4096
#: The second line of each file: which reader it is for.
READER_LINES = {
    SHELL: "# for bash and dash: `set -a; . ./replay.sh; set +a`",
    ENV_FILE: "# for `docker run --env-file`, or Compose's `env_file:` with `format: raw`; never for a shell nor .env",
}
#: The end of an env-file's comment for a value it leaves out.
SHELL_WRITES_IT = "; `replay --format shell` writes it"
NEWLINE = "its value holds a newline, which ends a line for docker's and Compose's readers"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write_record(directory: Path, **fields: Any) -> Path:
    """A run-record.json holding these provenance fields (and the schema version), as `run` stores one."""
    path = directory / RECORD_NAME
    path.write_text(json.dumps({"provenance": {"schema_version": SCHEMA_VERSION, **fields}}))
    return path


def _replay(record: Path, now: dict[str, Any] | None = None, form: str = SHELL) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `replay --format FORM RECORD`; NOW None compares with the inputs as they are."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run_replay(argparse.Namespace(record=record, format=form), now=now)
    return code, out.getvalue(), err.getvalue()


def _header(path: Path, version: object, form: str = SHELL) -> list[str]:
    """The two comment lines every file starts with."""
    return [f"# settings of the run recorded in {path} (recipe {version})", READER_LINES[form]]


def _file(path: Path, version: object, *lines: str, form: str = SHELL) -> str:
    """stdout of replay: the header, then LINES."""
    return "\n".join([*_header(path, version, form), *lines]) + "\n"


# --- the command line -------------------------------------------------------------------------


def test_replay_takes_one_record_path_and_a_format_and_documents_its_exit_codes() -> None:
    parser = argparse.ArgumentParser(prog="entrypoint.py")
    commands = parser.add_subparsers(dest="command")
    add_replay_parser(commands)
    args = parser.parse_args(["replay", "/checkpoints/p/e/global_step_40"])
    assert (args.command, args.record, args.format) == ("replay", Path("/checkpoints/p/e/global_step_40"), SHELL)
    assert parser.parse_args(["replay", "--format", "env-file", "r"]).format == ENV_FILE
    help_text = commands.choices["replay"].format_help()
    assert "exit codes:\n  0  printed" in help_text and "\n  2  RECORD is not a readable run record" in help_text
    assert "usage: entrypoint.py replay [-h] [--format {shell,env-file}] RECORD" in help_text


#: `replay --help`, word for word: what it reads and prints, which reader each format is for, its exit codes.
REPLAY_HELP = (
    "usage: entrypoint.py replay [-h] [--format {shell,env-file}] RECORD "
    "Read RECORD (a run-record.json that `run` wrote to the checkpoint root or a global_step_N, or the directory "
    "holding one) and print its settings, secrets never included, as a file for one reader, so that `plan` with "
    "them gives the record's trainer command; the extra overrides it ran with follow as a comment. Each value is "
    "written so that its reader gets it back exactly; a value the env-file cannot hold (a newline) is left out of "
    "it as a comment naming the setting, and said on stderr. Then compare the inputs the record names (data files, "
    "the model's files, the framework versions) with what is there now: one `replay:` line on stderr for each that "
    "changed. "
    "positional arguments: RECORD "
    "options: -h, --help show this help message and exit --format {shell,env-file} "
    "the reader the file is for: shell (the default) for bash and dash: `set -a; . ./replay.sh; set +a`; "
    "env-file for `docker run --env-file`, or Compose's `env_file:` with `format: raw`; never for a shell nor .env "
    "exit codes: 0 printed (changes and values left out, if any, on stderr) 2 RECORD is not a readable run record "
    "example: entrypoint.py replay /checkpoints/p/e/global_step_40 > replay.sh "
    "entrypoint.py replay --format env-file /checkpoints/p/e/global_step_40 > replay.env"
)


def test_the_help_says_word_for_word_what_replay_reads_and_prints(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # no wrap: argparse would break `env-file` at its hyphen
    parser = argparse.ArgumentParser(prog="entrypoint.py")
    commands = parser.add_subparsers(dest="command")
    add_replay_parser(commands)
    assert " ".join(commands.choices["replay"].format_help().split()) == REPLAY_HELP
    # The command list of `entrypoint.py --help`.
    listed = "replay print a stored run record's settings as a shell file or an env-file, and which inputs changed since"
    assert listed in " ".join(parser.format_help().split())


def test_an_unknown_format_is_refused_by_the_parser() -> None:
    parser = argparse.ArgumentParser(prog="entrypoint.py")
    add_replay_parser(parser.add_subparsers(dest="command"))
    with pytest.raises(SystemExit) as refused, contextlib.redirect_stderr(io.StringIO()):
        parser.parse_args(["replay", "--format", "dotenv", "r"])
    assert refused.value.code == 2


# --- one setting, one line ----------------------------------------------------------------------


@pytest.mark.parametrize("form", FORMATS)
@pytest.mark.parametrize(
    ("value", "line"),
    [
        (True, "X=true"),  # what pydantic reads back as True, not Python's "True"
        (False, "X=false"),
        (0, "X=0"),
        (40, "X=40"),
        (-3, "X=-3"),
        (0.5, "X=0.5"),
        ("", "X="),
        ("/data/gsm8k/train.parquet", "X=/data/gsm8k/train.parquet"),
        ("ray://head:6379", "X=ray://head:6379"),
        ("a" * MAX_LINE, "X=" + "a" * MAX_LINE),  # the longest value the env-file holds
    ],
)  # fmt: skip
def test_a_plain_value_is_the_same_line_in_both_files(value: object, line: str, form: str) -> None:
    assert setting_line("X", value, form) == (line, None)


@given(value=st.text(DOCUMENTED_PLAIN, max_size=40), form=st.sampled_from(FORMATS))
def test_every_value_of_the_documented_characters_is_written_as_it_is(value: str, form: str) -> None:
    assert setting_line("EXPERIMENT_NAME", value, form) == (f"EXPERIMENT_NAME={value}", None)


@pytest.mark.parametrize(
    ("value", "shell", "env_file"),
    [
        ("/models/My Model", "X='/models/My Model'", "X=/models/My Model"),
        ("bob's run", "X='bob'\\''s run'", "X=bob's run"),  # close the quote, an escaped quote, reopen
        ("'", "X=''\\'''", "X='"),
        ('"x"', "X='\"x\"'", 'X="x"'),
        ("$HOME ${X}", "X='$HOME ${X}'", "X=$HOME ${X}"),
        ("$(touch x) `touch x`", "X='$(touch x) `touch x`'", "X=$(touch x) `touch x`"),
        ("~/x", "X='~/x'", "X=~/x"),  # bash expands a tilde after `=`
        ("#x", "X='#x'", "X=#x"),
        ("é", "X='é'", "X=é"),  # a letter, but not one of the plain ASCII ones
        ("a\rb", "X='a\rb'", "X=a\rb"),  # a carriage return inside a line: docker keeps it
        (" a ", "X=' a '", "X= a "),  # docker and Compose's raw reader keep the blanks
    ],
)  # fmt: skip
def test_any_other_value_is_single_quoted_for_the_shells_and_as_it_is_in_the_env_file(
    value: str, shell: str, env_file: str
) -> None:
    assert setting_line("X", value, SHELL) == (shell, None)
    assert setting_line("X", value, ENV_FILE) == (env_file, None)


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("a\nb", NEWLINE),
        ("a\n", NEWLINE),
        ("a\r", "its value ends in a carriage return, which docker's and Compose's line reader drops"),
        ("é" * (MAX_LINE + 1), (f"its value has {MAX_LINE + 1} characters, more than {MAX_LINE} (docker's reader stops "
                                "at a 64 KiB line)")),
    ],
)  # fmt: skip
def test_a_value_the_env_file_cannot_hold_is_a_comment_there_and_whole_in_the_shell_file(value: str, why: str) -> None:
    note = f"X left out of the env-file: {why}{SHELL_WRITES_IT}"
    assert setting_line("X", value, ENV_FILE) == (f"# {note}", note)
    assert setting_line("X", value, SHELL) == ("X='" + value + "'", None)


@pytest.mark.parametrize("form", FORMATS)
@pytest.mark.parametrize(
    ("value", "message"),
    [([1], "X: a list in the record, not a setting's value"), ({"a": 1}, "X: a dict in the record, not a setting's value")],
)
def test_a_value_that_is_no_scalar_is_refused_with_one_exact_line(value: object, message: str, form: str) -> None:
    with pytest.raises(UnwritableRecord) as refused:
        setting_line("X", value, form)
    assert str(refused.value) == message


# --- the file ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("form", FORMATS)
def test_the_file_holds_each_replayable_setting_in_name_order_after_the_header(tmp_path: Path, form: str) -> None:
    settings = {
        "TRAIN_BATCH_SIZE": 8, "SEED": 3, "EXPORT_STRICT": False, "EXPERIMENT_NAME": "e", "MODEL_PATH": None,
        "HF_TOKEN": "**********", "WANDB_API_KEY": "**********", "RAY_AUTH_TOKEN": "**********",
        "ALLOW_DRIFT": "TRAIN_FILES", "PATH": "/evil", "LD_PRELOAD": "/x.so", "": "blank",
    }  # fmt: skip
    replayed = replay_lines({"settings": settings, "extra_overrides": [], "recipe_version": "0.1.0"}, tmp_path, form)
    # None is "not set" (the default applies); secrets and ALLOW_DRIFT are settings, but never replayed.
    # Keys the settings model does not name are listed (sorted, a blank one visibly), never written.
    assert replayed == Replayed(
        [*_header(tmp_path, "0.1.0", form), "EXPERIMENT_NAME=e", "EXPORT_STRICT=false", "SEED=3", "TRAIN_BATCH_SIZE=8"],
        ['""', "LD_PRELOAD", "PATH"], [],
    )  # fmt: skip


def test_the_env_file_leaves_out_a_value_it_cannot_hold_and_keeps_the_rest(tmp_path: Path) -> None:
    record = {"settings": {"EXPERIMENT_NAME": "bob's\nrun", "SEED": 3, "MODEL_PATH": "/models/My Model"}}
    note = f"EXPERIMENT_NAME left out of the env-file: {NEWLINE}{SHELL_WRITES_IT}"
    assert replay_lines(record, tmp_path, ENV_FILE) == Replayed(
        [*_header(tmp_path, None, ENV_FILE), f"# {note}", "MODEL_PATH=/models/My Model", "SEED=3"], [], [note]
    )
    assert replay_lines(record, tmp_path, SHELL).lines == [
        *_header(tmp_path, None), "EXPERIMENT_NAME='bob'\\''s\nrun'", "MODEL_PATH='/models/My Model'", "SEED=3"
    ]  # fmt: skip


def test_the_extra_overrides_follow_as_one_shell_quoted_comment(tmp_path: Path) -> None:
    extra = ["actor_rollout_ref.actor.clip_ratio=0.25", "trainer.project_name=a b", "+x=$HOME"]
    replayed = replay_lines({"settings": {"SEED": 1}, "extra_overrides": extra, "recipe_version": "v"}, tmp_path)
    assert replayed.lines == [
        *_header(tmp_path, "v"),
        "SEED=1",
        "# run with: entrypoint.py run -- actor_rollout_ref.actor.clip_ratio=0.25 'trainer.project_name=a b' '+x=$HOME'",
    ]


def test_a_record_without_extra_overrides_has_no_run_with_comment(tmp_path: Path) -> None:
    """The record's schema reads a missing list as empty."""
    assert replay_lines({"settings": {"SEED": 1}}, tmp_path) == Replayed([*_header(tmp_path, None), "SEED=1"], [], [])


@pytest.mark.parametrize("record", [{"settings": []}, {"settings": None}, {"settings": {}, "extra_overrides": "x"}])
def test_settings_that_are_not_an_object_are_refused(tmp_path: Path, record: dict[str, Any]) -> None:
    with pytest.raises(UnwritableRecord, match="^settings must be an object and extra_overrides a list$"):
        replay_lines(record, tmp_path)


def test_a_comment_is_one_line_and_cut_past_max_line(tmp_path: Path) -> None:
    """A newline in the record would start a live line; docker's reader stops at a 64 KiB line."""
    [header, _] = replay_lines({"settings": {}, "recipe_version": "0.1\nEVIL=1"}, tmp_path).lines
    assert header == f"# settings of the run recorded in {tmp_path} (recipe 0.1\\nEVIL=1)"
    prefix = f"settings of the run recorded in {tmp_path} (recipe "
    fits = "v" * (MAX_LINE - len(prefix) - 1)  # the comment's text is exactly MAX_LINE characters: kept whole
    assert replay_lines({"settings": {}, "recipe_version": fits}, tmp_path).lines[0] == "# " + prefix + fits + ")"
    cut = replay_lines({"settings": {}, "recipe_version": fits + "v"}, tmp_path).lines[0]
    assert cut == "# " + (prefix + fits)[: MAX_LINE - 60] + " ... (cut here: the record holds it all)"


# --- run_replay: what is printed, what is refused -------------------------------------------------


def test_replay_prints_the_shell_file_and_names_left_out_keys_and_drift(tmp_path: Path) -> None:
    path = _write_record(tmp_path, recipe_version="0.0.9", settings={"SEED": 3, "PATH": "/evil", "LD_PRELOAD": "/x.so"})
    code, out, err = _replay(path, now={"recipe_version": "0.1.0"})
    assert (code, out) == (0, _file(path, "0.0.9", "SEED=3"))
    assert err == (
        "replay: not settings, left out: LD_PRELOAD, PATH\n"
        "replay: RECIPE changed since the record: 0.0.9 then, 0.1.0 now\n"
    )


def test_replay_prints_the_env_file_and_says_each_value_left_out_of_it(tmp_path: Path) -> None:
    path = _write_record(tmp_path, recipe_version="1", settings={"SEED": 3, "EXPERIMENT_NAME": "my\nrun"})
    code, out, err = _replay(path, now={"recipe_version": "1"}, form=ENV_FILE)
    note = f"EXPERIMENT_NAME left out of the env-file: {NEWLINE}{SHELL_WRITES_IT}"
    assert (code, out, err) == (0, _file(path, "1", f"# {note}", "SEED=3", form=ENV_FILE), f"replay: {note}\n")


def test_a_directory_is_read_through_the_record_it_holds(tmp_path: Path) -> None:
    path = _write_record(tmp_path, recipe_version="1", settings={"SEED": 3})
    assert _replay(tmp_path, now={"recipe_version": "1"}) == (0, _file(path, "1", "SEED=3"), "")


def test_a_drifted_framework_version_stays_one_line(tmp_path: Path) -> None:
    path = _write_record(tmp_path, frameworks={"verl": "0.9.1\nreplay: forged"})
    code, _, err = _replay(path, now={"recipe_version": "", "frameworks": {"verl": "0.9.1"}})
    assert code == 0
    assert err == "replay: FRAMEWORKS changed since the record: verl 0.9.1\\nreplay: forged then, verl 0.9.1 now\n"


@pytest.mark.parametrize("where", ["a missing file", "a folder without a record"])
def test_no_record_there_is_exit_2(tmp_path: Path, where: str) -> None:
    record = tmp_path / "nothing.json" if where == "a missing file" else tmp_path
    code, out, err = _replay(record)
    assert (code, out, err) == (2, "", f"error: RECORD={str(record)!r}: no {RECORD_NAME} there\n")


def test_an_unreadable_record_is_exit_2_naming_it(tmp_path: Path) -> None:
    path = tmp_path / RECORD_NAME
    path.write_text('{"provenance": {"schema_version": 2}}')
    code, out, err = _replay(path)
    assert (code, out, err) == (2, "", f"error: RECORD={str(path)!r}: {path}: not a run record of schema 1\n")


@pytest.mark.parametrize(
    ("name", "why"),
    [("b" * 300, "cannot be read ([Errno 36] File name too long: "), ("a\x00b", "cannot be read (embedded null byte)")],
)
def test_a_record_path_no_file_system_takes_is_exit_2(tmp_path: Path, name: str, why: str) -> None:
    record = tmp_path / name / RECORD_NAME
    code, out, err = _replay(record)
    shown = str(record).replace("\x00", "\\x00")  # printed escaped, never raw
    assert (code, out) == (2, "") and err.startswith(f"error: RECORD={shown!r}: {why}") and err.count("\n") == 1


def test_a_record_path_with_a_newline_is_shown_escaped(tmp_path: Path) -> None:
    folder = tmp_path / "a\nb"
    folder.mkdir()
    code, _, err = _replay(folder)
    assert (code, err) == (2, f"error: RECORD={str(tmp_path) + '/a' + chr(92) + 'nb'!r}: no {RECORD_NAME} there\n")


@pytest.mark.parametrize("form", FORMATS)
def test_a_setting_that_is_no_scalar_is_exit_2_and_prints_nothing(tmp_path: Path, form: str) -> None:
    path = _write_record(tmp_path, settings={"SEED": 3, "EXPERIMENT_NAME": ["my", "run"]})
    code, out, err = _replay(path, now={}, form=form)
    # The record's schema refuses it first (record_file); replay_lines refuses it too, above.
    assert (code, out) == (2, "") and err.startswith(f"error: RECORD={str(path)!r}: ") and err.count("\n") == 1
    assert "EXPERIMENT_NAME" in err


@pytest.mark.parametrize("form", FORMATS)
def test_a_record_replay_cannot_write_is_one_error_line_even_past_the_schema(
    tmp_path: Path, form: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second guard: a record the reader passed (a looser schema, a later version) whose setting is a list is
    still refused by the writer, on one stderr line naming it, with nothing on stdout."""
    from recipe import replay

    path = _write_record(tmp_path, settings={"SEED": 3})
    record = replay.read_record(path)
    assert record is not None
    record["settings"]["EXPERIMENT_NAME"] = ["my", "run"]
    monkeypatch.setattr(replay, "read_record", lambda _: record)
    assert _replay(path, now={}, form=form) == (
        2, "", f"error: RECORD={str(path)!r}: EXPERIMENT_NAME: a list in the record, not a setting's value\n"
    )


def test_stdout_is_utf_8_whatever_the_locale(tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    """docker's --env-file reader refuses any other bytes; a shell passes them on as they are."""
    path = _write_record(tmp_path, recipe_version="1", settings={"EXPERIMENT_NAME": "é 日本"})
    latin = io.TextIOWrapper(sys.stdout.buffer, encoding="latin-1")  # a locale that cannot even write 日本
    try:
        with contextlib.redirect_stdout(latin):
            code = run_replay(argparse.Namespace(record=path, format=ENV_FILE), now={"recipe_version": "1"})
    finally:
        latin.detach()  # closing the wrapper would close pytest's capture under it
    assert code == 0
    assert capsysbinary.readouterr().out == _file(path, "1", "EXPERIMENT_NAME=é 日本", form=ENV_FILE).encode("utf-8")


# --- comparing with the inputs as they are now ---------------------------------------------------


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder everyone can search (pytest's own are root's 0700), so that only the modes under it decide."""
    folder = Path(tempfile.mkdtemp(prefix="replay-test-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


def _inputs_record(root: Path) -> Path:
    """A record of real files under root (a model folder, two data files), of this recipe and these frameworks."""
    model, data = root / "model", root / "data"
    model.mkdir()
    data.mkdir()
    (model / "config.json").write_text('{"hidden_size": 8}')
    files = {}
    for name, text in (("TRAIN_FILES", b"train rows"), ("VAL_FILES", b"val rows")):
        (data / name).write_bytes(text)
        files[name] = {"path": str(data / name), "size": len(text), "rows": 1, "sha256": _sha(text)}
    return _write_record(
        root, recipe_version=__version__, frameworks=installed_versions(), settings={"SEED": 1}, data=files,
        model={"path": str(model), "files": {"config.json": _sha(b'{"hidden_size": 8}')}},
    )  # fmt: skip


def test_unchanged_inputs_give_no_line(tmp_path: Path) -> None:
    path = _inputs_record(tmp_path)
    assert _replay(path) == (0, _file(path, __version__, "SEED=1"), "")


def test_each_changed_input_is_one_line_naming_both_digests(tmp_path: Path) -> None:
    path = _inputs_record(tmp_path)
    (tmp_path / "data" / "TRAIN_FILES").write_bytes(b"other rows")
    (tmp_path / "data" / "VAL_FILES").unlink()
    (tmp_path / "model" / "config.json").write_text('{"hidden_size": 16}')
    (tmp_path / "model" / "tokenizer.json").write_text("{}")  # a model file the record did not have
    code, _, err = _replay(path)
    then_config, now_config, tokenizer = _sha(b'{"hidden_size": 8}'), _sha(b'{"hidden_size": 16}'), _sha(b"{}")
    assert code == 0
    assert err.splitlines() == [
        (f"replay: MODEL_PATH changed since the record: config.json {then_config[:12]}, tokenizer.json (absent) then, "
         f"config.json {now_config[:12]}, tokenizer.json {tokenizer[:12]} now"),
        f"replay: TRAIN_FILES changed since the record: {_sha(b'train rows')[:12]} then, {_sha(b'other rows')[:12]} now",
        f"replay: VAL_FILES changed since the record: {_sha(b'val rows')[:12]} then, (absent) now",
    ]


def test_the_recipe_and_framework_versions_installed_now_are_compared(tmp_path: Path) -> None:
    versions = installed_versions()
    path = _write_record(tmp_path, recipe_version="0.0.1", frameworks={**versions, "verl": "0.0.0"})
    code, _, err = _replay(path)
    assert code == 0
    assert err.splitlines() == [
        f"replay: RECIPE changed since the record: 0.0.1 then, {__version__} now",
        f"replay: FRAMEWORKS changed since the record: verl 0.0.0 then, verl {versions['verl']} now",
    ]


def test_a_record_without_a_model_path_compares_no_model_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not even a config.json in the working directory, which an empty path would name."""
    path = _write_record(tmp_path, recipe_version=__version__, frameworks=installed_versions())
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    assert _replay(path)[2] == ""


def test_a_data_file_past_its_bound_is_not_compared_and_keeps_the_records_digest(tmp_path: Path) -> None:
    path = _inputs_record(tmp_path)
    train = tmp_path / "data" / "TRAIN_FILES"
    with train.open("r+b") as sparse:  # 2 TiB that costs nothing: nothing past the bound is read
        sparse.truncate(2 << 40)
    code, _, err = _replay(path)
    assert code == 0
    assert err == f"replay: TRAIN_FILES not compared: {train}: 2.0 TiB, above the 64.0 GiB bound\n"


def test_a_model_file_past_its_bound_is_not_compared(tmp_path: Path) -> None:
    """Model files are bounded at 1 GiB, not at the data files' 64 GiB."""
    path = _inputs_record(tmp_path)
    config = tmp_path / "model" / "config.json"
    with config.open("r+b") as sparse:
        sparse.truncate((1 << 30) + (1 << 29))
    code, _, err = _replay(path)
    assert code == 0
    assert err == f"replay: MODEL_PATH/config.json not compared: {config}: 1.5 GiB, above the 1.0 GiB bound\n"


@pytest.mark.parametrize(
    ("error", "why"), [(OSError(5, "Input/output error"), "Input/output error"), (PermissionError(), "PermissionError")]
)
def test_a_data_file_the_os_will_not_give_is_not_compared_saying_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: OSError, why: str
) -> None:
    """Root reads any file here, so the OS's refusal is made; the line names the file and the OS's reason."""
    from recipe import digests

    path = _inputs_record(tmp_path)
    real = digests.sha256_file

    def refuse_the_train_file(target: Path, limit: int) -> str:
        if target.name == "TRAIN_FILES":
            raise error
        return real(target, limit)

    monkeypatch.setattr(digests, "sha256_file", refuse_the_train_file)
    code, _, err = _replay(path)
    assert (code, err) == (0, f"replay: TRAIN_FILES not compared: {tmp_path / 'data' / 'TRAIN_FILES'}: {why}\n")


@needs_root
def test_a_file_the_records_owner_could_not_read_is_not_compared(shared: Path) -> None:
    """Read by root, a record planted by another user could otherwise learn whether a root-only file changed."""
    path = _inputs_record(shared)
    train = shared / "data" / "TRAIN_FILES"
    train.chmod(0o600)
    train.write_bytes(b"changed, but not the owner's to see")
    os.chown(path, OTHER_UID, -1)
    code, _, err = _replay(path)
    assert (code, err) == (
        0, f"replay: TRAIN_FILES not compared: {train} is neither the record owner's (uid {OTHER_UID}) nor readable by everyone\n"
    )  # fmt: skip


# --- which files the record's owner could read ----------------------------------------------------


@needs_root
@pytest.mark.parametrize(
    ("folder_owner", "folder_mode", "reachable"),
    [
        (OTHER_UID, 0o700, True),  # the owner's folder, searchable by its user
        (OTHER_UID, 0o601, True),  # searchable by everyone
        (OTHER_UID, 0o670, False),  # the owner's, but its user may not search it (the group may)
        (0, 0o700, False),  # searchable by its user, who is not the owner
        (0, 0o711, True),  # another's, searchable by everyone
        (0, 0o770, False),  # another's, searchable by its group only
    ],
)  # fmt: skip
def test_a_file_is_compared_only_when_every_folder_on_the_way_is_searchable_by_the_owner(
    shared: Path, folder_owner: int, folder_mode: int, reachable: bool
) -> None:
    folder = shared / "folder"
    folder.mkdir()
    target = folder / "train.parquet"
    target.write_text("rows")
    os.chown(target, OTHER_UID, -1)
    target.chmod(0o600)
    os.chown(folder, folder_owner, -1)
    folder.chmod(folder_mode)
    expected = None if reachable else f"{target}: the record owner (uid {OTHER_UID}) cannot reach it through {folder}"
    assert comparable(target, OTHER_UID) == expected


@needs_root
def test_the_nearest_folder_that_hides_a_file_is_named(shared: Path) -> None:
    inner = shared / "outer" / "inner"
    inner.mkdir(parents=True)
    (inner / "f").write_text("x")
    (inner / "f").chmod(0o644)
    for folder in (inner, shared / "outer"):
        folder.chmod(0o700)
    assert comparable(inner / "f", OTHER_UID) == f"{inner / 'f'}: the record owner (uid {OTHER_UID}) cannot reach it through {inner}"


@needs_root
@pytest.mark.parametrize(
    ("file_owner", "file_mode", "readable"),
    [
        (OTHER_UID, 0o400, True),  # the owner's, readable by its user
        (OTHER_UID, 0o004, True),  # readable by everyone
        (OTHER_UID, 0o040, False),  # the owner's, but its user may not read it (the group may)
        (0, 0o400, False),  # readable by its user, who is not the owner
        (0, 0o604, True),  # another's, readable by everyone
        (0, 0o640, False),  # another's, readable by its group only
    ],
)  # fmt: skip
def test_a_file_is_compared_only_when_it_is_the_owners_or_everyones(
    shared: Path, file_owner: int, file_mode: int, readable: bool
) -> None:
    target = shared / "train.parquet"
    target.write_text("rows")
    os.chown(target, file_owner, -1)
    target.chmod(file_mode)
    expected = None if readable else f"{target} is neither the record owner's (uid {OTHER_UID}) nor readable by everyone"
    assert comparable(target, OTHER_UID) == expected


@pytest.mark.parametrize("name", ["missing", "a\x00b"])
def test_a_file_that_is_not_there_is_compared_as_absent(tmp_path: Path, name: str) -> None:
    assert comparable(tmp_path / name, OTHER_UID) is None
