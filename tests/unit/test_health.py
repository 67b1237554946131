"""recipe.run.health: the signs of a failing run, judged on generated streams of verl's step metrics (issue 53, item 4).

A healthy stream (every metric inside its bound, the reward moving, the mismatch never rising for long) raises
nothing; each sign injected into one from a step on is said once, at that step, and again only after it ended
and came back. The bounds themselves are named examples. The printer says them as warnings whether or not it
prints progress lines, and the run report lists them.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from recipe.run import health
from recipe.run.health import (
    ADVANTAGE_MAX,
    ADVANTAGE_MIN,
    CLIPPED,
    ENTROPY,
    GRAD_NORM,
    MISMATCH_ABS,
    MISMATCH_KL,
    HealthWatch,
    Thresholds,
    signs_of,
)
from recipe.run.verl_metrics import REWARD, STEP_SECONDS

LIMITS = Thresholds()
Step = dict[str, float | None]


@st.composite
def healthy_steps(draw: st.DrawFn, min_size: int = 1, max_size: int = 30) -> list[Step]:
    """Steps of a run that is learning: every sign's metric inside its bound."""
    count = draw(st.integers(min_size, max_size))
    unit = st.floats(0.0, 1.0)
    steps = []
    for index in range(count):
        steps.append({
            CLIPPED: draw(unit) * LIMITS.clipped_share,
            ADVANTAGE_MAX: 0.1 + draw(unit), ADVANTAGE_MIN: -0.1 - draw(unit),
            ENTROPY: 1.0 if index == 0 else 0.2 + draw(unit),  # never below a tenth of the first
            GRAD_NORM: 0.01 + 10 * draw(unit),
            REWARD: 0.5 * draw(unit) + (0.01 if index % 2 else 0.0),  # moving by 0.01 at least every two steps
            MISMATCH_KL: 0.0 if index % 2 else LIMITS.mismatch_kl * draw(unit),  # never rising twice in a row
            MISMATCH_ABS: LIMITS.mismatch_abs * draw(unit),
        })  # fmt: skip
    return steps


def _said(steps: list[Step], thresholds: Thresholds = LIMITS) -> list[tuple[int, str]]:
    """(step, line) of every line a watch says, steps numbered from 1."""
    watch = HealthWatch(thresholds)
    return [(number, line) for number, step in enumerate(steps, start=1) for line in watch.feed(number, step)]


@given(healthy_steps())
def test_a_learning_run_raises_nothing(steps: list[Step]) -> None:
    assert _said(steps) == []


#: Each sign, and what its metric is while the sign holds (applied to a healthy step).
SICK = {
    "responses cut at the length limit": {CLIPPED: 0.9},
    "no reward spread": {ADVANTAGE_MAX: 0.0, ADVANTAGE_MIN: 0.0},
    "entropy collapse": {ENTROPY: 0.01},
    "gradient norm not finite": {GRAD_NORM: None},
    "rollout/training mismatch": {MISMATCH_KL: 0.05},
}


@given(healthy_steps(min_size=4), st.sampled_from(sorted(SICK)), st.data())
def test_each_sign_is_said_once_when_it_starts_and_again_when_it_comes_back(
    steps: list[Step], name: str, data: st.DataObject
) -> None:
    start = data.draw(st.integers(2, len(steps) - 1), label="start")  # the first step stays healthy (entropy's base)
    end = data.draw(st.integers(start, len(steps) - 1), label="end")
    for index in range(start - 1, end):
        steps[index].update(SICK[name])
    said = _said(steps)
    assert [(number, line.split(":")[1].strip()) for number, line in said] == [(start, f"{name} from step {start}")]
    again = [*steps, {**steps[0], **SICK[name]}]
    if end < len(steps):  # it had ended: back, it is said again
        assert [number for number, _ in _said(again)] == [start, len(again)]


@pytest.mark.parametrize(("metrics", "said"), [
    ({CLIPPED: LIMITS.clipped_share}, False),  # the bound itself is not past it
    ({CLIPPED: LIMITS.clipped_share + 1e-9}, True),
    ({ADVANTAGE_MAX: 0.0, ADVANTAGE_MIN: -1e-9}, False),  # one group with a spread still gives a gradient
    ({ADVANTAGE_MAX: 0.0}, False),  # one of the two missing: nothing is known
    ({GRAD_NORM: 1.0}, False),
    ({}, False),  # a verl that logs none of them: nothing is guessed
    ({MISMATCH_KL: LIMITS.mismatch_kl}, False),
    ({MISMATCH_KL: LIMITS.mismatch_kl * 1.001}, True),
    ({MISMATCH_ABS: LIMITS.mismatch_abs}, False),  # slime's unit: 0.1 itself is inside
    ({MISMATCH_ABS: LIMITS.mismatch_abs * 1.001}, True),
    ({MISMATCH_ABS: LIMITS.mismatch_abs * 1.001, MISMATCH_KL: None}, True),  # either unit alone tells
])  # fmt: skip
def test_each_bound_itself_is_inside(metrics: Step, said: bool) -> None:
    assert bool(HealthWatch().feed(1, metrics)) is said


@pytest.mark.parametrize(("second", "said"), [(LIMITS.entropy_fall * 2.0, False), (LIMITS.entropy_fall * 2.0 - 1e-9, True)])
def test_entropy_collapse_is_measured_against_the_first_step(second: float, said: bool) -> None:
    watch = HealthWatch()
    assert watch.feed(1, {ENTROPY: 2.0}) == []
    assert bool(watch.feed(2, {ENTROPY: second})) is said


@pytest.mark.parametrize("steps", [LIMITS.flat_steps - 1, LIMITS.flat_steps])
def test_a_flat_reward_is_said_after_its_window_and_dated_from_its_start(steps: int) -> None:
    stream = [{REWARD: 0.3}, *({REWARD: 0.7 + (k % 2) * LIMITS.flat_span * 0.9} for k in range(steps))]
    said = _said(stream)
    if steps < LIMITS.flat_steps:
        assert said == []
    else:
        [(number, line)] = said
        assert number == len(stream) and f"reward flat from step 2: {REWARD} within" in line


@pytest.mark.parametrize("rises", [LIMITS.mismatch_rising_steps - 1, LIMITS.mismatch_rising_steps])
def test_a_mismatch_rising_step_after_step_is_said_once_it_rose_long_enough(rises: int) -> None:
    stream = [{MISMATCH_KL: 1e-4 * (k + 1)} for k in range(rises + 1)]  # all below the bound: only the growth
    said = _said(stream)
    assert ([number for number, _ in said] == [len(stream)]) is (rises == LIMITS.mismatch_rising_steps)
    assert all(f"mismatch growing from step 2: {MISMATCH_KL} rose" in line for _, line in said)


def test_a_non_finite_grad_norm_says_verl_applied_the_update_and_the_way_back() -> None:
    [line] = HealthWatch().feed(7, {GRAD_NORM: None})
    assert line.startswith("health: gradient norm not finite from step 7: actor/grad_norm is inf or NaN")
    assert "verl applied this update" in line and "trainer.resume_mode=resume_path" in line


@given(st.lists(healthy_steps(max_size=12), min_size=1, max_size=1), st.randoms(use_true_random=False))
@example([[{CLIPPED: 0.9}, {CLIPPED: 0.1}, {CLIPPED: 0.9}]], None)
def test_a_runs_signs_are_its_steps_replayed_in_order(streams: list[list[Step]], shuffle: object) -> None:
    steps = {number: step for number, step in enumerate(streams[0], start=1)}
    keys = list(steps)
    if shuffle is not None:
        shuffle.shuffle(keys)  # type: ignore[attr-defined]
    replayed = signs_of({key: steps[key] for key in keys})
    assert [sign.line() for sign in replayed] == [line for _, line in _said(list(streams[0]))]


# --- where they are said: the printer (a warning, with or without progress lines) and the run report ----------


class _Events:
    """tensorboard's reader as the printer uses it: Reload, Tags, Scalars."""

    def __init__(self, steps: dict[int, Step]) -> None:
        self.steps = steps

    def Reload(self) -> None:  # noqa: N802 - tensorboard's name
        pass

    def Tags(self) -> dict[str, list[str]]:  # noqa: N802
        return {"scalars": sorted({tag for step in self.steps.values() for tag in step})}

    def Scalars(self, tag: str) -> list[object]:  # noqa: N802
        from types import SimpleNamespace

        nan = float("nan")
        return [SimpleNamespace(step=step, value=nan if values[tag] is None else values[tag], wall_time=time.time())
                for step, values in sorted(self.steps.items()) if tag in values]  # fmt: skip


@pytest.mark.parametrize("with_lines", [True, False])
def test_the_printer_warns_of_each_sign_once_with_or_without_progress_lines(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, with_lines: bool
) -> None:
    from recipe.run.progress import ProgressPrinter

    lines: list[str] = []
    printer = ProgressPrinter(tmp_path, None, lines.append if with_lines else None)
    printer.events = _Events({1: {STEP_SECONDS: 5.0, GRAD_NORM: 1.0}, 2: {STEP_SECONDS: 5.0, GRAD_NORM: None}})
    with caplog.at_level(logging.WARNING, logger="recipe"):
        printer.poll()
        printer.poll()  # nothing new: nothing said again
    warned = [record.getMessage() for record in caplog.records]
    assert len(warned) == 1 and warned[0].startswith("health: gradient norm not finite from step 2")
    assert len(lines) == (2 if with_lines else 0)


def test_the_run_report_lists_the_signs_in_its_json_and_its_table() -> None:
    from recipe.run.report import Peak, ReportInputs, build_report

    steps = {1: {STEP_SECONDS: 5.0, CLIPPED: 0.2}, 2: {STEP_SECONDS: 5.0, CLIPPED: 0.8}}
    report = build_report(steps, ReportInputs(exit_code=0, devices=1, memory=None, active_per_token=None,
                                              peak=Peak(None, "none")))  # fmt: skip
    [entry] = report.to_dict()["health"]
    assert entry["sign"] == "responses cut at the length limit" and entry["since_step"] == 2
    assert "  health: responses cut at the length limit from step 2 (80% of responses" in report.to_text("here")
    assert health.HEALTH_METRICS >= {CLIPPED, GRAD_NORM, MISMATCH_KL, MISMATCH_ABS}


def test_the_printer_and_the_report_judge_with_the_bounds_given(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """HEALTH_THRESHOLDS' bounds (recipe.run.trainer passes them): a KL of 0.003 is a sign at the default 0.002, none
    at 0.005, in the warning, the progress line's bound and the run report's signs and bounds alike."""
    from recipe.run.progress import ProgressPrinter
    from recipe.run.report import Peak, ReportInputs, build_report

    steps = {1: {STEP_SECONDS: 5.0, MISMATCH_KL: 0.003}}
    for bounds, signs in ((Thresholds(), ["rollout/training mismatch"]), (Thresholds(mismatch_kl=0.005), [])):
        lines: list[str] = []
        printer = ProgressPrinter(tmp_path, None, lines.append, bounds)
        printer.events, printer.since = _Events(steps), 0.0
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="recipe"):
            printer.poll()
        assert [message.split(" from ")[0] for message in caplog.messages] == [f"health: {name}" for name in signs]
        assert f"KL 0.003 (bound {bounds.mismatch_kl:g})" in lines[0]
        report = build_report(steps, ReportInputs(0, 1, None, Peak(None, "none"), None, bounds))
        assert [sign.name for sign in report.signs] == signs
        assert report.mismatch["kl"]["bound"] == bounds.mismatch_kl


def test_every_sign_said_is_one_the_curves_name() -> None:
    streams = [[{**SICK[name]}] * 2 for name in SICK]
    streams += [[{REWARD: 0.5}] * LIMITS.flat_steps, [{MISMATCH_KL: 1e-4 * k} for k in range(1, 8)]]
    names = {sign.name for stream in streams for sign in signs_of(dict(enumerate([{ENTROPY: 1.0}, *stream], 1)))}
    assert names == set(health.SIGN_NAMES)


#: Each sign's whole line, as a user reads it (the words are the contract: what was seen, what to look at).
LINES = {
    "responses cut at the length limit": (
        {CLIPPED: 0.75},
        "health: responses cut at the length limit from step 2: 75% of responses end at data.max_response_length "
        "(response_length/clip_ratio above 50%); the reward judges unfinished answers: raise data.max_response_length, "
        "or look at response_length/mean",
    ),
    "no reward spread": (
        {ADVANTAGE_MAX: 0.0, ADVANTAGE_MIN: 0.0},
        "health: no reward spread from step 2: every group's samples got the same reward (every advantage 0: this "
        "step's update had no gradient); make the task harder or easier for the model (critic/score/mean), or raise "
        "ROLLOUT_N",
    ),
    "entropy collapse": (
        {ENTROPY: 0.05},
        "health: entropy collapse from step 2: actor/entropy 0.05, below 0.1 of the first step's 1; the policy stopped "
        "exploring: lower the learning rate, or look at actor/pg_clipfrac",
    ),
    "gradient norm not finite": (
        {GRAD_NORM: None},
        "health: gradient norm not finite from step 2: actor/grad_norm is inf or NaN; in bf16 Megatron's optimizer "
        "checks gradients only with a loss scaler, so verl applied this update; the weights may hold NaN from here: "
        "resume from the save before this step (trainer.resume_mode=resume_path) with a lower learning rate",
    ),
    "rollout/training mismatch": (
        {MISMATCH_KL: 0.01},
        "health: rollout/training mismatch from step 2: rollout_corr/kl 0.01, above 0.002 (NeMo-RL's bound for this "
        "model); vLLM and Megatron disagree on the samples' log-probabilities: the update is off-policy",
    ),
}


def test_the_mismatch_line_names_each_anchors_unit_it_is_above() -> None:
    """Above both bounds: one sign, its line giving both figures (slime's unit is the recipe's own metric)."""
    watch = HealthWatch()
    assert watch.feed(1, {MISMATCH_KL: 0.001, MISMATCH_ABS: 0.25}) == [
        "health: rollout/training mismatch from step 1: rollout_corr/abs_log_prob_diff 0.25, above 0.1 (slime's "
        "bound); vLLM and Megatron disagree on the samples' log-probabilities: the update is off-policy"
    ]
    assert HealthWatch().feed(3, {MISMATCH_KL: 0.01, MISMATCH_ABS: 0.2}) == [
        "health: rollout/training mismatch from step 3: rollout_corr/kl 0.01, above 0.002 (NeMo-RL's bound for this "
        "model); rollout_corr/abs_log_prob_diff 0.2, above 0.1 (slime's bound); vLLM and Megatron disagree on the "
        "samples' log-probabilities: the update is off-policy"
    ]


@pytest.mark.parametrize("name", sorted(LINES))
def test_each_signs_line_says_what_was_seen_and_what_to_do(name: str) -> None:
    metrics, line = LINES[name]
    watch = HealthWatch()
    watch.feed(1, {ENTROPY: 1.0})
    assert watch.feed(2, metrics) == [line]


def test_the_slow_signs_lines_name_their_window() -> None:
    flat = _said([{REWARD: 0.25}] * LIMITS.flat_steps)
    assert flat == [(LIMITS.flat_steps, "health: reward flat from step 1: critic/rewards/mean within 0.001 over 10 steps "
                     "(last 0.25); nothing is being learnt: look at the reward function's scores (critic/score/mean) "
                     "and the data")]  # fmt: skip
    rising = _said([{MISMATCH_KL: 1e-4 * k} for k in range(1, 7)])
    assert rising == [(6, "health: mismatch growing from step 2: rollout_corr/kl rose at each of 5 steps, to 0.0006; "
                       "the rollout drifts from the trainer: look at rollout_corr/* and the weight sync")]  # fmt: skip


@pytest.mark.parametrize(("stream", "said"), [
    # A higher value before five rises: the five rises alone are the sign.
    ([5e-4, 1e-4, 2e-4, 3e-4, 4e-4, 5e-4, 6e-4], True),
    # Rising every two steps, falling between: not rising at each step.
    ([1e-4, 3e-4, 2e-4, 4e-4, 3e-4, 5e-4, 4e-4, 6e-4], False),
])  # fmt: skip
def test_the_mismatch_grows_only_when_it_rises_at_each_of_its_steps(stream: list[float], said: bool) -> None:
    assert any("mismatch growing" in line for _, line in _said([{MISMATCH_KL: v} for v in stream])) is said


def test_a_reward_spread_of_exactly_the_bound_is_not_flat_and_a_first_entropy_of_0_measures_nothing() -> None:
    assert _said([{REWARD: (k % 2) * LIMITS.flat_span} for k in range(LIMITS.flat_steps)]) == []  # 0.001 - 0.0: exact
    assert _said([{ENTROPY: 0.0}, {ENTROPY: -1.0}]) == []
