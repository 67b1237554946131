"""One real run for every test here: the recipe's smoke plan on CPU, killed after step 1 and resumed.

The session fixture `e2e` does, once (the phases whose times are printed at the end):
1. assets: the smoke profile's own (recipe.smoke: the tiny Qwen3.5-MoE VLM, its tokenizer, the
   arithmetic data), built where `entrypoint.py run` builds them;
2. plan: `entrypoint.py plan --json` with PROFILE=smoke, SAVE_FREQ=1 and
   `-- trainer.total_training_steps=2 trainer.resume_mode=auto` (and verl's rollout skip, which writes
   step 1's batch for the two-node run to train on: harness/step_batch.py), then the CPU mapping
   (tests/e2e/harness/plan.py) -- the same command for both trainer runs;
3. first run: SIGKILL of the trainer's process group (and of every process it started) once
   global_step_1 is saved (verl's tracker says 1, the save's manifest is there and step 1's
   metrics are logged), before step 2 can finish;
4. second run: the same command; verl resumes from global_step_1 and finishes step 2.
Beside each run, the recipe's export watcher (recipe.export.watch.watch_exports) checks
every finished save, as `entrypoint.py run` does. Tests only read what the run left.

The session fixture `e2e_reference` runs the same plan once more, uninterrupted, in a directory of
its own: what the resumed run's step 2 must equal (test_resume.py).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from recipe.launch import override_value
from tests.e2e.harness.assets import Assets, build_assets
from tests.e2e.harness.plan import (
    ROOT,
    RUN_OVERRIDES,
    STEPS,
    plan_object,
    recipe_plan,
    recipe_settings,
    trainer_command,
)
from tests.e2e.harness.step_batch import batch_overrides
from tests.e2e.harness.trainer import TrainerRun, run_trainer
from tests.e2e.harness.versions import version_problems
from tests.support.skip_policy import pytest_make_collect_report, pytest_runtest_makereport  # noqa: F401

from tests.support.torchvision_cpu import install as install_torchvision_schemas

# This process builds the smoke model and runs processors too (assets, parity), as the trainer's processes do.
install_torchvision_schemas()

#: Everything the run writes (git-ignored); kept after the session for a look at the logs.
WORK = Path(os.environ.get("E2E_WORK", ROOT / ".e2e"))
#: Deadline of each trainer run: a hung Ray worker must not hold CI for longer.
RUN_TIMEOUT_S = float(os.environ.get("E2E_RUN_TIMEOUT_S", "600"))
#: The recipe's watcher checks every 30 s in `run`; here every 2 s, to see the first save before the kill.
WATCH_INTERVAL_S = 2.0
TRACKER = "latest_checkpointed_iteration.txt"
#: Step 1's training batch as the first run trained on it, for the two-node run to train on (harness/step_batch.py).
STEP_1_BATCH = WORK / "step-1-batch"


@dataclass
class Phases:
    """Wall time of each phase, in order, and the peak memory of the trainer runs."""

    seconds: list[tuple[str, float]] = field(default_factory=list)
    peak_memory_bytes: int = 0
    #: Other measured figures worth a line at the end (the two-node losses' times to end).
    notes: list[str] = field(default_factory=list)

    def timed(self, name: str, started: float) -> None:
        self.seconds.append((name, time.monotonic() - started))


PHASES = Phases()
#: The smoke verdict of the reference run, printed at the end as `run` prints it.
VERDICTS: list[str] = []


@dataclass(frozen=True)
class E2ERun:
    """What the run left behind, for the tests to read."""

    assets: Assets
    plan: dict[str, Any]
    argv: list[str]
    checkpoint_dir: Path
    root: Path  # verl's default_local_dir
    first: TrainerRun
    second: TrainerRun
    step1_after_kill: dict[str, str]
    step1_after_resume: dict[str, str]
    step2_after_kill: bool  # step 2's save was complete when the first run was killed (it must not be)
    watcher_reports: dict[int, Any]

    def step_dir(self, step: int) -> Path:
        return self.root / f"global_step_{step}"

    def hf_export(self, step: int) -> Path:
        return self.step_dir(step) / "actor" / "model" / "huggingface"


def file_hashes(directory: Path, skip: frozenset[str] = frozenset()) -> dict[str, str]:
    """{relative path: sha256} of every file under `directory`, except those named in `skip`."""
    hashes = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file() and path.name not in skip:
            hashes[str(path.relative_to(directory))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return hashes


class Watcher:
    """recipe.export.watch.watch_exports in a daemon thread, as `entrypoint.py run` runs it beside the trainer."""

    def __init__(self, root: Path, reference: Path) -> None:
        from recipe.export.watch import watch_exports

        self.reports: dict[int, Any] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=lambda: self.reports.update(
                watch_exports(root, self._stop, interval_s=WATCH_INTERVAL_S, reference=reference)
            ),
            name="hf-export-check",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> dict[int, Any]:
        """One last sweep (as `run` does when the trainer exits), then the reports by step."""
        self._stop.set()
        self._thread.join(timeout=300)
        return self.reports


def _saved(root: Path, step: int) -> bool:
    """verl has finished the save of `step`: its tracker names it and the save's manifest (written last) is there."""
    from recipe.export.watch import MANIFEST

    try:
        tracked = (root / TRACKER).read_text().strip()
    except OSError:
        return False
    return tracked == str(step) and (root / f"global_step_{step}" / MANIFEST).is_file()


def _check_environment() -> None:
    """Fail at once when a pinned version changed or `tests` is not this checkout's."""
    problems = version_problems()
    if problems:
        pytest.fail("pinned versions changed:\n" + "\n".join(problems), pytrace=False)
    import tests

    if not Path(tests.__file__).resolve().is_relative_to(ROOT):
        pytest.fail(f"`tests` is imported from {tests.__file__}, not the checkout (verl's wheel ships one)")


def _fresh(directory: Path) -> Path:
    if directory.exists():
        shutil.rmtree(directory)  # resume_mode=auto would resume an old checkpoint
    directory.mkdir(parents=True)
    return directory


@pytest.fixture(scope="session")
def e2e() -> Iterator[E2ERun]:
    """The run (see the module docstring); fails at once when a pinned version changed."""
    _check_environment()

    started = time.monotonic()
    run_dir = _fresh(WORK / "run")
    checkpoint_dir = run_dir / "checkpoints"
    assets = build_assets(checkpoint_dir)
    shutil.rmtree(STEP_1_BATCH, ignore_errors=True)  # the first run writes it anew; the resumed run starts after it
    plan = recipe_plan(recipe_settings(checkpoint_dir), (*RUN_OVERRIDES, *batch_overrides(STEP_1_BATCH)))
    argv, env = trainer_command(plan)
    root = Path(str(override_value(plan["overrides"], "trainer.default_local_dir")))  # where verl saves
    # `run` makes it (its run record goes there first); verl's file logger of the smoke metrics needs it.
    root.mkdir(parents=True, exist_ok=True)
    PHASES.timed("assets and plan (smoke profile)", started)

    started = time.monotonic()
    watcher = Watcher(root, assets.model)
    first_log = run_dir / "first.log"

    def step_1_done() -> bool:
        # verl saves inside the step and prints the step's metrics after the save: wait for both.
        return _saved(root, 1) and "step:1 - " in first_log.read_text(errors="replace")

    first = run_trainer(argv, env, run_dir, first_log, RUN_TIMEOUT_S, kill_when=step_1_done)
    reports = watcher.stop()
    PHASES.timed("first run (killed after step 1)", started)
    step1_after_kill = file_hashes(root / "global_step_1", skip=frozenset({"hf_export_report.json"}))
    step2_after_kill = _saved(root, 2) or (root / "global_step_2" / "actor" / "ckpt_contents.json").is_file()
    if not first.killed_by_harness:
        why = f"the first run ended (exit {first.returncode}) before step 1 was saved"
        pytest.fail(f"{why}:\n{first.tail()}", pytrace=False)

    started = time.monotonic()
    watcher = Watcher(root, assets.model)
    second = run_trainer(argv, env, run_dir, run_dir / "second.log", RUN_TIMEOUT_S)
    reports.update(watcher.stop())
    PHASES.timed("second run (resumed, step 2)", started)
    PHASES.peak_memory_bytes = max(first.peak_memory_bytes, second.peak_memory_bytes)

    yield E2ERun(
        assets=assets,
        plan=plan,
        argv=argv,
        checkpoint_dir=checkpoint_dir,
        root=root,
        first=first,
        second=second,
        step1_after_kill=step1_after_kill,
        step1_after_resume=file_hashes(root / "global_step_1", skip=frozenset({"hf_export_report.json"})),
        step2_after_kill=step2_after_kill,
        watcher_reports=reports,
    )


@dataclass(frozen=True)
class ReferenceRun:
    """The same plan, uninterrupted: steps 1 and 2 in one trainer process, judged by the smoke verdict."""

    assets: Assets
    plan: dict[str, Any]
    root: Path
    run: TrainerRun
    verdict: Any  # recipe.smoke.verdict.Verdict
    #: The run report `run` writes at the trainer's end (recipe.run.report.RunReport), and where.
    report: Any = None
    report_file: Path | None = None

    def step_dir(self, step: int) -> Path:
        return self.root / f"global_step_{step}"

    @property
    def metrics_file(self) -> Path:
        """Where verl's file logger wrote the metrics of each step (the smoke plan sets it)."""
        from recipe.launch import METRICS_VARIABLE

        return Path(self.plan["env"][METRICS_VARIABLE])


@pytest.fixture(scope="session")
def e2e_reference(e2e: E2ERun) -> ReferenceRun:
    """The e2e's plan in a directory of its own, run to its end without a kill (after the killed and resumed run),
    with the export watcher beside it, and the run report and the smoke verdict after it, as `entrypoint.py run` does."""
    from recipe.run.trainer import REPORT_FILE, write_run_report
    from recipe.smoke.verdict import count_training_prompts, smoke_verdict

    started = time.monotonic()
    run_dir = _fresh(WORK / "reference")
    checkpoint_dir = run_dir / "checkpoints"
    assets = build_assets(checkpoint_dir)
    plan = recipe_plan(recipe_settings(checkpoint_dir))
    argv, env = trainer_command(plan)
    root = Path(str(override_value(plan["overrides"], "trainer.default_local_dir")))
    root.mkdir(parents=True, exist_ok=True)  # as `run` makes it (see e2e)
    watcher = Watcher(root, assets.model)
    run = run_trainer(argv, env, run_dir, run_dir / "reference.log", RUN_TIMEOUT_S)
    watcher.stop()
    PHASES.timed("reference run (uninterrupted, 2 steps)", started)
    PHASES.peak_memory_bytes = max(PHASES.peak_memory_bytes, run.peak_memory_bytes)
    if run.returncode != 0:
        pytest.fail(f"the uninterrupted reference run exited {run.returncode}:\n{run.tail()}", pytrace=False)
    started = time.monotonic()
    in_process = plan_object(recipe_settings(checkpoint_dir))
    assert in_process.overrides == plan["overrides"], "the in-process plan is not the CLI's"
    report = write_run_report(in_process, run.returncode)
    PHASES.timed("run report of the reference run", started)
    reference = ReferenceRun(assets, plan, root, run, None)
    prompts = count_training_prompts(assets.train_file, assets.model)
    verdict = smoke_verdict(reference.metrics_file, STEPS, root, assets.model, prompts)
    VERDICTS.append(verdict.to_text())
    return ReferenceRun(assets, plan, root, run, verdict, report, root / REPORT_FILE)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The smoke verdict, the phase times and the peak memory, at the end of the run (CI's budget: 12 min, 14 GB)."""
    for text in VERDICTS:
        terminalreporter.section("smoke verdict of the uninterrupted run (recipe.smoke.verdict)")
        for line in text.splitlines():
            terminalreporter.write_line(line)
    if not PHASES.seconds:
        return
    terminalreporter.section("e2e phases")
    for name, seconds in PHASES.seconds:
        terminalreporter.write_line(f"{name:<40} {seconds:7.1f} s")
    total = sum(seconds for _, seconds in PHASES.seconds)
    terminalreporter.write_line(f"{'total':<40} {total:7.1f} s")
    peak = PHASES.peak_memory_bytes / 2**30
    terminalreporter.write_line(f"peak memory of a trainer run (PSS of all its processes and pytest's): {peak:.1f} GiB")
    for note in PHASES.notes:
        terminalreporter.write_line(note)
