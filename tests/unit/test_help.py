"""Every command's --help says what it does, its exit codes and an example; a closed pipe is no error."""

from __future__ import annotations

import os
import subprocess

import pytest

from .envtools import ENTRYPOINT, HANG_GUARD_S, REPO, entrypoint_env

COMMANDS = ["plan", "run", "prepare-data", "verify-export", "export", "doctor"]


def _help(*argv: str) -> str:
    done = subprocess.run(
        [*ENTRYPOINT, *argv, "--help"], env=entrypoint_env(), capture_output=True, text=True, timeout=HANG_GUARD_S, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("command", COMMANDS)
def test_help_has_a_description_exit_codes_and_an_example(command: str) -> None:
    text = _help(command)
    usage, _, rest = text.partition("\n\n")
    description = rest.split("\n\n", 1)[0]
    assert usage.startswith("usage: entrypoint.py " + command)
    assert len(description.split()) >= 8, f"no description under the usage line:\n{text}"
    assert "\nexit codes:\n  0  " in text and "  2  " in text
    example = text.split("\nexample:\n", 1)[1].splitlines()[0]
    assert f"entrypoint.py {command}" in example, example


def test_run_help_explains_the_trainer_overrides() -> None:
    text = _help("run")
    assert "[-- key=value ...]" in text.splitlines()[0]
    assert "Hydra" in text


def test_the_command_list_names_every_command() -> None:
    text = _help()
    assert all(f"    {command}" in text for command in COMMANDS)


@pytest.mark.parametrize("argv", [["plan"], ["plan", "--json"], ["--help"]])
def test_a_closed_stdout_is_not_an_error(argv: list[str]) -> None:
    # `plan | head -3`: the reader leaves early. Its end is closed before the first write here,
    # so every write fails (EPIPE): deterministic, unlike a real race with `head`.
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [*ENTRYPOINT, *argv], env=entrypoint_env(), stdout=write_end, stderr=subprocess.PIPE, text=True,
            timeout=HANG_GUARD_S, check=False, cwd=REPO,
        )
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (0, "")
