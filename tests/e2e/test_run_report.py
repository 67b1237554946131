"""The run report of the uninterrupted run (recipe.run.report, written as `run` writes it) against what verl logged."""

from __future__ import annotations

import json
import math

import pytest

from tests.e2e.conftest import ReferenceRun
from tests.e2e.harness.metrics import step_metrics

#: verl's timers must cover a step past the first (the first carries one-off costs outside them) to this share.
TIMED_SHARE = 0.95


def _logged(run: ReferenceRun) -> dict[int, dict[str, float]]:
    """Each step's metrics as verl's console logger printed them (float64, independent of TensorBoard's float32)."""
    return step_metrics(run.run.text())


def test_the_report_is_written_and_reads_back(e2e_reference: ReferenceRun) -> None:
    assert e2e_reference.report is not None and e2e_reference.report_file is not None
    document = json.loads(e2e_reference.report_file.read_text())
    assert document == json.loads(e2e_reference.report.to_json())
    assert document["outcome"] == "finished" and document["devices"] == 1
    assert [row["step"] for row in document["per_step"]] == [1, 2]


def test_the_phases_add_up_to_each_step(e2e_reference: ReferenceRun) -> None:
    """Each step's phases and its untimed rest are its time, and verl's timers cover step 2 within 5 %."""
    rows = {row["step"]: row for row in json.loads(e2e_reference.report_file.read_text())["per_step"]}
    logged = _logged(e2e_reference)
    for step, row in rows.items():
        assert row["seconds"] == pytest.approx(logged[step]["timing_s/step"], rel=1e-6)
        assert sum(row["phases"].values()) + row["untimed_s"] == pytest.approx(row["seconds"], rel=1e-9)
        assert row["phases"]["generation"] == pytest.approx(logged[step]["timing_s/gen"], rel=1e-6)
        assert row["phases"]["actor update"] == pytest.approx(logged[step]["timing_s/update_actor"], rel=1e-6)
    assert sum(rows[2]["phases"].values()) >= TIMED_SHARE * rows[2]["seconds"], rows[2]


def test_tokens_per_second_agree_with_the_tokens_verl_counted(e2e_reference: ReferenceRun) -> None:
    logged = _logged(e2e_reference)
    for row in json.loads(e2e_reference.report_file.read_text())["per_step"]:
        counted = logged[row["step"]]
        assert row["tokens"] == counted["perf/total_num_tokens"]
        assert row["tokens_per_s_per_device"] == pytest.approx(counted["perf/throughput"], rel=1e-6)
        assert row["tokens_per_s_per_device"] == pytest.approx(counted["perf/total_num_tokens"] / counted["timing_s/step"], rel=1e-6)


def test_memory_figures_are_the_ones_verl_logged_beside_the_estimate(e2e_reference: ReferenceRun) -> None:
    from recipe.memory_fit import GIB

    logged = _logged(e2e_reference)
    rows = {row["phase"]: row for row in json.loads(e2e_reference.report_file.read_text())["memory"]}
    estimate = {phase["name"]: phase for phase in e2e_reference.plan["memory"]["phases"]}
    actor = rows["actor phase (training)"]
    assert actor["measured_gib"] == pytest.approx(max(s["actor/perf/max_memory_allocated_gb"] for s in logged.values()), rel=1e-6)
    assert actor["estimate_gib"] == pytest.approx(estimate["actor phase (training)"]["total_gib"], abs=0.005)
    assert actor["ratio"] == pytest.approx(actor["measured_gib"] / actor["estimate_gib"])
    assert actor["over_estimate"] is (actor["ratio"] > 1.1) and (actor["likely_term"] is None) is (actor["ratio"] <= 1.1)
    # The worker's allocations are part of what the harness measured of the run's processes (PSS, all of them).
    assert actor["measured_gib"] * GIB <= e2e_reference.run.peak_memory_bytes
    host = next(row for name, row in rows.items() if name.startswith("host RAM"))
    assert host["measured_gib"] == pytest.approx(max(s["actor/perf/cpu_memory_used_gb"] for s in logged.values()), rel=1e-6)
    assert rows["rollout phase (vLLM awake)"]["measured_gib"] is None


def test_the_mfu_is_the_formula_over_the_run(e2e_reference: ReferenceRun) -> None:
    """On CPU no peak is known for the device (the plan is gpu's: an H100's is assumed); the achieved rate is the formula's."""
    document = json.loads(e2e_reference.report_file.read_text())
    active = document["mfu"]["active_weights_per_token"]
    assert active == e2e_reference.report.active_per_token and active > 0
    rates = sorted(row["tokens_per_s_per_device"] * 2 * active * 6 / 1e12 for row in document["per_step"])
    assert document["mfu"]["model_tflops_per_device"] == pytest.approx((rates[0] + rates[1]) / 2, rel=1e-9)
    assert math.isfinite(document["mfu"]["value"])
