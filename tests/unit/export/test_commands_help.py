"""`verify-export --help` and `export --help` word for word: what each flag means, the exit codes and an example.

The help is the commands' reference (the exit codes are what scripts branch on, in the module docstring of
recipe.export.commands): a changed word is a change users see, so it is pinned whole. COLUMNS is fixed so that
argparse wraps the usage and the option column the same on every terminal.
"""

from __future__ import annotations

import argparse

import pytest

from recipe.export.commands import add_export_commands

VERIFY_HELP = r"""usage: entrypoint.py verify-export [-h] [--json] [--allow REGEX] [--no-default-allow] [--reference DIR] DIR

Compare the tensors in DIR's safetensors shards, its index and what the model class of DIR/config.json expects; report missing, unexpected, mis-shaped and ghost tensors and classify the export as complete, lenient or broken. DIR may also be a checkpoint directory: its newest HF export is checked.

positional arguments:
  DIR

options:
  -h, --help          show this help message and exit
  --json              print the report as one JSON document
  --allow REGEX       a tensor name pattern (re.search) whose absence or presence is accepted; repeatable
  --no-default-allow  do not allow ^mtp\. (multi-token-prediction layers) by default
  --reference DIR     the checkpoint the export started from (e.g. $MODEL_PATH): also report what the export dropped

exit codes:
  0  complete or lenient
  1  broken
  2  cannot check (no export, unreadable files)

example:
  entrypoint.py verify-export /checkpoints/grpo/exp/global_step_20/actor/model/huggingface
"""

EXPORT_HELP = r"""usage: entrypoint.py export [-h] --out DIR [--checkpoint-dir DIR] [--model-path DIR] [--strict | --lenient] [--json]
                            [--allow REGEX] [--no-default-allow]

Find the newest verl Megatron (dist) checkpoint of this experiment, load it with Megatron-Bridge into the model of MODEL_PATH, write Hugging Face safetensors to OUT (leniently by default: what matches is written and the rest reported), then check OUT as verify-export does.

options:
  -h, --help            show this help message and exit
  --out DIR             an empty or new directory
  --checkpoint-dir DIR  default: this experiment's checkpoints
  --model-path DIR      default: $MODEL_PATH
  --strict              fail on any key mismatch
  --lenient             write what matches (default)
  --json                print the report as one JSON document
  --allow REGEX         a tensor name pattern (re.search) whose absence or presence is accepted; repeatable
  --no-default-allow    do not allow ^mtp\. (multi-token-prediction layers) by default

exit codes:
  0  written; complete or lenient
  1  written but broken
  2  cannot export or check: nothing written

example:
  entrypoint.py export --out /checkpoints/hf-export
"""

COMMAND_LIST = """\
    verify-export       check an exported Hugging Face checkpoint (exit 1 when broken)
    export              export the newest verl Megatron checkpoint to Hugging Face with Megatron-Bridge, then check it
"""


@pytest.fixture
def parser(monkeypatch: pytest.MonkeyPatch) -> argparse.ArgumentParser:
    monkeypatch.setenv("COLUMNS", "120")
    parser = argparse.ArgumentParser(prog="entrypoint.py")
    add_export_commands(parser.add_subparsers(dest="command"))
    return parser


@pytest.mark.parametrize(
    ("command", "text"), [("verify-export", VERIFY_HELP), ("export", EXPORT_HELP)]
)
def test_each_commands_help_word_for_word(
    parser: argparse.ArgumentParser, command: str, text: str
) -> None:
    subparsers = next(
        a for a in parser._actions if isinstance(a, argparse._SubParsersAction)
    )
    assert subparsers.choices[command].format_help() == text


def test_the_command_list_says_what_each_does(parser: argparse.ArgumentParser) -> None:
    assert COMMAND_LIST in parser.format_help()


def test_the_examples_path_has_the_shape_verl_writes() -> None:
    """The example export path is where verl 0.9.1 puts a step's HF export (recipe.export.watch.HF_SUBDIRS), so a
    user who follows it with their own project and experiment reaches the export, not "not a directory"."""
    from recipe.export.watch import HF_SUBDIRS

    (example,) = [line.split()[-1] for line in VERIFY_HELP.splitlines() if line.startswith("  entrypoint.py verify-export")]
    assert example.endswith("/global_step_20/" + HF_SUBDIRS[0]), example
