"""Every command's --help says what it does, its exit codes and an example; a closed pipe is no error."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from .envtools import ENTRYPOINT, HANG_GUARD_S, REPO, entrypoint_env

COMMANDS = ["plan", "run", "prepare-data", "verify-export", "export", "doctor"]


def _help(*argv: str) -> str:
    """What `entrypoint.py ARGV --help` prints: the real parser, in this process (fast, and traced by mutmut)."""
    import contextlib
    import io

    from recipe.cli import _parser

    from unittest import mock

    shown = io.StringIO()
    # argparse wraps to COLUMNS; the entrypoint's check below runs with 80 too.
    with mock.patch.dict(os.environ, {"COLUMNS": "80"}), contextlib.redirect_stdout(shown), pytest.raises(SystemExit) as left:
        _parser().parse_args([*argv, "--help"])
    assert left.value.code == 0
    return shown.getvalue()


def test_the_help_is_what_the_entrypoint_prints() -> None:
    """The in-process help above is the entrypoint's own (same parser, same program name)."""
    done = subprocess.run(
        [*ENTRYPOINT, "plan", "--help"], env={**entrypoint_env(), "COLUMNS": "80"}, capture_output=True, text=True,
        timeout=HANG_GUARD_S, check=False,
    )
    assert (done.returncode, done.stdout) == (0, _help("plan"))


@pytest.mark.parametrize("command", COMMANDS)
def test_help_has_a_description_exit_codes_and_an_example(command: str) -> None:
    text = _help(command)
    usage, _, rest = text.partition("\n\n")
    description = rest.split("\n\n", 1)[0]
    assert usage.startswith("usage: entrypoint.py " + command)
    assert len(description.split()) >= 8, f"no description under the usage line:\n{text}"
    assert not description.startswith(("options:", "positional arguments:")), f"no description:\n{text}"
    codes = text.split("\nexit codes:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    numbers = [int(line.split()[0]) for line in codes]
    # One line per exit code, `  N  meaning`, in order, 0 and 2 always among them.
    assert all(re.fullmatch(r"  \d+  \S.*", line) for line in codes), codes
    assert numbers == sorted(numbers) and {0, 2} <= set(numbers), codes
    example = text.split("\nexample:\n", 1)[1].splitlines()[0]
    assert f"entrypoint.py {command}" in example, example


def test_run_help_explains_the_trainer_overrides() -> None:
    text = _help("run")
    assert "[-- key=value ...]" in text.splitlines()[0]
    assert "Hydra" in text


def test_the_command_list_names_every_command_with_its_summary() -> None:
    text = _help()
    assert all(f"\n    {command}" in text for command in COMMANDS)
    assert "\n    plan " in text and " print the checked launch plan (no accelerator needed)\n" in text


@pytest.mark.parametrize("command", ["plan", "run"])
def test_the_usage_line_shows_the_trainer_overrides(command: str) -> None:
    assert _help(command).splitlines()[0] == f"usage: entrypoint.py {command} " + {
        "plan": "[--json] [-- key=value ...]", "run": "[--progress | --no-progress] [-- key=value ...]"
    }[command]


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


def _examples(command: str) -> list[str]:
    text = _help(command)
    return [line.strip() for line in text.split("\nexample:\n", 1)[1].splitlines() if line.strip()]


@pytest.mark.parametrize("command", COMMANDS + ["replay"])
def test_every_help_example_is_accepted_by_the_tool(command: str) -> None:
    """An example the tool itself refuses teaches the wrong thing: plan and run examples go through the real
    plan (run's through `plan`, which decides exactly what run would), the others through the real parser."""
    import shlex

    from recipe.cli import _parser, _split_extra

    for example in _examples(command):
        words = shlex.split(example.split(">", 1)[0])  # a redirection is the shell's, not ours
        start = next(i for i, word in enumerate(words) if word.endswith("entrypoint.py"))
        assignments = dict(word.split("=", 1) for word in words[:start] if "=" in word)
        ours, extra = _split_extra(words[start + 1:])
        _parser().parse_args(ours)  # raises SystemExit on a refused example
        if command in ("plan", "run"):
            plan_argv = ["plan", *(["--json"] if "--json" in ours else []), *(["--", *extra] if extra else [])]
            done = subprocess.run([*ENTRYPOINT, *plan_argv], env=entrypoint_env(DEVICE="gpu", **assignments),
                                  capture_output=True, text=True, timeout=HANG_GUARD_S, check=False)  # fmt: skip
            assert done.returncode == 0, f"{example}: {done.stderr}"


@pytest.mark.parametrize("launcher", [list(ENTRYPOINT), ["python", "-m", "recipe"]])
def test_version_from_every_launcher(launcher: list[str]) -> None:
    import sys

    from recipe import __version__

    argv = [sys.executable, "-m", "recipe"] if launcher[0] == "python" else launcher
    done = subprocess.run([*argv, "--version"], env=entrypoint_env(), capture_output=True, text=True,
                          timeout=HANG_GUARD_S, check=False, cwd=REPO)  # fmt: skip
    assert (done.returncode, done.stdout) == (0, f"grpo-recipe {__version__}\n"), done.stderr


def test_the_console_script_the_readme_names_runs() -> None:
    """`grpo-recipe`, declared in pyproject.toml and installed by the README's set-up line (editable, compat mode)."""
    import sys
    from pathlib import Path

    from recipe import __version__

    script = Path(sys.executable).parent / "grpo-recipe"
    assert script.is_file(), "grpo-recipe missing: install with the README's set-up line"
    done = subprocess.run([str(script), "--version"], env=entrypoint_env(), capture_output=True, text=True,
                          timeout=HANG_GUARD_S, check=False)  # fmt: skip
    assert (done.returncode, done.stdout) == (0, f"grpo-recipe {__version__}\n"), done.stderr
    assert "grpo-recipe plan" in (REPO / "README.md").read_text()
