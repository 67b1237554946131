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


def _words(text: str) -> str:
    """The help as a reader reads it: the words in order, whatever the terminal's width wrapped."""
    return " ".join(text.split())


#: What each `--help` tells its reader, word for word: what the tool or command does, with which settings, each
#: option and exit code (README's "Commands" and the module docstring say the same in short).
HELP_TEXT = {
    (): (
        "usage: entrypoint.py [-h] [--version] COMMAND ... "
        "GRPO training of Qwen3.5-35B-A3B with verl + Megatron-Bridge on gpu or npu. Settings come from environment "
        "variables (see README). positional arguments: COMMAND "
        "plan print the checked launch plan (no accelerator needed) "
        "run check the machine, then run the trainer "
    ),
    ("plan",): (
        "usage: entrypoint.py plan [--json] [-- key=value ...] "
        "Read the settings from the environment, check them against the model's config.json (or the built-in "
        "profile) and the device's layout rules, compose the trainer's Hydra overrides against the installed verl, "
        "and print the layout, where each value came from and the exact trainer command. Starts nothing and writes "
        "nothing. Extra Hydra overrides for verl go in the OVERRIDES setting (the way that works on every path: "
        "Compose, the Job, the RayJob) or after `--`; for a key in both, `--` wins. "
        "options: -h, --help show this help message and exit --json one JSON document on stdout "
        "exit codes: 0 the plan is valid (printed) 2 bad settings or overrides: one `error:` line each on stderr "
        "example: TP=4 EP=8 python entrypoint.py plan "
        "python entrypoint.py plan --json -- actor_rollout_ref.actor.optim.lr=2e-6"
    ),
    ("run",): (
        "usage: entrypoint.py run [--progress | --no-progress] [-- key=value ...] "
        "Everything `plan` checks, then the machine: devices visible, the model's config.json, readable data files, "
        "a writable checkpoint directory, the trainer's packages and a sound HF export to resume from. Then "
        "`python -m recipe.trainer_main` (verl's GRPO trainer) runs with the plan's overrides, then the user's Hydra "
        "overrides (key=value, +key=value, ~key): OVERRIDES' first, then those after `--`; an override replaces the "
        "recipe's value for the same key. With NNODES > 1 it starts or joins the Ray cluster first. "
        "options: -h, --help show this help message and exit --progress, --no-progress "
        "one `progress:` line per training step (step of total, mean reward, s/step and its split into verl's "
        "phases, tokens/s/device, the rollout/training mismatch in NeMo-RL's and slime's units beside their bounds "
        "and the share of tokens the correction capped, ETA), read from verl's TensorBoard event files; "
        "default: PROGRESS (on) "
        "exit codes: 0 the trainer finished 1 the trainer's own exit code otherwise (1 and others) "
        "2 bad settings, overrides or machine: nothing was started "
        "3 the Ray cluster did not form in RAY_WAIT_TIMEOUT, or a node was lost during the run (a restart resumes "
        "from the last save) "
        "4 PROFILE=smoke: the trainer finished, but the smoke verdict failed (the block says which check) "
        "example: python entrypoint.py run -- actor_rollout_ref.actor.optim.lr=2e-6 trainer.total_training_steps=100"
    ),
}


@pytest.mark.parametrize("argv", sorted(HELP_TEXT), ids=lambda argv: " ".join(argv) or "entrypoint.py")
def test_the_help_says_word_for_word_what_the_command_does(argv: tuple[str, ...]) -> None:
    """The settings it reads (OVERRIDES, PROGRESS, RAY_WAIT_TIMEOUT, NNODES, PROFILE), its options and exit codes: a
    changed word is a changed promise. The command list goes on with the commands of other modules (their own tests)."""
    assert _words(_help(*argv)).startswith(_words(HELP_TEXT[argv]))
    if argv:
        assert _words(_help(*argv)) == _words(HELP_TEXT[argv])
