"""`replay RECORD`: the exact env file it prints, the exact lines it writes on stderr, and its exit codes.

What a user relies on, by direct calls (no subprocess, no verl config) so that each case is fast:
- stdout is the env file: a comment naming the record, one `NAME=value` line per replayable
  setting in name order (never a secret, never ALLOW_DRIFT, never a key the settings model does
  not name), and the extra overrides as one shell-quoted comment; comments are one line, cut at
  4,096 characters (README, "Reproducibility");
- a value is written only when it is plain (README: letters, digits and `_ . / : , @ % + = -`, at
  most 4,096 characters), otherwise exit 2 with one line naming the setting;
- a RECORD that is not a run record is exit 2 with one `error: RECORD=...` line;
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
from recipe.replay import UnwritableRecord, add_replay_parser, comparable, env_line, replay_lines, run_replay

#: A user id that owns nothing here: a record "of another user" (chown needs root).
OTHER_UID = 4242
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user (chown) needs root")

#: The characters README promises are written as they are ("Reproducibility"): the oracle, typed from the docs.
DOCUMENTED_PLAIN = string.ascii_letters + string.digits + "_./:,@%+=-"
#: The longest value written, and where a comment is cut (README: docker's reader stops at a 64 KiB line).
MAX_LINE = 4096
#: The refusal's tail, as README words it: plain values only, else set it by hand.
NOT_PLAIN = (
    "not written, since bash, dash, Compose's env_file and docker's --env-file would not all read it back the same "
    "(plain values only: letters, digits and _ . / : , @ % + = -); set it by hand"
)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write_record(directory: Path, **fields: Any) -> Path:
    """A run-record.json holding these provenance fields (and the schema version), as `run` stores one."""
    path = directory / RECORD_NAME
    path.write_text(json.dumps({"provenance": {"schema_version": SCHEMA_VERSION, **fields}}))
    return path


def _replay(record: Path, now: dict[str, Any] | None = None) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `replay RECORD`; NOW None compares with the inputs as they are."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run_replay(argparse.Namespace(record=record), now=now)
    return code, out.getvalue(), err.getvalue()


def _header(path: Path, version: object) -> str:
    return f"# settings of the run recorded in {path} (recipe {version})"


# --- the command line -------------------------------------------------------------------------


def test_replay_takes_one_record_path_and_documents_its_exit_codes() -> None:
    parser = argparse.ArgumentParser(prog="entrypoint.py")
    commands = parser.add_subparsers(dest="command")
    add_replay_parser(commands)
    args = parser.parse_args(["replay", "/checkpoints/p/e/global_step_40"])
    assert (args.command, args.record) == ("replay", Path("/checkpoints/p/e/global_step_40"))
    help_text = commands.choices["replay"].format_help()
    # README: "0, or 2 when RECORD is not a run record".
    assert "exit codes:\n  0  printed" in help_text and "\n  2  RECORD is not a readable run record" in help_text
    assert "usage: entrypoint.py replay [-h] RECORD" in help_text


# --- one setting, one line ----------------------------------------------------------------------


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
        ("a" * MAX_LINE, "X=" + "a" * MAX_LINE),  # the longest value written
    ],
)  # fmt: skip
def test_a_plain_value_is_written_as_it_is(value: object, line: str) -> None:
    assert env_line("X", value) == line


@given(st.text(DOCUMENTED_PLAIN, max_size=40))
def test_every_value_of_the_documented_characters_is_written(value: str) -> None:
    assert env_line("EXPERIMENT_NAME", value) == f"EXPERIMENT_NAME={value}"


@given(
    head=st.text(DOCUMENTED_PLAIN, max_size=8),
    odd=st.characters(blacklist_characters=DOCUMENTED_PLAIN, blacklist_categories=["Cs"]),
    tail=st.text(DOCUMENTED_PLAIN, max_size=8),
)
def test_any_other_character_refuses_the_value_naming_the_setting(head: str, odd: str, tail: str) -> None:
    with pytest.raises(UnwritableRecord) as refused:
        env_line("EXPERIMENT_NAME", head + odd + tail)
    assert str(refused.value).startswith("EXPERIMENT_NAME=") and str(refused.value).endswith(NOT_PLAIN)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("a b", f"X='a b': {NOT_PLAIN}"),
        ("$HOME", f"X='$HOME': {NOT_PLAIN}"),
        ("a\nb", f"X='a\\\\nb': {NOT_PLAIN}"),  # the newline shown escaped: the message stays one line
        ("é", f"X='é': {NOT_PLAIN}"),  # a letter, but not one of the plain ASCII ones
        ("a" * (MAX_LINE + 1), (f"X: a value of {MAX_LINE + 1} characters, not written (at most {MAX_LINE}: docker's "
                                "--env-file reader refuses a line of 64 KiB); set it by hand")),
        ([1], "X: a list in the record, not a setting's value"),
        ({"a": 1}, "X: a dict in the record, not a setting's value"),
    ],
)  # fmt: skip
def test_a_value_not_every_reader_takes_is_refused_with_one_exact_line(value: object, message: str) -> None:
    with pytest.raises(UnwritableRecord) as refused:
        env_line("X", value)
    assert str(refused.value) == message


# --- the env file --------------------------------------------------------------------------------


def test_the_env_file_holds_each_replayable_setting_in_name_order_after_the_header(tmp_path: Path) -> None:
    settings = {
        "TRAIN_BATCH_SIZE": 8, "SEED": 3, "EXPORT_STRICT": False, "EXPERIMENT_NAME": "e", "MODEL_PATH": None,
        "HF_TOKEN": "**********", "WANDB_API_KEY": "**********", "RAY_AUTH_TOKEN": "**********",
        "ALLOW_DRIFT": "TRAIN_FILES", "PATH": "/evil", "LD_PRELOAD": "/x.so", "": "blank",
    }  # fmt: skip
    lines, left_out = replay_lines({"settings": settings, "extra_overrides": [], "recipe_version": "0.1.0"}, tmp_path)
    # None is "not set" (the default applies); secrets and ALLOW_DRIFT are settings, but never replayed.
    assert lines == [_header(tmp_path, "0.1.0"), "EXPERIMENT_NAME=e", "EXPORT_STRICT=false", "SEED=3", "TRAIN_BATCH_SIZE=8"]
    # Keys the settings model does not name are listed (sorted, a blank one visibly), never written.
    assert left_out == ['""', "LD_PRELOAD", "PATH"]


def test_the_extra_overrides_follow_as_one_shell_quoted_comment(tmp_path: Path) -> None:
    extra = ["actor_rollout_ref.actor.clip_ratio=0.25", "trainer.project_name=a b", "+x=$HOME"]
    lines, _ = replay_lines({"settings": {"SEED": 1}, "extra_overrides": extra, "recipe_version": "v"}, tmp_path)
    assert lines == [
        _header(tmp_path, "v"),
        "SEED=1",
        "# run with: entrypoint.py run -- actor_rollout_ref.actor.clip_ratio=0.25 'trainer.project_name=a b' '+x=$HOME'",
    ]


def test_a_record_without_extra_overrides_has_no_run_with_comment(tmp_path: Path) -> None:
    """The record's schema reads a missing list as empty."""
    assert replay_lines({"settings": {"SEED": 1}}, tmp_path) == ([_header(tmp_path, None), "SEED=1"], [])


@pytest.mark.parametrize("record", [{"settings": []}, {"settings": None}, {"settings": {}, "extra_overrides": "x"}])
def test_settings_that_are_not_an_object_are_refused(tmp_path: Path, record: dict[str, Any]) -> None:
    with pytest.raises(UnwritableRecord, match="^settings must be an object and extra_overrides a list$"):
        replay_lines(record, tmp_path)


def test_a_comment_is_one_line_and_cut_past_max_line(tmp_path: Path) -> None:
    """A newline in the record would start a live line; docker's reader stops at a 64 KiB line."""
    lines, _ = replay_lines({"settings": {}, "recipe_version": "0.1\nEVIL=1"}, tmp_path)
    assert lines == [f"# settings of the run recorded in {tmp_path} (recipe 0.1\\nEVIL=1)"]
    prefix = f"settings of the run recorded in {tmp_path} (recipe "
    fits = "v" * (MAX_LINE - len(prefix) - 1)  # the comment's text is exactly MAX_LINE characters: kept whole
    assert replay_lines({"settings": {}, "recipe_version": fits}, tmp_path)[0] == ["# " + prefix + fits + ")"]
    [cut], _ = replay_lines({"settings": {}, "recipe_version": fits + "v"}, tmp_path)
    assert cut == "# " + (prefix + fits)[: MAX_LINE - 60] + " ... (cut here: the record holds it all)"


# --- run_replay: what is printed, what is refused -------------------------------------------------


def test_replay_prints_the_env_file_and_names_left_out_keys_and_drift(tmp_path: Path) -> None:
    path = _write_record(tmp_path, recipe_version="0.0.9", settings={"SEED": 3, "PATH": "/evil", "LD_PRELOAD": "/x.so"})
    code, out, err = _replay(path, now={"recipe_version": "0.1.0"})
    assert (code, out) == (0, f"{_header(path, '0.0.9')}\nSEED=3\n")
    assert err == (
        "replay: not settings, left out: LD_PRELOAD, PATH\n"
        "replay: RECIPE changed since the record: 0.0.9 then, 0.1.0 now\n"
    )


def test_a_directory_is_read_through_the_record_it_holds(tmp_path: Path) -> None:
    path = _write_record(tmp_path, recipe_version="1", settings={"SEED": 3})
    assert _replay(tmp_path, now={"recipe_version": "1"}) == (0, f"{_header(path, '1')}\nSEED=3\n", "")


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


def test_a_value_that_cannot_be_written_is_exit_2_and_prints_nothing(tmp_path: Path) -> None:
    path = _write_record(tmp_path, settings={"SEED": 3, "EXPERIMENT_NAME": "my run"})
    code, out, err = _replay(path, now={})
    assert (code, out, err) == (2, "", f"error: RECORD={str(path)!r}: EXPERIMENT_NAME='my run': {NOT_PLAIN}\n")


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
    assert _replay(path) == (0, f"{_header(path, __version__)}\nSEED=1\n", "")


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
