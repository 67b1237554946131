"""Subcommands and exit codes.

    plan [--json]   print the checked launch plan; needs no accelerator, imports no torch/ray/verl
    run             check the machine too, then run verl's GRPO trainer (`-- key=value` adds Hydra overrides)
    prepare-data {geo3k,gsm8k} [--out DIR] [--source PATH]
                    write verl's train/test parquet (default into $DATA_DIR/<dataset>); 1 if it cannot fetch or write

Exit codes: 0 success; 2 bad settings or an unfit machine (one stderr line per
problem, nothing started or written); otherwise the trainer's own exit code.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import signal
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path
from typing import Sequence

from recipe.data.command import add_prepare_data_parser, run_prepare_data
from recipe.errors import RecipeConfigError
from recipe.plan import Plan, build_plan
from recipe.settings import load_settings

logger = logging.getLogger("recipe")

EXIT_CONFIG = 2

#: Modules the trainer needs per target, and the package that provides each.
TRAINER_MODULES: dict[str, dict[str, str]] = {
    "gpu": {"verl": "verl", "vllm": "vllm", "megatron.bridge": "megatron-bridge"},
    "npu": {"verl": "verl", "vllm_ascend": "vllm-ascend", "torch_npu": "torch_npu", "megatron.bridge": "megatron-bridge"},
}
#: Without these verl fails late or quietly: its length filter drops EVERY image row when
#: qwen_vl_utils is missing, and its geo3k reward imports mathruler (both only in verl-core).
TRAINER_SUPPORT_MODULES = {"qwen_vl_utils": "qwen-vl-utils", "mathruler": "mathruler"}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="entrypoint.py",
        description="GRPO training of Qwen3.5-35B-A3B with verl + Megatron-Bridge on gpu or npu. "
        "Settings come from environment variables (see README).",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    plan = commands.add_parser("plan", help="print the checked launch plan (no accelerator needed)")
    plan.add_argument("--json", action="store_true", help="one JSON document on stdout")
    commands.add_parser("run", help="check the machine, then run the trainer")
    add_prepare_data_parser(commands)
    return parser


def _split_extra(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Arguments before `--` are ours; after it, extra Hydra overrides for the trainer."""
    args = list(argv)
    if "--" in args:
        at = args.index("--")
        return args[:at], args[at + 1 :]
    return args, []


def _readable_file(name: str, path: Path) -> str | None:
    if not path.is_file():
        return f"{name}={str(path)!r}: file not found (run `entrypoint.py prepare-data` or set {name})"
    if not os.access(path, os.R_OK):
        return f"{name}={str(path)!r}: file is not readable by uid {os.getuid()}"
    return None


def run_problems(plan: Plan) -> list[str]:
    """What makes this machine unfit for `run` although the plan itself is sound."""
    settings, device = plan.settings, plan.device
    problems: list[str] = []
    if device.visible_devices == 0:
        problems.append(f"DEVICE={settings.device}: no {device.name} device found ({device.reason}); run needs one")
    elif device.visible_devices < plan.layout.ndevices_per_node:
        problems.append(
            f"NDEVICES_PER_NODE={plan.layout.ndevices_per_node}: only {device.visible_devices} "
            f"{device.name} device(s) visible on this node"
        )
    if not (settings.model_path / "config.json").is_file():
        problems.append(f"MODEL_PATH={str(settings.model_path)!r}: no config.json there (download the model first)")
    for name, path in (("TRAIN_FILES", settings.resolved_train_files), ("VAL_FILES", settings.resolved_val_files)):
        problem = _readable_file(name, path)
        if problem:
            problems.append(problem)
    existing = next((p for p in [settings.checkpoint_dir, *settings.checkpoint_dir.parents] if p.exists()), None)
    if existing is None or not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        problems.append(f"CHECKPOINT_DIR={str(settings.checkpoint_dir)!r}: not writable by uid {os.getuid()}")
    needed = {**TRAINER_MODULES[device.name], **TRAINER_SUPPORT_MODULES}
    missing = [package for module, package in needed.items() if not _importable(module)]
    if missing:
        problems.append(
            f"DEVICE={device.name}: trainer packages not installed ({', '.join(missing)}); "
            f"use the {device.name} image (docker compose run --rm {device.name}), or install the packages "
            f"of docker/{device.name}/requirements.lock beside the trainer extra (pip install '.[trainer]')"
        )
    return problems


def _importable(module: str) -> bool:
    try:
        return find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _trainer_environment(plan: Plan) -> dict[str, str]:
    env = dict(os.environ)
    for name, value in plan.env.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def execute(argv: Sequence[str], env: dict[str, str]) -> int:
    """Run the trainer; SIGTERM/SIGINT are passed on to it and its exit code becomes ours."""
    child = subprocess.Popen(list(argv), env=env, start_new_session=True)

    def forward(signum: int, _frame: object) -> None:
        child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    # A child killed by a signal reports -N; shells and Kubernetes expect 128+N.
    return 128 - code if code < 0 else code


def _cmd_plan(plan: Plan, as_json: bool) -> int:
    print(plan.to_json() if as_json else plan.to_text())
    return 0


def _cmd_run(plan: Plan) -> int:
    problems = run_problems(plan)
    if problems:
        raise RecipeConfigError(problems)
    plan.settings.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    print("Executing: " + shlex.join(plan.argv), flush=True)
    return execute(plan.argv, _trainer_environment(plan))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse argv, load and check settings, dispatch. Returns the exit code."""
    ours, extra = _split_extra(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(ours)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    try:
        settings = load_settings()
        if args.command == "prepare-data":
            # Preparing data needs neither a valid layout nor a device.
            return run_prepare_data(args, settings.data_dir)
        plan = build_plan(settings, os.environ, extra)
        if args.command == "plan":
            return _cmd_plan(plan, args.json)
        return _cmd_run(plan)
    except RecipeConfigError as error:
        for problem in error.problems:
            print(f"error: {problem}", file=sys.stderr)
        return EXIT_CONFIG
