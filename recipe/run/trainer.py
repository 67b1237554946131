"""`run` itself: the preflight and guards, then the trainer supervised (signals passed on), the export watcher, the smoke verdict.

Tests only: RECIPE_TEST_TRAINER (TEST_TRAINER_VARIABLE) names a command that `run` starts
instead of the trainer's Python, with the trainer's whole argv appended and the trainer's
environment, so that `run` executes end to end on a machine without the framework.
It is read in one place, `_run_trainer`; everything before it (checks, resume guard,
smoke assets, Ray bootstrap, export watcher, signal passing) is the real code.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

from recipe.atomic import atomic_write
from recipe.chip import chip_problem
from recipe.cluster import rules, supervisors
from recipe.cluster.ray_node import node_options
from recipe.cluster.shared_storage import ROOT_VARIABLE
from recipe.errors import RecipeConfigError
from recipe.export.report import printable
from recipe.export.watch import watch_exports
from recipe.launch import (
    METRICS_VARIABLE,
    checkpoint_root,
    override_value,
    planned_checkpoint_root,
    planned_step_total,
    planned_training_file,
)
from recipe.plan import Plan
from recipe.record_file import copy_into_new_steps, record_bytes, write_record
from recipe.run.finish import final_save, finished_report, report_mark
from recipe.run.preflight import _bench_data_dir, _smoke_assets_root, run_problems
from recipe.run.progress import event_reader, printing_progress, read_steps
from recipe.run.report import ReportInputs, RunReport, build_report, device_peak
from recipe.run.resume_guard import resume_problem

logger = logging.getLogger("recipe")


#: PROFILE=smoke: the trainer finished, but the verdict (recipe.smoke.verdict) failed a check.
EXIT_SMOKE_FAILED = 4


#: The end-of-run report (recipe.run.report), beside the checkpoints.
REPORT_FILE = "run-report.json"


#: Tests only (see the module docstring): a command run in place of the trainer's Python.
TEST_TRAINER_VARIABLE = "RECIPE_TEST_TRAINER"


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


def _prepare_smoke(root: Path) -> None:
    """PROFILE=smoke: build (or reuse) the tiny model and data the plan points at, offline.

    torch, transformers and pyarrow come with verl, which run_problems has found installed.
    """
    # lazy: the smoke build imports torch and transformers, only with PROFILE=smoke
    from recipe.smoke import prepare_smoke_assets

    print(f"Preparing the smoke model and data in {root}", flush=True)
    prepare_smoke_assets(root)


def prepare_bench(plan: Plan) -> None:
    """PROFILE=bench: write the synthetic prompts for the plan's steps and batch (recipe.bench), when the plan reads them."""
    directory = _bench_data_dir(plan.settings)
    if directory is None:
        return
    # lazy: the bench data import Pillow and datasets, only with PROFILE=bench
    from recipe.bench import bench_rows, write_bench_data

    steps = int(override_value(plan.overrides, "trainer.total_training_steps") or 0)
    train_file = planned_training_file(plan.settings, plan.overrides)
    rows = bench_rows(train_file, plan.settings.checkpoint_dir, plan.settings.train_batch_size, steps)
    if rows is None:
        return  # data.train_files points elsewhere: the user's own prompts
    print(f"Writing the bench's {rows[0]} synthetic prompts in {directory}", flush=True)
    write_bench_data(directory, *rows)


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


def _warn_about_prompt_budget(plan: Plan) -> None:
    """One warning when data.max_prompt_length drops more than 1 % of the training rows (recipe.run.prompt_budget)."""
    # lazy: prompt lengths import the data package (datasets)
    from recipe.run.prompt_budget import prompt_budget_warning, recorded_lengths

    limit = override_value(plan.overrides, "data.max_prompt_length")
    lengths = recorded_lengths(planned_training_file(plan.settings, plan.overrides))
    if isinstance(lengths, str) or limit is None or not limit.isdigit():
        why = lengths if isinstance(lengths, str) else f"data.max_prompt_length={limit}"
        logger.info("prompt lengths against data.max_prompt_length: not checked (%s)", why)
        return
    warning = prompt_budget_warning(lengths, int(limit))
    if warning:
        logger.warning("%s", warning)


def _progress(plan: Plan, wanted: bool | None) -> Any:
    """The steps' reader while the trainer runs (recipe.run.progress): the signs of a failing run always, the
    progress lines as `--progress` or `--no-progress` say when given, else PROGRESS (on by default: logs are where
    users read them)."""
    if wanted is None:
        wanted = {"on": True, "off": False}.get(plan.settings.progress, sys.stdout.isatty())
    total = planned_step_total(plan.settings, plan.overrides)
    emit = (lambda line: print(line, flush=True)) if wanted else None
    return printing_progress(Path(str(plan.env["TENSORBOARD_DIR"])), total, emit, plan.settings.thresholds)


def run_command(plan: Plan, progress: bool | None = None) -> int:
    """`run`: check the machine, then train (or join as a worker); the exit code.

    `progress`: print one line per step (None: as PROGRESS says).
    """
    settings = plan.settings
    done = final_save(plan)
    if done is not None:
        # A restart of a finished run (Compose's on-failure policy, the Job's backoffLimit) trains nothing.
        print(f"run: already finished at {done.describe()}; nothing trained, nothing written. To train on, "
              "raise trainer.total_training_steps; for a new run, another EXPERIMENT_NAME", flush=True)  # fmt: skip
        return 0
    problems = run_problems(plan)
    if not problems and plan.device.name == "npu":
        # vllm-ascend would refuse the node's NPUs only once the model is loaded (recipe.chip).
        mismatch = chip_problem()
        if mismatch:
            problems.append(mismatch)
    role = rules.plan_ray_role(
        settings.nnodes, settings.node_rank, settings.master_addr, settings.ray_port, settings.ray_address
    )
    # The smoke and bench profiles never resume (resume_mode=disable), so an old export cannot block them.
    if not problems and role.runs_trainer and settings.profile == "full":
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
    if role.runs_trainer:
        prepare_bench(plan)
        _warn_about_prompt_budget(plan)
    # The raylet of every node inherits this environment, so Ray workers see it too: each node's
    # checkpoint root among it, read back by the head's shared-storage check (recipe.cluster.shared_storage).
    env = {**_trainer_environment(plan), ROOT_VARIABLE: str(checkpoint_root(settings))}
    logger.info("Ray: %s", role.reason)
    options = node_options(settings.ray_start_args)
    if role.kind == "worker":
        # The head writes its run report when its trainer ended: one written while this node was joined, saying
        # exit 0, is how this node tells a finished run from a lost head (the checkpoint root is shared).
        report = planned_checkpoint_root(settings, plan.overrides) / REPORT_FILE
        mark = report_mark(report)
        return supervisors.run_worker(
            role, join_timeout_s=settings.ray_wait_timeout, rejoin_grace_s=settings.ray_wait_timeout, env=env,
            options=options, run_ended=lambda: finished_report(report, mark),
        )
    with _export_watcher(plan), _progress(plan, progress):
        if role.kind == "single":
            code = _run_trainer(plan.argv, env)
        else:
            common = {
                "resource_name": "GPU" if plan.device.name == "gpu" else "NPU",
                "devices_per_node": plan.layout.ndevices_per_node,
                "timeout_s": settings.ray_wait_timeout,
                "env": env,
                "run_trainer": _run_trainer,
                "checkpoint_dir": str(settings.checkpoint_dir),
            }
            if role.kind == "head":
                code = supervisors.run_head(role, plan.argv, options=options, **common)
            else:
                code = supervisors.run_joined(role, plan.argv, node_ip_address=options.node_ip_address, **common)
    if code > 128:
        # Killed by a signal: after the run's last save (a teardown crash), the run is finished all the same.
        done = final_save(plan)
        if done is not None:
            print(f"run: the trainer's process died of signal {code - 128} (exit {code}) after the run's last save, "
                  f"{done.describe()}: the run finished; exit 0", flush=True)  # fmt: skip
            code = 0
    write_run_report(plan, code)
    # After the watcher's last sweep: the verdict reads its report of the final save.
    return _judge_smoke(plan, code) if settings.profile == "smoke" else code


def write_run_report(plan: Plan, code: int) -> RunReport | None:
    """Whatever the trainer's end: run-report.json beside the checkpoints, and its table; never a changed exit status.

    The report, or None when verl's event files cannot be read (a warning says why).
    """
    directory = Path(str(plan.env["TENSORBOARD_DIR"]))
    try:
        metrics = read_steps(event_reader(directory), directory) if directory.is_dir() else {}
    except Exception as error:  # noqa: BLE001 - a broken event file costs the report, not the run's status
        logger.warning("no run report: cannot read verl's metrics under %s (%s)", printable(str(directory)), error)
        return None
    sizes = plan.model.sizes
    inputs = ReportInputs(code, plan.layout.world_size, sizes.active_per_token if sizes else None,
                          device_peak(plan.device.name, plan.settings.peak_tflops), plan.memory,
                          plan.settings.thresholds)  # fmt: skip
    report = build_report(metrics, inputs)
    target = planned_checkpoint_root(plan.settings, plan.overrides) / REPORT_FILE
    try:
        text = (report.to_json() + "\n").encode()
        target.parent.mkdir(parents=True, exist_ok=True)  # a run that failed before its first save made no root
        # A reader never sees half a file, and a planted link is replaced, not written through.
        atomic_write(target, lambda out: out.write(text))
    except OSError as error:
        logger.warning("cannot write %s: %s", printable(str(target)), error.strerror or type(error).__name__)
    print(report.to_text(printable(str(target))), flush=True)
    return report


def _judge_smoke(plan: Plan, code: int) -> int:
    """PROFILE=smoke: print the verdict block and write it beside the checkpoints; EXIT_SMOKE_FAILED on FAIL."""
    from recipe.smoke.profile import VERDICT_FILE  # lazy: the smoke profile's modules, only with PROFILE=smoke
    # lazy: the smoke profile's modules, only with PROFILE=smoke
    from recipe.smoke.verdict import count_training_prompts, smoke_verdict

    if code != 0:
        print(f"smoke: FAIL (the trainer exited {code}; no verdict on an unfinished run)", flush=True)
        return code
    steps = int(override_value(plan.overrides, "trainer.total_training_steps") or 0)
    model = Path(override_value(plan.overrides, "actor_rollout_ref.model.path") or plan.settings.model_path)
    root = checkpoint_root(plan.settings)
    prompts = count_training_prompts(planned_training_file(plan.settings, plan.overrides), model)
    # A restarted run resumes after its last save; its metrics file holds only the steps it trained (verl's).
    resumed = plan.resume.get("step") if plan.resume.get("action") == "resume" else None
    first = resumed + 1 if isinstance(resumed, int) else 1
    verdict = smoke_verdict(Path(str(plan.env[METRICS_VARIABLE])), steps, root, model, prompts, first)
    print(verdict.to_text(), flush=True)
    target = root / VERDICT_FILE
    try:
        # A CI job reading it never sees half a file, and a planted link is replaced, not written through.
        text = (verdict.to_json() + "\n").encode()
        atomic_write(target, lambda out: out.write(text))
    except OSError as error:
        logger.warning("cannot write %s: %s", target, error)
    return 0 if verdict.passed else EXIT_SMOKE_FAILED
