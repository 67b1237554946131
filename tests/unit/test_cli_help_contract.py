"""What `--help` promises for plan and run: the documented exit codes, examples the tool accepts, a summary and a description.

The exit codes are the README's command table and recipe/cli.py's docstring (0 success, 1 and
others the trainer's own, 2 bad input, 3 a cluster that did not form, 4 a failed smoke
verdict). test_help.py checks every command's help end to end, running the examples through
subprocesses; these checks use the parser in this process, so that they stay fast.
"""

from __future__ import annotations

import contextlib
import io
import os
import shlex
from unittest import mock

import pytest

from recipe.cli import _parser, _split_extra
from recipe.settings import Settings

#: README, "Commands": plan "0, or 2 on bad settings"; run "the trainer's, or 2 before anything starts;
#: with PROFILE=smoke 4 when the verdict fails"; cli.py: "3 the Ray cluster of several nodes did not form".
DOCUMENTED_EXIT_CODES = {"plan": [0, 2], "run": [0, 1, 2, 3, 4]}
SETTINGS = {name.upper() for name in Settings.model_fields}


def _help(*argv: str) -> str:
    shown = io.StringIO()
    with mock.patch.dict(os.environ, {"COLUMNS": "100"}), contextlib.redirect_stdout(shown), pytest.raises(SystemExit):
        _parser().parse_args([*argv, "--help"])
    return shown.getvalue()


@pytest.mark.parametrize("command", sorted(DOCUMENTED_EXIT_CODES))
def test_the_help_lists_the_documented_exit_codes(command: str) -> None:
    codes = _help(command).split("\nexit codes:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert [int(line.split()[0]) for line in codes] == DOCUMENTED_EXIT_CODES[command]


@pytest.mark.parametrize("command", sorted(DOCUMENTED_EXIT_CODES))
def test_every_example_is_a_command_line_the_parser_takes_with_settings_as_documented(command: str) -> None:
    examples = [line.strip() for line in _help(command).split("\nexample:\n", 1)[1].splitlines() if line.strip()]
    assert examples
    for example in examples:
        words = shlex.split(example)
        start = words.index("entrypoint.py")
        assert words[start - 1] == "python", example
        # Variables before the command are settings, spelt as the README and .env.example spell them.
        assert all(word.split("=", 1)[0] in SETTINGS for word in words[: start - 1]), example
        ours, _ = _split_extra(words[start + 1 :])
        assert _parser().parse_args(ours).command == command, example


def test_the_command_list_says_what_the_tool_is_and_what_plan_and_run_do() -> None:
    text = _help()
    description = text.split("\n\n", 2)[1]
    assert "GRPO" in description and "environment variables" in description
    for command in ("plan", "run"):
        line = next(line for line in text.splitlines() if line.strip().startswith(command + " "))
        assert len(line.split()) >= 4, line  # the name, then a summary of a few words


@pytest.mark.parametrize("command", sorted(DOCUMENTED_EXIT_CODES))
def test_a_commands_help_describes_it_under_the_usage(command: str) -> None:
    description = _help(command).split("\n\n", 2)[1]
    assert not description.startswith("options:") and len(description.split()) >= 20
