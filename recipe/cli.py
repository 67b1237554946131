"""Subcommands and exit codes.

    plan [--json]   print the checked launch plan; needs no accelerator, imports no torch/ray/verl
    run             check the machine too, then run verl's GRPO trainer (OVERRIDES or `-- key=value` add Hydra overrides)
    prepare-data {geo3k,gsm8k} [--out DIR] [--source PATH]
                    write verl's train/test parquet (default into $DATA_DIR/<dataset>); 1 if it cannot fetch or write

Exit codes: 0 success; 2 bad settings or an unfit machine (one stderr line per
problem, nothing started or written); 3 the Ray cluster of several nodes did not
form in time (names the missing nodes); 4 (PROFILE=smoke) the trainer finished but the
smoke verdict failed a check; otherwise the trainer's own exit code.

This module is only the command line: the parser, the help texts and the dispatch. `run`
itself lives in recipe.run (preflight, resume guard, trainer supervision).
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import signal
import sys
from pathlib import Path
from typing import NoReturn, Sequence

from recipe import __version__
from recipe.cluster import rules
from recipe.data.command import add_prepare_data_parser, run_prepare_data
from recipe.doctor.command import add_doctor_parser, run_doctor
from recipe.env_file import env_file_problems
from recipe.env_warnings import allow_drift_warnings, near_miss_warnings
from recipe.errors import RecipeConfigError, one_line, report_errors
from recipe.export.commands import add_export_commands, run_export, run_verify_export
from recipe.export.report import printable
from recipe.help import add_command
from recipe.launch import TRAINER_MODULE, checkpoint_root
from recipe.run.progress import PROGRESS_LINE
from recipe.plan import Plan, build_plan
from recipe.process_exit import run_program
from recipe.provenance import DRIFT_FIELDS
from recipe.redaction import redact
from recipe.replay import add_replay_parser, run_replay
from recipe.run.trainer import run_command
from recipe.settings import load_settings

logger = logging.getLogger("recipe")

EXIT_CONFIG = 2
EXIT_CLUSTER = 3


class _Parser(argparse.ArgumentParser):
    """argparse, whose usage errors are report_errors' lines: escaped, and a JSON document with --json."""

    #: Whether the command line asked for JSON (set by main before parsing).
    json_errors = False

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        command = self.prog.split()[-1] if " " in self.prog else "entrypoint.py"
        sys.exit(report_errors(command, [message], EXIT_CONFIG, _Parser.json_errors))


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="entrypoint.py",
        description="GRPO training of Qwen3.5-35B-A3B with verl + Megatron-Bridge on gpu or npu. "
        "Settings come from environment variables (see README).",
    )
    parser.add_argument("--version", action="version", version=f"grpo-recipe {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    plan = add_command(
        commands, "plan",
        summary="print the checked launch plan (no accelerator needed)",
        description="Read the settings from the environment, check them against the model's config.json (or the "
        "built-in profile) and the device's layout rules, compose the trainer's Hydra overrides against the "
        "installed verl, and print the layout, where each value came from and the exact trainer command. "
        "Starts nothing and writes nothing. Extra Hydra overrides for verl go in the OVERRIDES setting (the way "
        "that works on every path: Compose, the Job, the RayJob) or after `--`; for a key in both, `--` wins.",
        usage="entrypoint.py plan [--json] [-- key=value ...]",
        exit_codes={0: "the plan is valid (printed)", 2: "bad settings or overrides: one `error:` line each on stderr"},
        examples=["TP=4 EP=8 python entrypoint.py plan", "python entrypoint.py plan --json -- actor_rollout_ref.actor.optim.lr=2e-6"],
    )
    plan.add_argument("--json", action="store_true", help="one JSON document on stdout")
    run = add_command(
        commands, "run",
        summary="check the machine, then run the trainer",
        description="Everything `plan` checks, then the machine: devices visible, the model's config.json, readable "
        "data files, a writable checkpoint directory, the trainer's packages and a sound HF export to resume "
        f"from. Then `python -m {TRAINER_MODULE}` (verl's GRPO trainer) runs with the plan's overrides, then the user's Hydra "
        "overrides (key=value, +key=value, ~key): OVERRIDES' first, then those after `--`; an override replaces "
        "the recipe's value for the same key. With NNODES > 1 it starts or joins the Ray cluster first.",
        usage="entrypoint.py run [--progress | --no-progress] [-- key=value ...]",
        exit_codes={
            0: "the trainer finished",
            2: "bad settings, overrides or machine: nothing was started",
            3: "the Ray cluster did not form in RAY_WAIT_TIMEOUT, or a node was lost during the run (a restart "
               "resumes from the last save)",
            4: "PROFILE=smoke: the trainer finished, but the smoke verdict failed (the block says which check)",
        } | {1: "the trainer's own exit code otherwise (1 and others)"},
        examples=["python entrypoint.py run -- actor_rollout_ref.actor.optim.lr=2e-6 trainer.total_training_steps=100"],
    )
    run.add_argument(
        "--progress", action=argparse.BooleanOptionalAction, default=None,
        help=f"one `progress:` line per training step ({PROGRESS_LINE}), read from verl's TensorBoard event "
        "files; default: PROGRESS (on)",
    )  # fmt: skip
    add_prepare_data_parser(commands)
    add_export_commands(commands)
    add_doctor_parser(commands)
    add_replay_parser(commands)
    return parser


def _split_extra(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Arguments before `--` are ours; after it, extra Hydra overrides for the trainer."""
    args = list(argv)
    if "--" in args:
        at = args.index("--")
        return args[:at], args[at + 1 :]
    return args, []


def _cmd_plan(plan: Plan, as_json: bool) -> int:
    print(plan.to_json() if as_json else plan.to_text())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse argv, load and check settings, dispatch. Returns the exit code."""
    ours, extra = _split_extra(sys.argv[1:] if argv is None else argv)
    command = None
    try:
        _Parser.json_errors = "--json" in ours
        parser = _parser()
        args, unknown = parser.parse_known_args(ours)
        command = args.command
        if unknown:
            overrides = [arg for arg in unknown if "=" in arg and not arg.startswith("-")]
            if overrides and command in ("plan", "run"):
                # Each redacted before it is quoted: shlex's quoting of a quote ('"'"') would hide the value from redact.
                shown = " ".join(shlex.quote(redact(arg)) for arg in overrides)
                hint = f"{shown}: Hydra overrides go after `--`, e.g. entrypoint.py {command} -- {shown}"
                return report_errors(command, [hint], EXIT_CONFIG, _Parser.json_errors)
            parser.print_usage(sys.stderr)
            return report_errors(command, [f"unrecognized arguments: {redact(' '.join(unknown))}"], EXIT_CONFIG, _Parser.json_errors)
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
        code = _dispatch(args, extra)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # The reader of our stdout left (`plan | head -3`): what it read is all it wanted. Point
        # stdout at /dev/null so that the interpreter's last flush does not fail again. Only `run`
        # has more to do than print: stopped before its trainer, it exits as a shell's SIGPIPE does.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        if command == "run":
            print("error: stdout was closed before the trainer started", file=sys.stderr)
            return 128 + signal.SIGPIPE
        return 0
    except ModuleNotFoundError as error:
        # Only `plan` runs on the package's own small dependencies; the other commands
        # import torch, transformers, datasets or Ray when they run.
        print(
            f"error: {command} needs the Python package providing {error.name!r}, which is not installed: "
            "use the image (docker compose run --rm gpu|npu ...) or pip install '.[trainer]'",
            file=sys.stderr,
        )
        return EXIT_CONFIG


def console_main() -> NoReturn:
    """The program's start (entrypoint.py, `python -m recipe`, the `grpo-recipe` script): main's code is the exit status.

    It stays so where a Ray driver ran in this process (recipe.process_exit).
    """
    run_program(main)


def _dispatch(args: argparse.Namespace, extra: list[str]) -> int:
    if args.command == "doctor":
        return run_doctor(args)  # reads its settings itself; exit 2 when it cannot run
    if args.command == "replay":
        return run_replay(args)  # needs no settings: the record holds them
    if args.command == "verify-export":
        # Needs no settings: checking a directory must work whatever the environment says.
        return run_verify_export(args)
    try:
        settings = load_settings()
        drift_fields = [*(name.upper() for name in type(settings).model_fields), *DRIFT_FIELDS]
        for warning in [
            *near_miss_warnings(os.environ),
            *env_file_problems(Path(".env")),  # what Compose and the README's `set -a; . ./.env` read here
            *allow_drift_warnings([f for f in settings.allowed_drift if "." not in f], drift_fields),
        ]:
            print(f"warning: {printable(warning)}", file=sys.stderr)
        if args.command == "export":
            return run_export(args, checkpoint_root(settings), settings.model_path, settings.export_strict)
        if args.command == "prepare-data":
            # Preparing data needs neither a valid layout nor a device.
            return run_prepare_data(args, settings.data_dir, settings.model_path)
        plan = build_plan(settings, os.environ, extra)
        if args.command == "plan":
            return _cmd_plan(plan, args.json)
        return run_command(plan, progress=args.progress)
    except RecipeConfigError as error:
        return report_errors(args.command, error.problems, EXIT_CONFIG, getattr(args, "json", False))
    except rules.ClusterError as error:
        # Not 2: a Kubernetes Job gives up at once on a config error, while nodes that
        # came up too late deserve the restart policy's retry.
        for problem in error.problems:
            print(f"error: {one_line(problem)}", file=sys.stderr)
        return EXIT_CLUSTER
