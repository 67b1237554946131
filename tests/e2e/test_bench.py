"""PROFILE=bench on CPU: the recipe's bench plan with the smoke model as MODEL_PATH, one step, and its run report.

The plan is `entrypoint.py plan --json` with PROFILE=bench (the full recipe's plan on the bench's
synthetic prompts), the smoke model and a one-device layout, and `--` overrides that shrink the
step for this host; the bench's prompts are written by the function `run` calls, and the report
by `run`'s own. Only the CPU mapping of the other runs is added (tests/e2e/harness/plan.py).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from recipe.launch import override_value
from tests.e2e.conftest import PHASES, RUN_TIMEOUT_S, WORK, _fresh
from tests.e2e.harness.assets import build_assets
from tests.e2e.harness.metrics import step_metrics
from tests.e2e.harness.plan import plan_object, recipe_plan, trainer_command
from tests.e2e.harness.trainer import TrainerRun, run_trainer

#: The bench's response length here (the profile keeps the recipe's; this host generates 16 tokens in seconds).
RESPONSE_TOKENS = 16
#: A user's `--` overrides for a quick bench on this host: one step, short responses, one agent and reward worker
#: (the smoke profile's host sizes, which the full plan leaves to verl's defaults of 8).
OVERRIDES = ("trainer.total_training_steps=1", f"data.max_response_length={RESPONSE_TOKENS}",
             "actor_rollout_ref.rollout.agent.num_workers=1", "reward.num_workers=1")  # fmt: skip


@dataclass(frozen=True)
class BenchRun:
    plan: dict[str, Any]
    root: Path
    run: TrainerRun
    report: Any


@pytest.fixture(scope="module")
def bench() -> BenchRun:
    """The bench plan with the smoke model (built as the smoke profile builds it), run as `entrypoint.py run` runs it."""
    from recipe.run.trainer import prepare_bench, write_run_report

    started = time.monotonic()
    run_dir = _fresh(WORK / "bench")
    model = build_assets(run_dir / "checkpoints").model
    settings = {
        "PROFILE": "bench", "DEVICE": "gpu", "CHECKPOINT_DIR": str(run_dir / "checkpoints"), "MODEL_PATH": str(model), "TRAIN_BATCH_SIZE": "2", "ROLLOUT_N": "2", "OFFLOAD": "false",
        "TP": "1", "PP": "1", "CP": "1", "EP": "1", "ETP": "1", "GEN_TP": "1", "NDEVICES_PER_NODE": "1",
    }  # fmt: skip
    plan = recipe_plan(settings, OVERRIDES)
    in_process = plan_object(settings, OVERRIDES)
    assert in_process.overrides == plan["overrides"], "the in-process plan is not the CLI's"
    prepare_bench(in_process)
    argv, env = trainer_command(plan, host=False)
    root = Path(str(override_value(plan["overrides"], "trainer.default_local_dir")))
    root.mkdir(parents=True, exist_ok=True)  # as `run` makes it (its run record goes there)
    run = run_trainer(argv, env, run_dir, run_dir / "bench.log", RUN_TIMEOUT_S)
    report = write_run_report(in_process, run.returncode)
    PHASES.timed("bench run (PROFILE=bench, 1 step)", started)
    PHASES.peak_memory_bytes = max(PHASES.peak_memory_bytes, run.peak_memory_bytes)
    return BenchRun(plan, root, run, report)


def test_the_bench_plan_is_the_recipes(bench: BenchRun) -> None:
    overrides = bench.plan["overrides"]
    assert override_value(overrides, "actor_rollout_ref.rollout.ignore_eos") == "True"
    assert override_value(overrides, "trainer.save_freq") == "-1" and override_value(overrides, "trainer.test_freq") == "-1"
    assert "synthetic train rows" in bench.plan["data"]


def test_the_bench_run_finishes_with_its_report(bench: BenchRun) -> None:
    assert bench.run.returncode == 0, bench.run.tail()
    document = json.loads((bench.root / "run-report.json").read_text())
    assert document["outcome"] == "finished" and document["steps_reported"] == 1
    assert document["tokens_per_s_per_device"] > 0 and document["mfu"]["model_tflops_per_device"] > 0
    actor = next(row for row in document["memory"] if row["phase"] == "actor phase (training)")
    assert actor["measured_gib"] > 0 and actor["ratio"] > 0


def test_every_response_has_the_fixed_length(bench: BenchRun) -> None:
    """ignore_eos: each response is data.max_response_length tokens; the prompts are the bench's two first."""
    logged = step_metrics(bench.run.text())[1]
    assert (logged["response_length/min"], logged["response_length/max"]) == (RESPONSE_TOKENS, RESPONSE_TOKENS)
    # Rows 0 and 1: the second carries one more filler sentence (recipe.bench.data), so the batch is not uniform.
    assert logged["prompt_length/max"] > logged["prompt_length/min"] > 0
    prompts = logged["prompt_length/min"] + logged["prompt_length/max"]
    assert logged["perf/total_num_tokens"] == 2 * (prompts + 2 * RESPONSE_TOKENS)


def test_no_checkpoint_and_no_validation(bench: BenchRun) -> None:
    assert not list(bench.root.glob("global_step_*"))
    assert "timing_s/testing" not in step_metrics(bench.run.text())[1]
