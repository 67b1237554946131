"""Kill and resume: SIGKILL after step 1's save, resume_mode=auto, and the recipe's resume guard."""

from __future__ import annotations

import os
import re
import shutil
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.e2e.conftest import E2ERun, ReferenceRun
from tests.e2e.harness.checkpoint import (
    FLAT_STATE,
    batch_rows,
    differences,
    optimizer_state,
    saved_state,
)
from tests.e2e.harness.metrics import step_metrics
from tests.e2e.harness.plan import RUN_OVERRIDES, recipe_settings


def test_first_run_killed_between_step_1_save_and_step_2(e2e: E2ERun) -> None:
    """The harness SIGKILLed the first run once step 1 was saved, before step 2 finished."""
    assert e2e.first.killed_by_harness, e2e.first.tail()
    assert e2e.first.returncode == -signal.SIGKILL
    assert sorted(step_metrics(e2e.first.text())) == [1]
    assert e2e.step1_after_kill, "global_step_1 was empty after the kill"
    # Step 2 never completed before the kill: its save's manifest (written last) was not there.
    assert not e2e.step2_after_kill


def test_second_run_resumed_from_step_1(e2e: E2ERun) -> None:
    """verl says it resumes from global_step_1 and trains only step 2."""
    log = e2e.second.text()
    step_1 = re.escape(str(e2e.step_dir(1)))
    assert re.search(rf"Resuming from {step_1}, setting global step to 1", log), e2e.second.tail()
    assert "Training from scratch" not in log
    assert sorted(step_metrics(log)) == [2]


def test_step_1_files_unchanged_by_the_resume(e2e: E2ERun) -> None:
    """Resuming reads step 1 and writes nothing there: every file has the same bytes."""
    assert e2e.step1_after_resume == e2e.step1_after_kill


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _resume_problem(e2e: E2ERun, checkpoint_dir: Path) -> str | None:
    """The recipe's resume guard (what `entrypoint.py run` asks before resuming) on `checkpoint_dir`."""
    from recipe.plan import build_plan
    from recipe.run.resume_guard import resume_problem
    from recipe.settings import load_settings

    with _environment(recipe_settings(checkpoint_dir)):
        plan = build_plan(load_settings(), os.environ, RUN_OVERRIDES)
    return resume_problem(plan)


def _copy_checkpoints(e2e: E2ERun, target: Path) -> Path:
    """The run's checkpoints under another CHECKPOINT_DIR (same project/experiment), TensorBoard logs left out."""
    shutil.copytree(e2e.root, target / e2e.root.relative_to(e2e.checkpoint_dir))
    return target


def test_resume_guard_accepts_the_run(e2e: E2ERun, tmp_path: Path) -> None:
    """The run's own checkpoints: the guard lets `run` resume (from step 2)."""
    assert _resume_problem(e2e, _copy_checkpoints(e2e, tmp_path)) is None


def test_resume_guard_refuses_a_corrupt_newest_export(e2e: E2ERun, tmp_path: Path) -> None:
    """Truncate a shard of the newest export: the guard refuses to resume from it and says why."""
    checkpoints = _copy_checkpoints(e2e, tmp_path)
    export = checkpoints / e2e.hf_export(2).relative_to(e2e.checkpoint_dir)
    shard = sorted(export.glob("*.safetensors"))[0]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    problem = _resume_problem(e2e, checkpoints)
    assert problem is not None
    assert "(step 2) has a broken HF export" in problem, problem
    assert "trainer.resume_mode=resume_path" in problem


# The resumed run's step 2 is the uninterrupted run's step 2, to the bit --------------------------------------------
#: What makes the two runs equal (docs/smoke.md): vLLM one sequence at a time without a prefix cache, a seed per sample
#: (tests/e2e/cpu/rollouts.py), so both runs draw the same tokens; and each training batch put back in submission order
#: (tests/e2e/cpu/rollouts.py), so every sum over the batch (gradient accumulation, GRPO's group means, the metrics) adds
#: in the same order. Before that, the samples reached the actor in the order they finished, which changed from run to
#: run: the weights were 6.5e-2 of one optimizer step apart and Adam's moments 1.7e-2 (measured).
#: Step 2's metrics that measure the clock or the memory, the only ones that may differ.
CLOCK_AND_MEMORY = ("timing_s/", "timing_per_token_ms/", "perf/mfu/", "perf/throughput", "perf/time_per_step", "actor/perf/")
#: The actor's own metrics of step 2: they follow from the weights after step 1 and the drawn tokens.
ACTOR_METRICS = ("actor/pg_loss", "actor/grad_norm", "actor/entropy")


def test_both_finished_runs_exit_0(e2e: E2ERun, e2e_reference: ReferenceRun) -> None:
    """The resumed and the uninterrupted run end with status 0 (recipe.trainer_main: no teardown crash, issue 39)."""
    assert (e2e.second.returncode, e2e_reference.run.returncode) == (0, 0), e2e.second.tail()


def test_data_order_survives_the_resume(e2e: E2ERun, e2e_reference: ReferenceRun) -> None:
    """The same prompts in the same order: step 1 as in the uninterrupted run, and step 2 continues the epoch
    (a dataloader restarted from its beginning would serve step 1's prompts again)."""
    reference = batch_rows(e2e_reference.run.text())
    assert sorted(reference) == [1, 2] and reference[1] != reference[2], reference
    assert batch_rows(e2e.first.text())[1] == reference[1]
    assert batch_rows(e2e.second.text()) == {2: reference[2]}


def test_optimizer_schedule_survives_the_resume(e2e: E2ERun, e2e_reference: ReferenceRun) -> None:
    """Adam's step, the learning rate and the scheduler's step after step 2 are the uninterrupted run's."""
    resumed, reference = optimizer_state(e2e.step_dir(2)), optimizer_state(e2e_reference.step_dir(2))
    assert set(reference.adam_steps) == {2.0}, reference.adam_steps
    assert resumed.adam_steps == reference.adam_steps
    assert resumed.learning_rates == reference.learning_rates
    assert resumed.scheduler_steps == reference.scheduler_steps


def _unequal(state: dict[str, Any], reference: dict[str, Any]) -> list[str]:
    """The flat states (weights, moments) not equal to `reference`'s to the bit, with how many elements differ."""
    return [f"{name}: {int((state[name] != reference[name]).sum())} of {reference[name].numel()} elements differ"
            for name in FLAT_STATE if not state[name].equal(reference[name])]  # fmt: skip


def test_resumed_step_2_state_equals_the_uninterrupted_one(e2e: E2ERun, e2e_reference: ReferenceRun) -> None:
    """After step 2: the RNG states, the LR scheduler, the data loader's state, the fp32 master weights and both Adam
    moments are the uninterrupted run's to the bit."""
    import torch

    resumed, reference = e2e.step_dir(2), e2e_reference.step_dir(2)
    assert differences(saved_state(resumed / "actor/extra/dist_ckpt"), saved_state(reference / "actor/extra/dist_ckpt")) == []
    loader = [torch.load(step / "data.pt", weights_only=False) for step in (resumed, reference)]
    assert differences(*loader) == []
    after = optimizer_state(reference).flat
    assert _unequal(optimizer_state(resumed).flat, after) == []
    # What the comparison is for: step 1's state in place of step 2's (a dropped step) differs everywhere.
    assert len(_unequal(optimizer_state(e2e_reference.step_dir(1)).flat, after)) == len(FLAT_STATE)


def test_resumed_step_2_metrics_equal_the_uninterrupted_ones(e2e: E2ERun, e2e_reference: ReferenceRun) -> None:
    """Step 2's metrics (lengths, rewards, advantages, loss, grad norm, entropy, KL, the rollout-vs-actor
    comparisons...) are the uninterrupted run's, every one but the clock's and the memory's."""
    resumed = step_metrics(e2e.second.text())[2]
    reference = step_metrics(e2e_reference.run.text())
    kept = sorted(key for key in reference[2] if not key.startswith(CLOCK_AND_MEMORY))
    assert len(kept) >= 60 and "critic/rewards/mean" in kept and set(ACTOR_METRICS) <= set(kept), sorted(reference[2])
    assert {key: resumed.get(key) for key in kept} == {key: reference[2][key] for key in kept}
    # What the comparison is for: step 1's metrics in place of step 2's (a replayed step) differ in the actor's.
    assert all(reference[1][key] != reference[2][key] for key in ACTOR_METRICS), (reference[1], reference[2])
