"""`replay` on hostile records: what it writes is read back exactly, or it refuses with exit 2 naming the key.

A record travels between clusters and into tickets, so it is input. The env file replay prints
is sourced (bash, dash: `set -a; . file`) or given to Compose's env_file and docker's --env-file.
Generated values go through the real readers: the shells, the Compose v2 binary's `config`, and
the docker CLI's own --env-file parser (against a stand-in engine that records the container's
Env). A value is either written plain (every reader gets it back exactly) or refused, never escaped.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import os
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recipe.record_file import RECORD_NAME, SCHEMA_VERSION
from recipe.replay import REPLAYABLE, run_replay
from tests.support.fake_docker_engine import docker_env_file
from tests.unit.envtools import HANG_GUARD_S

SHELLS = [shell for shell in ("bash", "dash") if shutil.which(shell)]
SETTING = "EXPERIMENT_NAME"


def _record(directory: Path, settings: dict[str, Any], **fields: Any) -> Path:
    record = {"schema_version": SCHEMA_VERSION, "settings": settings, "recipe_version": "0", **fields}
    path = directory / RECORD_NAME
    path.write_text(json.dumps({"provenance": record}))
    return path


def _replay(path: Path, capsys: Any = None) -> tuple[int, str, str]:
    """Exit code, stdout, stderr of `replay` (NOW equal to the record: no drift lines)."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    record = json.loads(path.read_text())["provenance"]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run_replay(argparse.Namespace(record=path), now={k: record.get(k) for k in ("recipe_version",)})
    return code, out.getvalue(), err.getvalue()


def _sourced(shell: str, env_file: Path, name: str) -> str | None:
    """The value of `name` after `set -a; . env_file` in `shell`, or None when unset; the shell must run nothing else."""
    script = f'set -a; . "{env_file}"; set +a; if [ "${{{name}+set}}" = set ]; then printf %s "${name}"; else exit 3; fi'
    # In the env file's own folder: a value that ran as shell code could only write there.
    done = subprocess.run(
        [shell, "-c", script], capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin"},
        cwd=env_file.parent,
    )  # fmt: skip
    return None if done.returncode == 3 else done.stdout


@pytest.mark.skipif(not SHELLS, reason="neither bash nor dash on PATH")
@given(value=st.text(max_size=40))
def test_a_value_is_read_back_exactly_by_every_shell_or_refused_naming_the_key(value: str) -> None:
    with tempfile.TemporaryDirectory() as scratch:  # a fixture's tmp_path would be shared by every example
        code, out, err = _replay(_record(Path(scratch), {SETTING: value}))
        if code == 2:
            # Named by the setting; a NUL or a lone surrogate refuses the record as a whole (record_file).
            assert err.startswith("error: RECORD=") and "\n" not in err.rstrip("\n")
            assert f"{SETTING}=" in err or "a NUL or a lone surrogate" in err
            assert out == ""
            return
        assert code == 0
        env_file = Path(scratch) / "replay.env"
        env_file.write_text(out)
        line = [text for text in out.splitlines() if text.startswith(f"{SETTING}=")]
        assert line == [f"{SETTING}={value}"]  # literally what docker's and Compose's readers take
        for shell in SHELLS:
            assert _sourced(shell, env_file, SETTING) == value, shell


#: Any text a record of ours can hold: a NUL or a lone surrogate refuses the record as a whole (record_file).
RECORD_TEXT = st.characters(blacklist_characters="\x00", blacklist_categories=["Cs"])


@given(
    key=st.text(RECORD_TEXT, min_size=1, max_size=30).filter(lambda k: k not in REPLAYABLE),
    value=st.text(RECORD_TEXT, max_size=20),
)
def test_only_settings_are_written(key: str, value: str) -> None:
    """PATH, LD_PRELOAD, HF_ENDPOINT, `A=1;$'...'`: a key the settings model does not name is never a line."""
    with tempfile.TemporaryDirectory() as scratch:
        code, out, _ = _replay(_record(Path(scratch), {key: value, SETTING: "x"}))
        assert code == 0
        assert [line for line in out.splitlines() if not line.startswith("#")] == [f"{SETTING}=x"]


@pytest.mark.parametrize("secret", ["HF_TOKEN", "WANDB_API_KEY", "RAY_AUTH_TOKEN"])
def test_a_secret_is_never_written(secret: str, tmp_path: Path) -> None:
    """Sourcing `HF_TOKEN='**********'` would replace the user's real token."""
    code, out, _ = _replay(_record(tmp_path, {secret: "**********", SETTING: "x"}))
    assert code == 0 and secret not in out


@given(
    text=st.text(RECORD_TEXT, max_size=40)
    | st.builds(lambda c, n: c * n, st.sampled_from("v\n"), st.integers(60_000, 80_000))
)
def test_every_comment_line_stays_one_line(text: str) -> None:
    """A newline in the recipe version, the record's path or an extra override would start a live line, and
    a line of 64 KiB stops docker's --env-file reader: every line is one, and at most MAX_LINE long."""
    from recipe.replay import MAX_LINE

    with tempfile.TemporaryDirectory() as scratch:
        code, out, _ = _replay(_record(Path(scratch), {SETTING: "x"}, recipe_version=text, extra_overrides=[text]))
        assert code == 0
        assert [line for line in out.splitlines() if not line.startswith("#")] == [f"{SETTING}=x"]
        assert max(len(line) for line in out.splitlines()) <= MAX_LINE + 2


def test_a_value_too_long_for_dockers_reader_is_refused_naming_the_setting(tmp_path: Path) -> None:
    code, out, err = _replay(_record(tmp_path, {SETTING: "v" * 70_000}))
    assert code == 2 and out == ""
    assert f"{SETTING}: a value of 70000 characters, not written" in err and len(err) < 1000


def test_allow_drift_is_never_replayed(tmp_path: Path) -> None:
    """A record's ALLOW_DRIFT would accept drift on the next resume without the user asking."""
    code, out, _ = _replay(_record(tmp_path, {"ALLOW_DRIFT": "TRAIN_FILES", SETTING: "x"}))
    assert code == 0 and "ALLOW_DRIFT" not in out and f"{SETTING}=x" in out


@pytest.mark.parametrize(
    "record",
    [{"settings": []}, {"settings": {SETTING: {"a": 1}}}, {"settings": {SETTING: [1]}}, {"settings": {}, "extra_overrides": "x"}],
)
def test_wrong_types_are_exit_2_not_a_traceback(record: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / RECORD_NAME
    path.write_text(json.dumps({"provenance": {"schema_version": SCHEMA_VERSION, **record}}))
    code, out, err = _replay(path)
    assert (code, out) == (2, "") and err.startswith("error: RECORD=")


#: Characters some reader treats specially (quotes, `$`, `#`, escapes, blanks, newlines), with plain ones.
READER_SENSITIVE = "aZ0_=-'\"$#{}\\ \t\n\r`~*!;"
_PLAIN_TEXT = st.from_regex(r"[A-Za-z0-9_./:,@%+=-]{0,6}", fullmatch=True)
#: Plain values, plain values with one sensitive character inside, and any mix of them.
READER_VALUES = (
    _PLAIN_TEXT
    | st.builds(lambda head, char, tail: head + char + tail, _PLAIN_TEXT, st.sampled_from(READER_SENSITIVE), _PLAIN_TEXT)
    | st.text(alphabet=READER_SENSITIVE, max_size=6)
)
#: String settings that take any text, so that one example tries several values at once.
TEXT_SETTINGS = ("EXPERIMENT_NAME", "PROJECT_NAME", "MASTER_ADDR", "RAY_ADDRESS")


def _compose_env_file(env_file: Path) -> dict[str, str]:
    """The environment Compose v2 gives a service whose env_file is ENV_FILE (`docker-compose config`, no engine)."""
    compose = Path(sys.executable).parent / "docker-compose"
    (env_file.parent / "compose.yaml").write_text(f"services:\n  s:\n    image: x\n    env_file: {env_file.name}\n")
    done = subprocess.run(
        [str(compose), "-f", "compose.yaml", "config", "--format", "json"], cwd=env_file.parent, capture_output=True,
        text=True, timeout=HANG_GUARD_S, env={"PATH": os.environ.get("PATH", ""), "HOME": str(env_file.parent)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["services"]["s"].get("environment") or {}


@settings(max_examples=15)  # each example runs Compose and the docker CLI once, over 4 values
@given(values=st.lists(READER_VALUES, min_size=len(TEXT_SETTINGS), max_size=len(TEXT_SETTINGS)))
def test_compose_and_docker_read_the_written_values_back_exactly(values: list[str]) -> None:
    """Compose expands `$` and strips quotes; docker keeps quotes and splits on newlines: neither may alter a value."""
    docker = shutil.which("docker")
    assert docker, "the docker CLI (its --env-file parser) is on PATH: .ci/run installs it"
    assert set(TEXT_SETTINGS) <= REPLAYABLE
    written: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as scratch:
        lines = []
        for name, value in zip(TEXT_SETTINGS, values):  # one record each: a refused value leaves the others to test
            code, out, err = _replay(_record(Path(scratch), {name: value}))
            if code == 2:
                assert out == "" and err.startswith("error: RECORD=") and f"{name}=" in err
                continue
            lines += out.splitlines()
            written[name] = value
        env_file = Path(scratch) / "replay.env"
        env_file.write_text("\n".join(lines) + "\n")
        assert _compose_env_file(env_file) == written
        assert docker_env_file(docker, env_file, HANG_GUARD_S) == [f"{name}={value}" for name, value in written.items()]
