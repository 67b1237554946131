"""Subcommands and exit codes.

    plan [--json]   print the checked launch plan; needs no accelerator, imports no torch/ray/verl
    run             check the machine too, then run verl's GRPO trainer (`-- key=value` adds Hydra overrides)
    prepare-data {geo3k,gsm8k} [--out DIR] [--source PATH]
                    write verl's train/test parquet (default into $DATA_DIR/<dataset>); 1 if it cannot fetch or write

Exit codes: 0 success; 2 bad settings or an unfit machine (one stderr line per
problem, nothing started or written); 3 the Ray cluster of several nodes did not
form in time (names the missing nodes); 4 (PROFILE=smoke) the trainer finished but the
smoke verdict failed a check; otherwise the trainer's own exit code.

Tests only: RECIPE_TEST_TRAINER (TEST_TRAINER_VARIABLE) names a command that `run` starts
instead of the trainer's Python, with the trainer's whole argv appended and the trainer's
environment, so that `run` executes end to end on a machine without the framework.
It is read in one place, `_run_trainer`; everything before it (checks, resume guard,
smoke assets, Ray bootstrap, export watcher, signal passing) is the real code.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
from contextlib import contextmanager
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Iterator, Sequence

from recipe import cluster
from recipe.chip import chip_problem
from recipe.data.command import add_prepare_data_parser, run_prepare_data
from recipe.digests import FileRefused, open_regular, read_bounded
from recipe.doctor.command import add_doctor_parser, run_doctor
from recipe.errors import RecipeConfigError
from recipe.help import add_command
from recipe.export.report import printable
from recipe.export.commands import add_export_commands, run_export, run_verify_export
from recipe.export.watch import MANIFEST, REPORT_NAME, watch_exports
from recipe.launch import METRICS_VARIABLE, checkpoint_root, override_value, resume_mode_problem
from recipe.plan import Plan, TRACKER_NAME, build_plan
from recipe.record_file import copy_into_new_steps, record_bytes, write_record
from recipe.replay import add_replay_parser, run_replay
from recipe.settings import Settings, load_settings, near_miss_warnings

logger = logging.getLogger("recipe")

EXIT_CONFIG = 2
EXIT_CLUSTER = 3
#: PROFILE=smoke: the trainer finished, but the verdict (recipe.smoke.verdict) failed a check.
EXIT_SMOKE_FAILED = 4

#: Tests only (see the module docstring): a command run in place of the trainer's Python.
TEST_TRAINER_VARIABLE = "RECIPE_TEST_TRAINER"

#: Modules the trainer needs per target, and the package that provides each.
TRAINER_MODULES: dict[str, dict[str, str]] = {
    "gpu": {"verl": "verl", "vllm": "vllm", "megatron.bridge": "megatron-bridge"},
    "npu": {"verl": "verl", "vllm_ascend": "vllm-ascend", "torch_npu": "torch_npu", "megatron.bridge": "megatron-bridge"},
}
#: Without these verl fails late or quietly, and no package declares them outside verl's
#: verl-core extra: its length filter drops EVERY image row when qwen_vl_utils is missing,
#: its geo3k reward imports mathruler, its v1 TaskRunner imports transfer_queue first thing
#: (trainer.use_v1 defaults to true), and Megatron-Bridge's training config imports
#: megatron.energon on verl's Megatron path.
TRAINER_SUPPORT_MODULES = {
    "qwen_vl_utils": "qwen-vl-utils",
    "mathruler": "mathruler",
    "transfer_queue": "TransferQueue",
    "megatron.energon": "megatron-energon",
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="entrypoint.py",
        description="GRPO training of Qwen3.5-35B-A3B with verl + Megatron-Bridge on gpu or npu. "
        "Settings come from environment variables (see README).",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    plan = add_command(
        commands, "plan",
        summary="print the checked launch plan (no accelerator needed)",
        description="Read the settings from the environment, check them against the model's config.json (or the "
        "built-in profile) and the device's layout rules, compose the trainer's Hydra overrides against the "
        "installed verl, and print the layout, where each value came from and the exact trainer command. "
        "Starts nothing and writes nothing. Extra Hydra overrides for verl go after `--`.",
        usage="entrypoint.py plan [--json] [-- key=value ...]",
        exit_codes={0: "the plan is valid (printed)", 2: "bad settings or overrides: one `error:` line each on stderr"},
        examples=["TP=4 EP=8 python entrypoint.py plan", "python entrypoint.py plan --json -- trainer.total_epochs=1"],
    )
    plan.add_argument("--json", action="store_true", help="one JSON document on stdout")
    add_command(
        commands, "run",
        summary="check the machine, then run the trainer",
        description="Everything `plan` checks, then the machine: devices visible, the model's config.json, readable "
        "data files, a writable checkpoint directory, the trainer's packages and a sound HF export to resume "
        "from. Then `python -m verl.trainer.main_ppo` runs with the plan's overrides, followed by any Hydra "
        "overrides given after `--` (key=value, +key=value, ~key); an override replaces the recipe's value "
        "for the same key. With NNODES > 1 it starts or joins the Ray cluster first.",
        usage="entrypoint.py run [-- key=value ...]",
        exit_codes={
            0: "the trainer finished",
            2: "bad settings, overrides or machine: nothing was started",
            3: "the Ray cluster did not form in RAY_WAIT_TIMEOUT",
            4: "PROFILE=smoke: the trainer finished, but the smoke verdict failed (the block says which check)",
        } | {1: "the trainer's own exit code otherwise (1 and others)"},
        examples=["python entrypoint.py run -- trainer.total_epochs=1 trainer.save_freq=10"],
    )
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


def _readable_file(name: str, path: Path) -> str | None:
    if not path.is_file():
        return f"{name}={str(path)!r}: file not found (run `entrypoint.py prepare-data` or set {name})"
    if not os.access(path, os.R_OK):
        return f"{name}={str(path)!r}: file is not readable by uid {os.getuid()}"
    return None


def _smoke_assets_root(settings: Settings) -> Path | None:
    if settings.profile != "smoke":
        return None
    from recipe.smoke import assets_root

    return assets_root(settings.checkpoint_dir)


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
    # PROFILE=smoke builds its own model and data (under CHECKPOINT_DIR/smoke-assets) once
    # every check has passed: those paths cannot exist yet; paths pointed elsewhere are checked.
    built = _smoke_assets_root(settings)

    def made_by_run(path: Path) -> bool:
        return built is not None and path.is_relative_to(built)

    if not made_by_run(settings.model_path) and not (settings.model_path / "config.json").is_file():
        problems.append(f"MODEL_PATH={str(settings.model_path)!r}: no config.json there (download the model first)")
    for name, path in (("TRAIN_FILES", settings.resolved_train_files), ("VAL_FILES", settings.resolved_val_files)):
        problem = None if made_by_run(path) else _readable_file(name, path)
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


#: Where verl 0.9.1's Megatron checkpoint manager loads the HF weights of a step from
#: (get_hf_model_checkpoint_path: <step>/actor/model/huggingface; the pre-v2 layout it refuses).
RESUMED_HF_DIR = "actor/model/huggingface"
#: A tracker larger than this holds no step number the guard will read.
MAX_TRACKER_BYTES = 1 << 20
#: Every refusal of the guard ends with these ways out.
RESUME_WAY_OUT = (
    "resume from a step you checked with `-- trainer.resume_mode=resume_path trainer.resume_from_path=<its "
    "global_step_N dir>`, start afresh with `-- trainer.resume_mode=disable`, or move that step away"
)


class ResumeCheckError(Exception):
    """The guard cannot tell what verl would resume from: it refuses."""


def tracked_step_dir(root: Path) -> tuple[Path, int] | None:
    """The step directory verl 0.9.1's `find_latest_ckpt_path(root)` returns, and its step; None where verl trains afresh.

    Mirrors verl (verl/utils/checkpoint/checkpoint_manager.py): no tracker -> None; else
    `int(open(tracker, "rb").read().decode())` (so `040`, ` 40\n`, `4_0` and `+40` all mean 40)
    and `os.path.join(root, f"global_step_{n}")`, None when that path does not exist. Where
    verl would raise (undecodable or non-integer text, a directory) or hang (a FIFO: verl's open
    waits for a writer), this raises ResumeCheckError; it never opens anything in a blocking way.
    """
    tracker = os.path.join(root, TRACKER_NAME)
    if not os.path.exists(tracker):
        return None
    try:
        fd, _ = open_regular(Path(tracker), MAX_TRACKER_BYTES)
    except FileRefused as error:
        raise ResumeCheckError(f"{error}: not a step number (verl would fail or wait forever on it)") from None
    except OSError as error:
        raise ResumeCheckError(f"{tracker} cannot be opened ({error.strerror})") from None
    try:
        data = read_bounded(fd, MAX_TRACKER_BYTES)
    except (OSError, FileRefused) as error:
        raise ResumeCheckError(f"{tracker} cannot be read ({getattr(error, 'strerror', None) or error})") from None
    finally:
        os.close(fd)
    try:
        iteration = int(data.decode())
    except (UnicodeDecodeError, ValueError):
        raise ResumeCheckError(
            f"{tracker} holds {data[:40]!r}, which verl reads with int(f.read().decode()) and would fail on"
        ) from None
    step_dir = os.path.join(root, f"global_step_{iteration}")
    if not os.path.exists(step_dir):
        return None  # verl: "Checkpoint does not exist", training from scratch
    return Path(step_dir), iteration


def _resume_mode(plan: Plan) -> tuple[str | None, str | None]:
    """(mode, None) for the trainer.resume_mode verl will read, or (None, problem) when it cannot be told."""
    from recipe.plan import compose_verl_config, verl_config_dir

    config_dir = verl_config_dir()
    if config_dir is None:
        return None, "trainer.resume_mode: cannot be read without verl's trainer config (verl is not installed)"
    try:
        from omegaconf import OmegaConf

        trainer = compose_verl_config(plan.overrides, config_dir).get("trainer")
        mode = OmegaConf.to_container(trainer, resolve=False).get("resume_mode") if trainer is not None else None
        interpolated = trainer is not None and "resume_mode" in trainer and OmegaConf.is_interpolation(
            trainer, "resume_mode"
        )
    except Exception as error:  # the plan composed; anything else means the guard cannot read it
        first = next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)
        return None, f"trainer.resume_mode: cannot be read from verl's composed config ({first[:300]})"
    problem = resume_mode_problem(mode, interpolated)
    return (None, problem) if problem else (mode, None)


def resume_problem(plan: Plan) -> str | None:
    """Refuse to resume from a checkpoint the guard cannot vouch for; None when resuming is safe (or not asked).

    With verl's defaults (no Megatron dist checkpoint) the HF export of a save is the
    only copy of the model weights, and `trainer.resume_mode=auto` reloads it: training
    on from an export that lost tensors would silently continue from a damaged model.
    Mirrors how verl 0.9.1 picks the step (tracked_step_dir) and refuses whatever it
    cannot check: an unreadable tracker, a save without its manifest, an HF export that is
    missing, cannot be checked or is broken, a resume mode it cannot read. Writes nothing.
    `resume_mode=resume_path` (a step the user chose) and `disable` pass.
    """
    mode, problem = _resume_mode(plan)
    if problem:
        return f"{problem}; {RESUME_WAY_OUT}"
    if mode != "auto":
        return None  # the user chose where to resume from (or not to), after `--`
    where = f"CHECKPOINT_DIR={str(plan.settings.checkpoint_dir)!r}"
    try:
        tracked = tracked_step_dir(checkpoint_root(plan.settings))
    except ResumeCheckError as error:
        return f"{where}: cannot tell which checkpoint verl would resume from: {error}; {RESUME_WAY_OUT}"
    if tracked is None:
        return None
    step_dir, step = tracked
    if not (step_dir / MANIFEST).is_file():
        return (
            f"{where}: the checkpoint resume would load (step {step}) is incomplete: {step_dir / MANIFEST}, "
            f"which verl writes last, is missing; {RESUME_WAY_OUT}"
        )
    export = step_dir / RESUMED_HF_DIR
    if not export.is_dir():
        return (
            f"{where}: the checkpoint resume would load (step {step}) has no HF export at {export} (the weights "
            f"verl reloads), so it cannot be checked; {RESUME_WAY_OUT}"
        )
    try:
        from recipe.export.hf_check import verify_export

        report = verify_export(export, reference=None)
    except Exception as error:  # ExportCheckError, or anything hostile files make the checker raise
        return (
            f"{where}: the HF export of the checkpoint resume would load (step {step}) cannot be checked "
            f"({str(error)[:300]}); {RESUME_WAY_OUT}"
        )
    if report.status != "broken":
        return None
    lost = ", ".join((report.missing + report.critical + report.errors)[:5]) or "see its report"
    saved_report = export.parent / REPORT_NAME
    see = f"; see {saved_report}" if saved_report.is_file() else ""
    return (
        f"{where}: the checkpoint resume would load (step {step}) has a broken HF export ({lost}){see}. "
        f"Do not train on from it: {RESUME_WAY_OUT}"
    )


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


def _prepare_smoke(root: Path) -> None:
    """PROFILE=smoke: build (or reuse) the tiny model and data the plan points at, offline.

    torch, transformers and pyarrow come with verl, which run_problems has found installed.
    """
    from recipe.smoke import prepare_smoke_assets

    print(f"Preparing the smoke model and data in {root}", flush=True)
    prepare_smoke_assets(root)


@contextmanager
def _export_watcher(plan: Plan) -> Iterator[None]:
    """Check each HF export as soon as verl finishes that save; loud (ERROR) when broken.

    The run record goes in first, and into each step saved from now on, so that any
    checkpoint says what made it.
    """
    root = checkpoint_root(plan.settings)
    existing = {step.name for step in root.glob("global_step_*")}
    record = record_bytes(plan.provenance)
    try:
        write_record(root, record)
    except OSError as error:  # a full disk, a root that is a file: nothing has started yet
        raise RecipeConfigError(
            [f"CHECKPOINT_DIR={str(plan.settings.checkpoint_dir)!r}: cannot write the run record into "
             f"{printable(str(root))} ({error.strerror or type(error).__name__}); nothing was started"]
        ) from None

    def on_report(export: Any, report: Any) -> None:
        copy_into_new_steps(root, existing, record)

    stop = threading.Event()
    watcher = threading.Thread(
        target=watch_exports,
        args=(root, stop),
        kwargs={"reference": plan.settings.model_path, "on_report": on_report},
        name="hf-export-check",
        daemon=True,
    )
    watcher.start()
    try:
        yield
    finally:
        stop.set()  # one last sweep: the final save lands right before the trainer exits
        watcher.join(timeout=600)
        copy_into_new_steps(root, existing, record)  # also steps saved without an HF export


def _run_trainer(argv: Sequence[str], env: dict[str, str]) -> int:
    print("Executing: " + shlex.join(argv), flush=True)
    stand_in = os.environ.get(TEST_TRAINER_VARIABLE)
    if stand_in:
        logger.warning("%s is set: running %s instead of the trainer (tests only)", TEST_TRAINER_VARIABLE, stand_in)
        argv = [*shlex.split(stand_in), *argv]
    return execute(argv, env)


def _cmd_run(plan: Plan) -> int:
    settings = plan.settings
    problems = run_problems(plan)
    if not problems and plan.device.name == "npu":
        # vllm-ascend would refuse the node's NPUs only once the model is loaded (recipe.chip).
        mismatch = chip_problem()
        if mismatch:
            problems.append(mismatch)
    role = cluster.plan_ray_role(
        settings.nnodes, settings.node_rank, settings.master_addr, settings.ray_port, settings.ray_address
    )
    # The smoke profile never resumes (resume_mode=disable), so an old smoke export cannot block it.
    if not problems and role.runs_trainer and settings.profile != "smoke":
        # Only once the machine is fit: the check imports torch and transformers.
        problem = resume_problem(plan)
        if problem:
            problems.append(problem)
    if problems:
        raise RecipeConfigError(problems)
    try:
        settings.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise RecipeConfigError(
            [f"CHECKPOINT_DIR={str(settings.checkpoint_dir)!r}: cannot be created ({error.strerror or type(error).__name__})"]
        ) from None
    smoke_root = _smoke_assets_root(settings)
    if smoke_root is not None:
        _prepare_smoke(smoke_root)
    # The raylet of every node inherits this environment, so Ray workers see it too.
    env = _trainer_environment(plan)
    logger.info("Ray: %s", role.reason)
    if role.kind == "worker":
        return cluster.run_worker(
            role, join_timeout_s=settings.ray_wait_timeout, rejoin_grace_s=settings.ray_wait_timeout, env=env
        )
    with _export_watcher(plan):
        if role.kind == "single":
            code = _run_trainer(plan.argv, env)
        else:
            start = cluster.run_head if role.kind == "head" else cluster.run_joined
            code = start(
                role,
                plan.argv,
                resource_name="GPU" if plan.device.name == "gpu" else "NPU",
                devices_per_node=plan.layout.ndevices_per_node,
                timeout_s=settings.ray_wait_timeout,
                env=env,
                run_trainer=_run_trainer,
            )
    # After the watcher's last sweep: the verdict reads its report of the final save.
    return _judge_smoke(plan, code) if settings.profile == "smoke" else code


def _judge_smoke(plan: Plan, code: int) -> int:
    """PROFILE=smoke: print the verdict block and write it beside the checkpoints; EXIT_SMOKE_FAILED on FAIL."""
    from recipe.smoke.profile import VERDICT_FILE
    from recipe.smoke.verdict import smoke_verdict

    if code != 0:
        print(f"smoke: FAIL (the trainer exited {code}; no verdict on an unfinished run)", flush=True)
        return code
    steps = int(override_value(plan.overrides, "trainer.total_training_steps") or 0)
    model = Path(override_value(plan.overrides, "actor_rollout_ref.model.path") or plan.settings.model_path)
    root = checkpoint_root(plan.settings)
    verdict = smoke_verdict(Path(str(plan.env[METRICS_VARIABLE])), steps, root, model)
    print(verdict.to_text(), flush=True)
    target = root / VERDICT_FILE
    try:
        partial = target.with_name(f".{target.name}.partial")
        partial.write_text(verdict.to_json() + "\n", encoding="utf-8")
        partial.replace(target)  # a CI job reading it never sees half a file
    except OSError as error:
        logger.warning("cannot write %s: %s", target, error)
    return 0 if verdict.passed else EXIT_SMOKE_FAILED


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse argv, load and check settings, dispatch. Returns the exit code."""
    ours, extra = _split_extra(sys.argv[1:] if argv is None else argv)
    command = None
    try:
        args = _parser().parse_args(ours)
        command = args.command
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
        for warning in near_miss_warnings(os.environ):
            print(f"warning: {warning}", file=sys.stderr)
        if args.command == "export":
            return run_export(args, checkpoint_root(settings), settings.model_path, settings.export_strict)
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
    except cluster.ClusterError as error:
        # Not 2: a Kubernetes Job gives up at once on a config error, while nodes that
        # came up too late deserve the restart policy's retry.
        for problem in error.problems:
            print(f"error: {problem}", file=sys.stderr)
        return EXIT_CLUSTER
