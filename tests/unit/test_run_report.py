"""The end-of-run report (recipe.run.report) from steps verl really logged, through verl's own TensorBoard adapter,
and `run` writing it whatever the trainer's end."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from recipe.memory_fit import GIB
from recipe.plan import build_plan
from recipe.run import verl_metrics as names
from recipe.run.progress import event_reader, progress_line, read_steps
from recipe.run.report import (
    GPU_PEAK_TFLOPS,
    Peak,
    ReportInputs,
    StepRow,
    build_report,
    device_peak,
    flops_per_token,
)
from recipe.run_length import StepTotal

from .envtools import settings_of
from .runtools import cli, layout_of_one, run_environment

tracking = pytest.importorskip("verl.utils.tracking", reason="verl's TensorBoard logger (pip install '.[trainer]')")

RECORDED = Path(__file__).with_name("verl_steps.json")


def _recorded() -> dict[int, dict[str, float]]:
    """Steps 1 and 2 of the CPU e2e's reference run, as verl logged them."""
    return {int(step): values for step, values in json.loads(RECORDED.read_text())["steps"].items()}


def _logged_and_read_back(steps: dict[int, dict[str, float]], directory: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """`steps` through verl 0.9.1's TensorBoard adapter, read back as `run` reads them."""
    monkeypatch.setenv("TENSORBOARD_DIR", str(directory))
    adapter = tracking._TensorboardAdapter("project", "experiment")
    for step, values in steps.items():
        adapter.log(values, step=step)
    adapter.finish()
    return read_steps(event_reader(directory), directory)


def _inputs(code: int = 0, devices: int = 1, active: int | None = 10**9, memory: Any = None) -> ReportInputs:
    return ReportInputs(code, devices, active, device_peak("gpu", None), memory)


def test_the_recorded_run_gives_its_phases_tokens_and_peaks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    metrics = _logged_and_read_back(_recorded(), tmp_path, monkeypatch)
    report = build_report(metrics, _inputs()).to_dict()
    assert report["outcome"] == "finished" and report["steps_reported"] == 2
    step_2 = report["per_step"][1]
    # The phases verl timed in step 2 and what no timer covers add up to the step; the timers cover all but 5 %.
    assert step_2["phases"]["generation"] == pytest.approx(14.029586, rel=1e-6)  # float32 in the event file
    assert sum(step_2["phases"].values()) + step_2["untimed_s"] == pytest.approx(step_2["seconds"], rel=1e-12)
    assert abs(step_2["untimed_s"]) < 0.05 * step_2["seconds"]
    # The report's own count: verl's tokens over the step's time and the devices, which is verl's throughput here.
    for row in report["per_step"]:
        assert row["tokens_per_s_per_device"] == pytest.approx(row["verl_throughput"], rel=1e-6)
    assert report["tokens_per_s_per_device"] == pytest.approx((24.969255 + 29.371370) / 2, rel=1e-6)
    assert report["phases_median_s"]["actor update"]["steps"] == 2
    assert report["validation_s_median"] == pytest.approx(8.061285, rel=1e-6)
    actor, host = report["memory"]  # no estimate given: the phases verl measures
    assert actor["measured_gib"] == pytest.approx(1.1753807, rel=1e-6)  # the larger of the two steps'
    assert host["measured_gib"] == pytest.approx(9.386047, rel=1e-6)
    assert report["notes"] == []  # verl 0.9.1 logs every timer but the reward's, which is left out of the note


def test_the_same_devices_halve_the_rate_per_device() -> None:
    one, two = (build_report(_recorded(), _inputs(devices=n)).tokens_per_s_per_device() for n in (1, 2))
    assert one is not None and two == pytest.approx(one / 2)


def test_mfu_is_the_stated_formula() -> None:
    """2 x active weights for each pass verl timed (rollout, old and ref log-probs: 1 each; update: 3) x tokens per
    device-second, over the peak."""
    report = build_report(_recorded(), _inputs(active=2 * 10**9))
    assert flops_per_token(10, ["generation", "log-probs (old)", "log-probs (ref)", "actor update", "save"]) == 2 * 10 * 6
    assert flops_per_token(10, ["generation", "actor update"]) == 2 * 10 * 4
    rates = [2120 / 72.17913125699852, 1999 / 80.05845593900085]
    expected = sorted(rate * 2 * 2e9 * 6 / 1e12 for rate in rates)
    assert report.model_tflops_per_device() == pytest.approx(sum(expected) / 2, rel=1e-6)
    assert report.mfu() == pytest.approx(sum(expected) / 2 / GPU_PEAK_TFLOPS, rel=1e-6)


def test_the_peak_is_the_setting_else_an_h100_on_gpu_and_none_on_npu() -> None:
    assert device_peak("gpu", 312.0).tflops == 312.0 and device_peak("gpu", None).tflops == GPU_PEAK_TFLOPS
    npu = build_report(_recorded(), ReportInputs(0, 1, 10**9, device_peak("npu", None), None))
    assert npu.mfu() is None and npu.model_tflops_per_device() is not None
    assert "set PEAK_TFLOPS" in npu.to_text("here")


@pytest.mark.parametrize(("code", "outcome"), [(0, "finished"), (1, "failed (exit 1)"), (139, "failed (exit 139)"),
                                               (130, "stopped (SIGINT)"), (143, "stopped (SIGTERM)")])  # fmt: skip
def test_the_outcome_follows_the_trainers_exit(code: int, outcome: str) -> None:
    assert build_report({1: _recorded()[1]}, _inputs(code)).to_dict()["outcome"] == outcome


def test_a_run_that_logged_no_step_gets_a_report_that_says_so() -> None:
    report = build_report({}, _inputs(1))
    assert report.to_dict()["steps_reported"] == 0 and report.tokens_per_s_per_device() is None
    assert report.to_text("here").splitlines() == [
        "run report (here): failed (exit 1), 0 step(s) on 1 device(s)",
        "  no step was logged: the trainer ended before its first step's metrics",
    ]


def test_missing_metrics_are_named_not_guessed() -> None:
    report = build_report({1: {names.STEP_SECONDS: 10.0}, 2: {names.STEP_SECONDS: 12.0}}, _inputs())
    document = report.to_dict()
    assert document["step_s_median"] == 11.0 and document["tokens_per_s_per_device"] is None
    assert document["phases_median_s"] == {} and document["mfu"]["value"] is None
    assert "not logged by this verl: actor update, advantages, generation" in document["notes"][0]
    assert "tokens/s/device" in report.to_text("here") and "n/a" in report.to_text("here")


def test_one_step_only() -> None:
    report = build_report({2: _recorded()[2]}, _inputs())
    assert report.to_dict()["step_s_median"] == pytest.approx(72.17913125699852)
    assert "1 step(s) on 1 device(s)" in report.to_text("here")


def _plan_memory() -> Any:
    memory = build_plan(settings_of(DEVICE="gpu"), environ={}).memory
    assert memory is not None
    return memory


def test_a_peak_over_the_estimate_by_more_than_a_tenth_names_the_term_that_likely_grew() -> None:
    memory = _plan_memory()
    actor = next(phase for phase in memory.phases if phase.name == "actor phase (training)")
    estimate = actor.total / GIB
    largest_growing = max((t for t in actor.terms if not t.fixed), key=lambda t: t.bytes).name

    def row(measured: float) -> dict[str, Any]:
        steps = {1: {names.STEP_SECONDS: 10.0, names.ACTOR_PEAK_GIB: measured}}
        return build_report(steps, _inputs(memory=memory)).to_dict()["memory"][0]

    assert row(estimate * 1.09)["over_estimate"] is False and row(estimate * 1.09)["likely_term"] is None
    assert row(estimate * 1.2)["likely_term"] == largest_growing and row(estimate * 1.2)["over_estimate"] is True
    pool = next(t for p in memory.phases for t in p.terms if t.name.startswith("vLLM pool"))
    assert row(estimate + pool.bytes / GIB)["likely_term"].startswith(pool.name)
    text = build_report({1: {names.STEP_SECONDS: 10.0, names.ACTOR_PEAK_GIB: estimate * 1.2}}, _inputs(memory=memory))
    assert f"most likely {largest_growing} grew" in text.to_text("here")
    # The node's used RAM is every process's: shown beside the estimate, never called over it.
    host_phase = next(phase for phase in memory.phases if phase.name.startswith("host RAM"))
    steps = {1: {names.STEP_SECONDS: 10.0, names.HOST_USED_GIB: 3 * host_phase.total / GIB}}
    host_row = build_report(steps, _inputs(memory=memory)).to_dict()["memory"][-1]
    assert host_row["ratio"] == pytest.approx(3.0) and (host_row["over_estimate"], host_row["likely_term"]) == (False, None)
    # A save or a reward timer that did not run is no timer missing.
    saved = {1: {**_recorded()[1]}}
    saved[1].pop(names.PHASES["save"])
    assert build_report(saved, _inputs()).notes == []
    rows = {row["phase"]: row for row in build_report({}, _inputs(memory=memory)).to_dict()["memory"]}
    assert list(rows) == [phase.name for phase in memory.phases]
    assert rows["rollout phase (vLLM awake)"]["what"] == "not measured by verl"
    assert rows["host RAM per node (8 devices)"]["metric"] == names.HOST_USED_GIB


_values = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), st.integers(-(10**6), 10**6).map(float))


@given(st.dictionaries(st.integers(0, 10**6), st.dictionaries(st.sampled_from(sorted(names.READ_BACK)), _values), max_size=6),
       st.integers(0, 255), st.integers(1, 4096))  # fmt: skip
# Found by this test: an infinite token count or throughput reached the JSON, which refuses it.
@example({0: {names.STEP_SECONDS: 1.0, names.THROUGHPUT: math.inf, names.TOKENS: math.inf}}, 0, 1)
# Found by this test (issue 52): a step of 1e-308 s overflowed its tokens per second to inf, which the JSON refused.
@example({0: {names.STEP_SECONDS: 1.1125369292536007e-308, names.TOKENS: 2.0}}, 0, 1)
def test_any_metrics_give_a_report_never_a_traceback(steps: dict[int, dict[str, float | None]], code: int, devices: int) -> None:
    """Missing, negative, infinite or NaN values (verl logs what it measured): a report, valid JSON, a table."""
    report = build_report(steps, _inputs(code, devices))
    document = json.loads(report.to_json())
    for number in (document["step_s_median"], document["tokens_per_s_per_device"], document["mfu"]["value"]):
        assert number is None or (math.isfinite(number) and number >= 0)
    assert report.to_text("here").startswith("run report (here): ")


def test_the_progress_line_splits_the_step_and_gives_the_rate() -> None:
    line = progress_line(2, _recorded()[2], StepTotal(5, False), [72.0])
    assert line == ("progress: step 2 of 5, reward 0.033, 72.2 s/step (gen 14.0, old 7.3, ref 6.8, adv 0.0, "
                    "update 43.0, save 0.7, sync 0.2), 29.4 tokens/s/device, ETA 3m36s")  # fmt: skip


def _run_with_recorded_steps(tmp_path: Path, model: Path, code: str) -> tuple[Any, Path]:
    env = run_environment(tmp_path, model, **layout_of_one()) | {
        "STAND_IN_MODE": "verl_steps", "STAND_IN_STEPS": str(RECORDED), "STAND_IN_EXIT": code}
    done = cli(["run", "--", "trainer.total_training_steps=2"], env)
    return done, tmp_path / "checkpoints" / "p" / "e" / "run-report.json"


@pytest.mark.parametrize("code", ["0", "1"])
def test_run_writes_the_report_and_prints_its_table_whatever_the_end(tmp_path: Path, model: Path, code: str) -> None:
    done, report = _run_with_recorded_steps(tmp_path, model, code)
    assert done.returncode == int(code), done.stderr
    document = json.loads(report.read_text())
    assert document["outcome"] == ("finished" if code == "0" else "failed (exit 1)")
    assert [row["step"] for row in document["per_step"]] == [1, 2]
    assert document["memory"][0]["estimate_gib"] is not None  # the plan's estimate of the smoke model
    table = done.stdout[done.stdout.index("run report ("):]
    assert f"{document['outcome']}, 2 step(s) on 1 device(s)" in table and "tokens/s/device" in table


def test_a_run_with_no_metrics_still_reports_and_keeps_its_exit(tmp_path: Path, model: Path) -> None:
    env = run_environment(tmp_path, model, **layout_of_one()) | {"STAND_IN_EXIT": "7"}
    done = cli(["run"], env)
    assert done.returncode == 7
    assert "no step was logged" in done.stdout
    assert json.loads((tmp_path / "checkpoints" / "p" / "e" / "run-report.json").read_text())["outcome"] == "failed (exit 7)"


def test_the_report_of_a_run_on_several_nodes_counts_every_device_of_every_node(
    tmp_path: Path, model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 52: per-device figures divide by the world (NNODES x NDEVICES_PER_NODE), not by one node's devices."""
    from recipe.run import trainer

    def plan_of(nnodes: int) -> Any:
        settings = settings_of(DEVICE="gpu", MODEL_PATH=str(model), CHECKPOINT_DIR=str(tmp_path / f"ck{nnodes}"),
                               NNODES=nnodes, NDEVICES_PER_NODE=4, TP=1, GEN_TP=1, EP=1, MASTER_ADDR="10.0.0.1",
                               RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="t" * 32, TRAIN_BATCH_SIZE=12, ROLLOUT_N=4)  # fmt: skip
        return build_plan(settings, {})

    events = tmp_path / "tb"
    steps = _logged_and_read_back(_recorded(), events, monkeypatch)
    reports = {}
    for nnodes in (1, 3):
        plan = plan_of(nnodes)
        monkeypatch.setitem(plan.env, "TENSORBOARD_DIR", str(events))
        reports[nnodes] = trainer.write_run_report(plan, 0)
    assert steps and {nnodes: report.devices for nnodes, report in reports.items()} == {1: 4, 3: 12}
    assert reports[3].tokens_per_s_per_device() == pytest.approx(reports[1].tokens_per_s_per_device() / 3)
    written = json.loads((tmp_path / "ck3" / "grpo_qwen3_5_35b_geo3k" / "qwen3_5_35b_megatron" / "run-report.json").read_text())
    assert "on 12 device(s)" in reports[3].to_text("x") and written["devices"] == 12


def test_a_phase_timed_in_some_steps_its_share_and_the_peak_over_more_steps_than_one() -> None:
    """Issue 52, at the sizes that matter: four steps; a phase verl timed in three of them is the median of those three
    (its share of the median step), said to be "3 of 4 steps"; the memory peak is the largest of the four, not the
    last step's or the first's."""
    generation = names.PHASES["generation"]
    steps: dict[int, dict[str, float | None]] = {
        1: {names.STEP_SECONDS: 10.0, generation: 4.0, names.ACTOR_PEAK_GIB: 3.0},
        2: {names.STEP_SECONDS: 20.0, generation: 5.0, names.ACTOR_PEAK_GIB: 7.0},
        3: {names.STEP_SECONDS: 30.0, names.ACTOR_PEAK_GIB: 2.0},  # the timer missing from this step only
        4: {names.STEP_SECONDS: 40.0, generation: 6.0, names.ACTOR_PEAK_GIB: 1.0},
    }
    report = build_report(steps, _inputs())
    assert report.phase_medians()["generation"] == (5.0, 3)
    line = next(line for line in report.to_text("x").splitlines() if line.strip().startswith("generation"))
    assert line.split() == ["generation", "5.0", "s", "20.0", "%", "(3", "of", "4", "steps)"]  # 5 of the 25 s median
    [actor] = [row for row in report.memory if row.metric == names.ACTOR_PEAK_GIB]
    assert actor.measured_gib == 7.0


def _small_memory() -> Any:
    """The plan's estimate with three round phases: vLLM's pool of 2 GiB, an actor phase of 4 GiB (3 fixed, 1
    growing), a host of 8 GiB."""
    from recipe.memory_fit import Phase, Term

    return dataclasses.replace(_plan_memory(), phases=[
        Phase("rollout phase (vLLM awake)", [Term("vLLM pool (KV cache)", 2 * GIB, True, "x")], None),
        Phase("actor phase (training)", [Term("weights", 3 * GIB, True, "x"), Term("activations", 1 * GIB, False, "y")],
              None),
        Phase("host RAM per node", [Term("pinned", 8 * GIB, True, "z")], None),
    ])  # fmt: skip


_P = names.PHASES
#: Three steps on two devices: generation timed in two of them, the actor's peak in step 2 (not the last step's),
#: validation in two, a gradient norm that was not finite in step 2.
THREE_STEPS: dict[int, dict[str, float | None]] = {
    1: {names.STEP_SECONDS: 10.0, _P["generation"]: 4.0, _P["actor update"]: 3.0, names.TOKENS: 1000.0,
        names.THROUGHPUT: 99.0, names.ACTOR_PEAK_GIB: 3.0, names.VALIDATION_SECONDS: 2.0},
    2: {names.STEP_SECONDS: 20.0, _P["generation"]: 5.0, _P["actor update"]: 6.0, names.TOKENS: 3000.0,
        names.ACTOR_PEAK_GIB: 5.0, names.HOST_USED_GIB: 4.0, "actor/grad_norm": None},
    3: {names.STEP_SECONDS: 30.0, _P["actor update"]: 9.0, names.TOKENS: 3000.0, names.ACTOR_PEAK_GIB: 4.5,
        names.VALIDATION_SECONDS: 4.0},
}  # fmt: skip


def _three_steps_report() -> Any:
    return build_report(THREE_STEPS, ReportInputs(143, 2, 10**9, device_peak("gpu", 100.0), _small_memory()))


def test_the_table_of_three_steps_on_two_devices_line_by_line() -> None:
    """Medians over three steps (20 s; generation 4.5 s in 2 of 3; update 6 s in all), tokens over the step and both
    devices (50, 75, 50: median 50), MFU from each step's timed passes (0.4, 0.6, 0.3 TFLOP/s: median 0.4, of 100),
    the actor's peak the largest step's (5 GiB over 4: 25 %, exactly half of vLLM's 2 GiB pool: the pool is named)."""
    lines = _three_steps_report().to_text("/ck/run-report.json").splitlines()
    assert lines[:12] == [
        "run report (/ck/run-report.json): stopped (SIGTERM), 3 step(s) on 2 device(s)",
        "  step (median)                     20.0 s",
        "  generation                         4.5 s  22.5 %  (2 of 3 steps)",
        "  actor update                       6.0 s  30.0 %",
        "  untimed by verl                    9.0 s",
        "  validation (outside steps)         3.0 s",
        "  tokens/s/device                   50.0",
        "  MFU                                0.4 %  (0.4 of 100 TFLOP/s: PEAK_TFLOPS)",
        "  memory, rollout phase (vLLM awake): not measured by verl, estimate 2.00 GiB",
        "  memory, actor phase (training): 5.00 GiB measured, estimate 4.00 GiB, ratio 1.25",
        "    over the estimate by 25 %: most likely vLLM pool (KV cache): still held while the actor trained grew; "
        "please report it (docs/performance.md)",
        "  memory, host RAM per node: 4.00 GiB measured, estimate 8.00 GiB, ratio 0.50",
    ]  # fmt: skip
    assert lines[12].startswith("  health: gradient norm not finite from step 2 (actor/grad_norm is inf or NaN")
    assert lines[13:] == ["  not logged by this verl: advantages, log-probs (old), log-probs (ref), weight sync"]


def test_the_json_of_three_steps_on_two_devices_field_by_field() -> None:
    report = _three_steps_report()
    document = report.to_dict()
    assert report.to_json() == json.dumps(document, indent=2)  # run-report.json is indented by two
    assert {key: value for key, value in document.items() if key not in ("mfu", "memory", "per_step", "health")} == {
        "outcome": "stopped (SIGTERM)", "exit_code": 143, "devices": 2, "steps_reported": 3, "step_s_median": 20.0,
        "phases_median_s": {"generation": {"median_s": 4.5, "steps": 2}, "actor update": {"median_s": 6.0, "steps": 3}},
        "untimed_s_median": 9.0, "validation_s_median": 3.0, "tokens_per_s_per_device": 50.0,
        "mismatch": {},  # none of its metrics logged
        "notes": ["not logged by this verl: advantages, log-probs (old), log-probs (ref), weight sync"],
    }  # fmt: skip
    assert document["mfu"] == {
        "value": 0.004, "model_tflops_per_device": 0.4, "peak_tflops": 100.0, "peak_source": "PEAK_TFLOPS",
        "active_weights_per_token": 10**9,
        "formula": "2 x active weights per token x (1 rollout + 1 old log-prob + 1 ref log-prob + 3 actor update) "
        "passes, for the passes verl timed; x tokens / (step seconds x devices x peak). Attention's quadratic term, "
        "DeltaNet's state update, recomputation and the vision tower are not counted: a lower bound",
    }  # fmt: skip
    assert document["memory"] == [
        {"phase": "rollout phase (vLLM awake)", "metric": "", "what": "not measured by verl", "measured_gib": None,
         "estimate_gib": 2.0, "ratio": None, "over_estimate": False, "likely_term": None},
        {"phase": "actor phase (training)", "metric": names.ACTOR_PEAK_GIB,
         "what": "the actor worker's device peak (torch max_memory_allocated)", "measured_gib": 5.0,
         "estimate_gib": 4.0, "ratio": 1.25, "over_estimate": True,
         "likely_term": "vLLM pool (KV cache): still held while the actor trained"},
        {"phase": "host RAM per node", "metric": names.HOST_USED_GIB,
         "what": "the node's used RAM as the actor saw it (psutil; every process on the node)", "measured_gib": 4.0,
         "estimate_gib": 8.0, "ratio": 0.5, "over_estimate": False, "likely_term": None},
    ]  # fmt: skip
    assert document["per_step"][:2] == [
        {"step": 1, "seconds": 10.0, "phases": {"generation": 4.0, "actor update": 3.0}, "untimed_s": 3.0,
         "tokens": 1000.0, "tokens_per_s_per_device": 50.0, "verl_throughput": 99.0},
        {"step": 2, "seconds": 20.0, "phases": {"generation": 5.0, "actor update": 6.0}, "untimed_s": 9.0,
         "tokens": 3000.0, "tokens_per_s_per_device": 75.0, "verl_throughput": None},
    ]  # fmt: skip
    [health] = document["health"]
    assert (health["sign"], health["since_step"]) == ("gradient norm not finite", 2)
    assert health["seen"].startswith("actor/grad_norm is inf or NaN")


def test_the_table_without_sizes_without_a_peak_and_without_an_estimate() -> None:
    """The other branches of the table: no tokens logged (n/a), the model's sizes unknown (no MFU), a known model on
    npu (TFLOP/s without an MFU), no estimate, a measured phase with nothing logged."""
    steps: dict[int, dict[str, float | None]] = {1: {names.STEP_SECONDS: 8.0, _P["actor update"]: 8.0}}
    unknown = build_report(steps, ReportInputs(1, 1, None, device_peak("gpu", None), None)).to_text("r")
    assert unknown.splitlines()[1:] == [
        "  step (median)                      8.0 s",
        "  actor update                       8.0 s 100.0 %",
        "  untimed by verl                    0.0 s",
        "  tokens/s/device              n/a",
        "  MFU                                n/a (the model's sizes are unknown)",
        f"  memory, actor phase: nothing logged ({names.ACTOR_PEAK_GIB}), no estimate",
        f"  memory, host RAM: nothing logged ({names.HOST_USED_GIB}), no estimate",
        "  not logged by this verl: advantages, generation, log-probs (old), log-probs (ref), weight sync",
    ]
    steps[1][names.TOKENS] = 4000.0  # 500 tokens/s on one device, 3 passes of 2 x 10^9: 3 TFLOP/s
    npu = build_report(steps, ReportInputs(0, 1, 10**9, device_peak("npu", None), None)).to_text("r").splitlines()
    assert npu[4:6] == [
        "  tokens/s/device                  500.0",
        "  model TFLOP/s/device                 3  (MFU: no peak assumed on npu; set PEAK_TFLOPS to the chip's dense "
        "bf16 peak for an MFU)",
    ]  # fmt: skip


def test_the_peak_and_where_it_came_from() -> None:
    assert device_peak("gpu", 312.0) == device_peak("npu", 312.0) == Peak(312.0, "PEAK_TFLOPS")
    assert device_peak("gpu", None) == Peak(989.0, "an H100's dense bf16 peak; PEAK_TFLOPS for another")
    assert device_peak("npu", None) == Peak(None, "no peak assumed on npu; set PEAK_TFLOPS to the chip's dense bf16 "
                                                  "peak for an MFU")  # fmt: skip


def test_a_step_shorter_than_a_second_counts_and_one_of_no_time_has_no_rate() -> None:
    """A step time is kept when positive, however short; a step of 0 s (never a row) gives no rate, not a division."""
    report = build_report({1: {names.STEP_SECONDS: 0.5, names.TOKENS: 100.0}}, _inputs(devices=2))
    assert report.tokens_per_s_per_device() == 100.0
    assert StepRow(1, 0.0, {}, 100.0, None).tokens_per_device_second(1) is None


def test_an_actor_peak_over_an_estimate_without_a_vllm_pool_names_its_largest_growing_term() -> None:
    from recipe.memory_fit import Phase, Term

    memory = dataclasses.replace(_plan_memory(), phases=[
        Phase("actor phase (training)", [Term("weights", 3 * GIB, True, "x"), Term("logits", 2 * GIB, False, "y"),
                                         Term("activations", 1 * GIB, False, "y")], None)])  # fmt: skip
    report = build_report({1: {names.STEP_SECONDS: 1.0, names.ACTOR_PEAK_GIB: 9.0}}, _inputs(memory=memory))
    assert [row.likely_term for row in report.memory] == ["logits"]


def test_a_figure_that_overflows_is_null_in_the_json_and_the_rest_is_kept() -> None:
    """Hypothesis found it: a step of 1e-308 s gives inf tokens per second (and MFU), and two phases of 1e308 s an
    untimed -inf; run-report.json has no inf (JSON refuses it), so those figures are null, the others as they were."""
    tiny = {names.STEP_SECONDS: 1.1125369292536007e-308, names.TOKENS: 2.0}
    huge = {names.STEP_SECONDS: 1.0, _P["generation"]: 1e308, _P["actor update"]: 1e308}
    document = json.loads(build_report({1: tiny, 2: huge}, _inputs(7)).to_json())
    first, second = document["per_step"]
    assert (first["seconds"], first["tokens"], first["tokens_per_s_per_device"]) == (1.1125369292536007e-308, 2.0, None)
    assert (second["untimed_s"], second["phases"]) == (None, {"generation": 1e308, "actor update": 1e308})
    assert document["tokens_per_s_per_device"] is None and document["mfu"]["model_tflops_per_device"] is None
    assert (document["exit_code"], document["mfu"]["value"], document["mfu"]["peak_tflops"]) == (7, None, GPU_PEAK_TFLOPS)


def test_the_metric_names_are_verl_0_9_1s() -> None:
    """verl's own names (ray_trainer.py's marked_timer, metric_utils.py, engine_workers.py), spelled out: a name the
    recipe mistypes is a metric never read, which no test through the same constant would see."""
    assert (names.REWARD, names.STEP_SECONDS, names.VALIDATION_SECONDS) == (
        "critic/rewards/mean", "timing_s/step", "timing_s/testing")
    assert (names.TOKENS, names.THROUGHPUT) == ("perf/total_num_tokens", "perf/throughput")
    assert (names.ACTOR_PEAK_GIB, names.ACTOR_RESERVED_GIB, names.HOST_USED_GIB) == (
        "actor/perf/max_memory_allocated_gb", "actor/perf/max_memory_reserved_gb", "actor/perf/cpu_memory_used_gb")
    assert list(names.PHASES.items()) == [
        ("generation", "timing_s/gen"), ("reward", "timing_s/reward"), ("log-probs (old)", "timing_s/old_log_prob"),
        ("log-probs (ref)", "timing_s/ref"), ("advantages", "timing_s/adv"), ("actor update", "timing_s/update_actor"),
        ("save", "timing_s/save_checkpoint"), ("weight sync", "timing_s/update_weights"),
    ]  # fmt: skip
    assert list(names.PHASE_SHORT.items()) == [("generation", "gen"), ("reward", "reward"), ("log-probs (old)", "old"),
                                               ("log-probs (ref)", "ref"), ("advantages", "adv"),
                                               ("actor update", "update"), ("save", "save"), ("weight sync", "sync")]  # fmt: skip
    assert names.CAPPED_TOKENS == "rollout_corr/rollout_is_ratio_fraction_high"
    assert names.READ_BACK == {names.REWARD, names.STEP_SECONDS, names.VALIDATION_SECONDS, names.TOKENS,
                               names.THROUGHPUT, names.ACTOR_PEAK_GIB, names.ACTOR_RESERVED_GIB, names.HOST_USED_GIB,
                               names.CAPPED_TOKENS, *names.PHASES.values()}  # fmt: skip
    assert len(names.READ_BACK) == 17


def test_the_bounds_of_what_counts_zero_is_a_value_a_step_of_zero_seconds_is_none() -> None:
    """Issue 52, the edges as named cases (the property test above reached them only by chance): a phase, a token
    count, a memory peak or a validation of 0 (or below 1) is logged and kept; a step of 0 s or of no finite time is
    left out, and the steps after it are kept; an infinite throughput is none."""
    steps: dict[int, dict[str, float | None]] = {
        1: {names.STEP_SECONDS: 0.0, names.TOKENS: 50.0},
        2: {names.STEP_SECONDS: math.nan},
        3: {names.STEP_SECONDS: 4.0, _P["advantages"]: 0.0, names.TOKENS: 0.0, names.THROUGHPUT: math.inf,
            names.ACTOR_PEAK_GIB: 0.0, names.VALIDATION_SECONDS: 0.0},
        4: {names.STEP_SECONDS: 2.0, _P["advantages"]: 0.5, names.TOKENS: 0.5, names.HOST_USED_GIB: 0.5},
    }  # fmt: skip
    report = build_report(steps, _inputs())
    assert [(row.step, row.phases, row.tokens, row.verl_throughput) for row in report.steps] == [
        (3, {"advantages": 0.0}, 0.0, None), (4, {"advantages": 0.5}, 0.5, None)]
    assert [row.measured_gib for row in report.memory] == [0.0, 0.5] and report.validation_s == 0.0
    assert build_report({1: {names.VALIDATION_SECONDS: 0.5}}, _inputs()).validation_s == 0.5
    assert build_report({1: {names.STEP_SECONDS: -1.0}, 2: {}}, _inputs()).notes == [
        "2 step(s) logged, none with a finite step time (timing_s/step)"]


def test_a_peak_of_exactly_a_tenth_over_the_estimate_is_not_over_it() -> None:
    """OVER_ESTIMATE's bound itself: 4.4 GiB against 4 GiB is a ratio of exactly 1.1."""
    steps = {1: {names.STEP_SECONDS: 1.0, names.ACTOR_PEAK_GIB: 4.4}}
    [_, actor, _] = build_report(steps, _inputs(memory=_small_memory())).memory
    assert actor.ratio == 1.1 and actor.likely_term is None


def test_an_overflowed_rate_reads_inf_in_the_table() -> None:
    tiny = {1: {names.STEP_SECONDS: 1.1125369292536007e-308, names.TOKENS: 2.0}}
    lines = build_report(tiny, _inputs()).to_text("r").splitlines()
    assert "  tokens/s/device                    inf" in lines


def test_the_mismatch_over_the_run_in_each_unit_beside_its_bound_and_the_capped_share() -> None:
    """Issue 53: verl's KL (signed: the worst is the largest in size), the recipe's per-token gap and the share of
    tokens the correction capped, each over the steps that logged it (a NaN step left out); a unit never logged
    is left out of both the table and the JSON."""
    from recipe.mismatch import METRIC as GAP
    from recipe.run.health import MISMATCH_KL

    steps = {step: {**values, MISMATCH_KL: kl, GAP: gap, names.CAPPED_TOKENS: capped}
             for (step, values), kl, gap, capped in zip(THREE_STEPS.items(), [0.004, -0.006, 0.001],
                                                         [0.012, math.nan, 0.02], [0.0, 0.01, 0.005])}  # fmt: skip
    report = build_report(steps, ReportInputs(0, 2, None, device_peak("gpu", None), None))
    assert report.to_dict()["mismatch"] == {
        "kl": {"median": 0.001, "worst": -0.006, "bound": 0.002},
        "abs_log_prob_diff": {"median": 0.016, "worst": 0.02, "bound": 0.1},
        "capped_tokens": {"median": 0.005, "worst": 0.01, "bound": None},
    }
    lines = report.to_text("r.json").splitlines()
    assert [line for line in lines if line.startswith(("  mismatch", "  tokens capped"))] == [
        "  mismatch, KL                 median 0.001, worst -0.006 (bound 0.002)",
        "  mismatch, |Δlog p| per token median 0.016, worst 0.02 (bound 0.1)",
        "  tokens capped, %             median 0.50, worst 1.00",
    ]
    only_kl = {step: {names.STEP_SECONDS: 1.0, MISMATCH_KL: 0.001} for step in (1, 2)}
    assert list(build_report(only_kl, ReportInputs(0, 1, None, device_peak("gpu", None), None)).mismatch) == ["kl"]
