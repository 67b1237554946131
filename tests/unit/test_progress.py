"""`run`'s progress lines, read from event files that verl's own TensorBoard logger writes."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from recipe.run.progress import ProgressPrinter, printing_progress
from recipe.run.verl_metrics import REWARD, STEP_SECONDS
from recipe.run_length import StepTotal, total_steps

from .envtools import HANG_GUARD_S
from .runtools import DRIVER, layout_of_one, run_environment

tracking = pytest.importorskip("verl.utils.tracking", reason="verl's TensorBoard logger (pip install '.[trainer]')")


def _verl_logger(directory: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """verl 0.9.1's TensorBoard adapter, writing where the plan's TENSORBOARD_DIR points."""
    monkeypatch.setenv("TENSORBOARD_DIR", str(directory))
    return tracking._TensorboardAdapter("project", "experiment")


def _step(seconds: float, reward: float) -> dict[str, float]:
    return {REWARD: reward, STEP_SECONDS: seconds, "critic/score/mean": reward, "actor/grad_norm": 1.5}


def test_each_step_is_printed_once_with_reward_time_and_eta(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lines: list[str] = []
    printer = ProgressPrinter(tmp_path / "tb", StepTotal(10, False), lines.append)
    printer.poll()  # before verl's logger made the directory: nothing, no error
    writer = _verl_logger(tmp_path / "tb", monkeypatch)
    writer.log(_step(100.0, 0.25), step=1)
    writer.log(_step(50.0, 0.5), step=2)
    writer.writer.flush()
    printer.poll()
    printer.poll()
    writer.log(_step(60.0, 0.125), step=3)
    writer.finish()
    printer.poll()
    assert lines == [
        "progress: step 1 of 10, reward 0.250, 100.0 s/step, ETA 15m00s",
        "progress: step 2 of 10, reward 0.500, 50.0 s/step, ETA 10m00s",  # 8 steps x the mean of 100 and 50 s
        "progress: step 3 of 10, reward 0.125, 60.0 s/step, ETA 8m10s",
    ]


def test_a_resumed_run_prints_its_new_steps_and_an_estimated_total_says_about(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resume starts a second event file in the same directory, beside the earlier attempt's, which logged step 2
    and died before saving it: only this run's steps print, step 2 as trained again (found in the e2e's RayJob
    restart, which printed the earlier attempt's steps at its start and never its own step 2)."""
    first = _verl_logger(tmp_path, monkeypatch)
    first.log(_step(3600.0, 0.5), step=1)
    first.log(_step(3600.0, 0.25), step=2)
    first.finish()
    lines: list[str] = []
    printer = ProgressPrinter(tmp_path, StepTotal(3, True), lines.append)
    printer.poll()
    assert lines == []
    second = _verl_logger(tmp_path, monkeypatch)
    second.log(_step(3600.0, 0.75), step=2)
    second.log(_step(1800.0, 0.875), step=3)
    second.finish()
    printer.poll()
    assert lines == ["progress: step 2 of about 3, reward 0.750, 3600.0 s/step, ETA 1h00m",
                     "progress: step 3 of about 3, reward 0.875, 1800.0 s/step"]  # fmt: skip


def test_the_total_is_verls_setting_or_the_parquets_rows_per_batch_times_epochs(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as parquet

    data = tmp_path / "train.parquet"
    parquet.write_table(pa.table({"prompt": [f"p{i}" for i in range(10)]}), data)
    assert total_steps(None, data, 3, 2) == StepTotal(6, True)  # verl drops the last partial batch: 3 a epoch
    assert total_steps("7", data, 3, 2) == StepTotal(7, False)
    assert total_steps(None, tmp_path / "missing.parquet", 3, 2) is None
    assert total_steps(None, data, 32, 2) is None  # fewer rows than one batch: verl would stop at once
    assert total_steps(None, data, 10, 3) == StepTotal(3, True)  # exactly one batch a epoch
    # `-- trainer.total_training_steps=null` (or an empty value) leaves the count to verl, as no override does.
    assert total_steps("null", data, 3, 2) == total_steps("", data, 3, 2) == StepTotal(6, True)


def test_a_thread_prints_while_inside_and_the_last_steps_on_the_way_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines: list[str] = []
    with printing_progress(tmp_path, None, lines.append, interval_s=3600):
        writer = _verl_logger(tmp_path, monkeypatch)
        writer.log(_step(2.0, 1.0), step=1)
        writer.finish()
    assert lines == ["progress: step 1, reward 1.000, 2.0 s/step"]


@pytest.mark.parametrize(("argv", "setting", "prints"), [
    (["run"], None, True),  # the default: on, though stdout is a pipe (docker compose up, a pod's log)
    (["run", "--progress"], "off", True),
    (["run"], "off", False),
    (["run"], "auto", False),  # auto: only on a terminal, and a pipe is none
    (["run", "--no-progress"], "on", False),
])  # fmt: skip
def test_run_prints_plain_progress_lines_into_a_pipe_unless_turned_off(
    tmp_path: Path, model: Path, argv: list[str], setting: str | None, prints: bool
) -> None:
    """The stand-in trainer logs two steps through TensorBoard into the plan's TENSORBOARD_DIR, as verl's adapter
    does; `run`'s stdout is a pipe, as under `docker compose up` or in a pod."""
    env = run_environment(tmp_path, model, **layout_of_one(TOTAL_EPOCHS="1")) | {"STAND_IN_MODE": "tensorboard"}
    if setting is not None:
        env["PROGRESS"] = setting
    done = subprocess.run([sys.executable, "-c", DRIVER, *argv, "--", "trainer.total_training_steps=2"],
                          env=env, capture_output=True, text=True, timeout=HANG_GUARD_S, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("progress:")]
    assert lines == ([
        "progress: step 1 of 2, reward 0.500, 1.0 s/step, ETA 0m01s",
        "progress: step 2 of 2, reward 0.750, 1.0 s/step",
    ] if prints else [])  # fmt: skip
    assert "\x1b" not in done.stdout and "\r" not in done.stdout  # plain lines: no terminal control codes
    assert json.loads((tmp_path / "record.json").read_text())["env"]["TENSORBOARD_DIR"].startswith(str(tmp_path))


@pytest.mark.parametrize(("setting", "asked", "terminal", "prints"), [
    ("on", None, False, True), ("on", None, True, True), ("off", None, True, False), ("auto", None, True, True),
    ("auto", None, False, False), ("off", True, False, True), ("on", False, True, False),
])  # fmt: skip
def test_the_flag_wins_over_progress_which_is_on_by_default(
    setting: str, asked: bool | None, terminal: bool, prints: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from recipe.plan import build_plan
    from recipe.run import trainer

    from .envtools import settings_of

    monkeypatch.setattr(sys.stdout, "isatty", lambda: terminal)
    # The steps are read whatever is chosen (the signs of a failing run are always said); only the lines differ.
    with trainer._progress(build_plan(settings_of(DEVICE="gpu", PROGRESS=setting), environ={}), asked) as printer:
        assert (printer.emit is not None) is prints
    assert settings_of().progress == "on"


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan, 1e300])
def test_a_scalar_that_is_no_finite_time_or_reward_is_n_a_and_the_lines_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad: float
) -> None:
    """verl logs inf or NaN as they come (a NaN reward, a clock gone wrong): that step says n/a, the next prints."""
    lines: list[str] = []
    printer = ProgressPrinter(tmp_path, StepTotal(4, False), lines.append)
    writer = _verl_logger(tmp_path, monkeypatch)
    writer.log({REWARD: bad, STEP_SECONDS: bad if bad != 1e300 else 40.0}, step=1)
    writer.log(_step(40.0, 0.5), step=2)
    writer.finish()
    printer.poll()
    # 1e300 as a float32 scalar (TensorBoard's) is inf: n/a too; its step's time is a sound 40 s there.
    first = "n/a s/step" if bad != 1e300 else "40.0 s/step, ETA 2m00s"
    assert lines == [f"progress: step 1 of 4, reward n/a, {first}", "progress: step 2 of 4, reward 0.500, 40.0 s/step, ETA 1m20s"]


def test_an_event_file_that_is_a_fifo_stops_the_lines_with_a_warning_not_a_hang(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    os.mkfifo(tmp_path / "events.out.tfevents.1.planted")
    lines: list[str] = []
    with caplog.at_level("WARNING", logger="recipe"), printing_progress(tmp_path, None, lines.append, interval_s=0.05):
        pass
    assert lines == []
    assert any("progress lines stop" in message and "not a regular file" in message for message in caplog.messages)


def test_the_eta_averages_the_last_five_steps_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 52: a window tested over more steps than it holds. Two slow first steps (compilation, the first weight
    sync) leave the ETA once five later steps are in: 3 steps left x 10 s, not the mean of all seven (35.7 s)."""
    lines: list[str] = []
    printer = ProgressPrinter(tmp_path / "tb", StepTotal(10, False), lines.append)
    writer = _verl_logger(tmp_path / "tb", monkeypatch)
    for step, seconds in enumerate([100.0, 100.0, 10.0, 10.0, 10.0, 10.0, 10.0], start=1):
        writer.log(_step(seconds, 0.5), step=step)
    writer.finish()
    printer.poll()
    assert [line.rsplit("ETA ", 1)[1] for line in lines] == [
        "15m00s", "13m20s", "8m10s", "5m30s", "3m50s", "1m52s", "0m30s",  # steps 3-7: 7 x 70, 6 x 55, 5 x 46, 4 x 28, 3 x 10
    ]  # fmt: skip


@pytest.mark.parametrize(("kl", "gap", "capped", "shown"), [
    (0.0043, 0.0121, 0.0, "KL 0.0043 (bound 0.002), |Δlog p| 0.012 (bound 0.1), capped 0.0 %"),
    (2.5e-05, 0.25, 0.0125, "KL 2.5e-05 (bound 0.002), |Δlog p| 0.25 (bound 0.1), capped 1.2 %"),
    (math.nan, math.inf, math.nan, "KL n/a (bound 0.002), |Δlog p| n/a (bound 0.1), capped n/a %"),
])  # fmt: skip
def test_the_mismatch_in_both_units_and_the_capped_share_are_shown_before_the_eta(
    kl: float, gap: float, capped: float, shown: str
) -> None:
    """Issue 53: the mismatch, each step, in NeMo-RL's unit (verl's rollout_corr/kl) and slime's (the recipe's mean
    absolute gap per token), each beside its sign's bound, and the share of tokens the correction capped, in the
    words PROGRESS_LINE says."""
    from recipe.numbers import finite_or_none
    from recipe.run.health import MISMATCH_ABS, MISMATCH_KL
    from recipe.run.progress import PROGRESS_LINE, progress_line
    from recipe.run.verl_metrics import CAPPED_TOKENS

    metrics = {STEP_SECONDS: 10.0, MISMATCH_KL: finite_or_none(kl), MISMATCH_ABS: finite_or_none(gap),
               CAPPED_TOKENS: finite_or_none(capped)}  # fmt: skip
    line = progress_line(1, metrics, StepTotal(3, False), [10.0])
    assert line == f"progress: step 1 of 3, 10.0 s/step, {shown}, ETA 0m20s"
    assert progress_line(1, {STEP_SECONDS: 10.0}, StepTotal(3, False), [10.0]) == "progress: step 1 of 3, 10.0 s/step, ETA 0m20s"
    # The bounds are HEALTH_THRESHOLDS' (recipe.settings), the ones the signs start at.
    from recipe.run.health import Thresholds

    raised = progress_line(1, metrics, StepTotal(3, False), [10.0], Thresholds(mismatch_kl=0.005, mismatch_abs=0.2))
    assert raised == line.replace("(bound 0.002)", "(bound 0.005)").replace("(bound 0.1)", "(bound 0.2)") != line
    assert PROGRESS_LINE.endswith("tokens/s/device, the rollout/training mismatch in NeMo-RL's and slime's units beside "
                                  "their bounds and the share of tokens the correction capped, ETA")


def test_the_line_splits_the_step_into_verls_phases_in_their_order_and_gives_the_rate() -> None:
    """Every timer verl logged, in the order a step runs them, each by its short name; n/a where not finite."""
    from recipe.run.verl_metrics import PHASES, THROUGHPUT
    from recipe.run.progress import progress_line

    metrics: dict[str, float | None] = {STEP_SECONDS: 72.25, REWARD: 0.0625, THROUGHPUT: 29.35,
                                        **{tag: float(i) for i, tag in enumerate(PHASES.values())}}  # fmt: skip
    metrics[PHASES["save"]] = None
    assert progress_line(2, metrics, StepTotal(5, False), [70.0, 80.0]) == (
        "progress: step 2 of 5, reward 0.062, 72.2 s/step (gen 0.0, reward 1.0, old 2.0, ref 3.0, adv 4.0, "
        "update 5.0, save n/a, sync 7.0), 29.4 tokens/s/device, ETA 3m45s"
    )  # fmt: skip
    # Without a step time no split and no rate of it; without a total no "of" and no ETA; none on the last step.
    assert progress_line(3, {THROUGHPUT: None}, None, [1.0]) == "progress: step 3, n/a tokens/s/device"
    assert progress_line(5, {STEP_SECONDS: 1.0}, StepTotal(5, True), [1.0]) == "progress: step 5 of about 5, 1.0 s/step"
    assert progress_line(4, {STEP_SECONDS: 3600.0}, StepTotal(6, False), [3900.0]) == (
        "progress: step 4 of 6, 3600.0 s/step, ETA 2h10m")


@pytest.mark.parametrize(("seconds", "counted"), [(0.0, True), (365 * 86400.0, True), (365 * 86400.0 + 1, False)])
def test_a_step_time_from_0_to_a_year_counts_in_the_eta_and_one_past_a_year_does_not(
    tmp_path: Path, seconds: float, counted: bool
) -> None:
    """The bounds of MAX_STEP_SECONDS themselves, over more steps than the ETA's window (six)."""
    from recipe.run import progress

    lines: list[str] = []
    printer = ProgressPrinter(tmp_path, StepTotal(100, False), lines.append)
    printer.events = _Events({1: {STEP_SECONDS: seconds}, **{s: {STEP_SECONDS: 10.0} for s in range(2, 7)}})
    printer.since = 0.0  # the fixed scalars' wall time (1.0) is after the printer's start
    printer.poll()
    assert sorted(printer.seconds) == ([1, 2, 3, 4, 5, 6] if counted else [2, 3, 4, 5, 6])
    assert progress.MAX_STEP_SECONDS == 365 * 86400.0
    # Step 6's ETA: the last five steps counted (steps 2-6 either way: the window, not step 1).
    assert lines[-1].endswith("ETA 15m40s")  # 94 steps x 10 s


class _Events:
    """tensorboard's reader as read_steps uses it, over fixed scalars (all logged at wall time 1.0)."""

    def __init__(self, steps: dict[int, dict[str, float | None]], wall_time: float = 1.0) -> None:
        self.steps, self.wall_time = steps, wall_time

    def Reload(self) -> None:  # noqa: N802 - tensorboard's name
        pass

    def Tags(self) -> dict[str, list[str]]:  # noqa: N802 - tensorboard's name
        return {"scalars": sorted({tag for values in self.steps.values() for tag in values})}

    def Scalars(self, tag: str) -> list[Any]:  # noqa: N802 - tensorboard's name
        from types import SimpleNamespace

        return [SimpleNamespace(step=step, value=math.nan if values[tag] is None else values[tag],
                                wall_time=self.wall_time)
                for step, values in sorted(self.steps.items()) if tag in values]  # fmt: skip


def test_only_what_was_logged_from_the_printers_start_on_is_read() -> None:
    """`since` itself counts: a scalar logged at the very time the printer started is this run's."""
    from recipe.run.progress import read_steps

    events = _Events({1: {STEP_SECONDS: 2.0, REWARD: math.inf}}, wall_time=100.0)
    assert read_steps(events, None, since=100.0) == {1: {STEP_SECONDS: 2.0, REWARD: None}}
    assert read_steps(events, None, since=100.5) == {}
    assert read_steps(events) == {1: {STEP_SECONDS: 2.0, REWARD: None}}


def test_why_an_event_folder_is_not_read(tmp_path: Path) -> None:
    """No folder, a name that leads nowhere, a folder where a file goes, a file past 64 GiB (sparse): each named; a file
    of exactly 64 GiB and names without "tfevents" are read or left alone."""
    from recipe.run.progress import MAX_EVENT_FILE_BYTES, event_file_problem

    assert event_file_problem(tmp_path / "absent") == f"{tmp_path / 'absent'}: cannot be listed (No such file or directory)"
    (tmp_path / "notes.txt").mkdir()  # not an event file's name: never opened
    at_bound = tmp_path / "events.out.tfevents.1.host"
    with at_bound.open("wb") as out:
        out.truncate(MAX_EVENT_FILE_BYTES)
    assert MAX_EVENT_FILE_BYTES == 64 << 30 and event_file_problem(tmp_path) is None
    with at_bound.open("r+b") as out:
        out.truncate(MAX_EVENT_FILE_BYTES + (1 << 30))
    assert event_file_problem(tmp_path) == f"{at_bound}: 65 GiB, above the 64 GiB an event file of a run holds"
    at_bound.unlink()
    (tmp_path / "events.out.tfevents.2.host").mkdir()
    assert event_file_problem(tmp_path) == f"{tmp_path / 'events.out.tfevents.2.host'}: not a regular file"
    (tmp_path / "events.out.tfevents.2.host").rmdir()
    (tmp_path / "events.out.tfevents.3.host").symlink_to(tmp_path / "gone")
    assert event_file_problem(tmp_path) == (f"{tmp_path / 'events.out.tfevents.3.host'}: cannot be examined "
                                            "(No such file or directory)")  # fmt: skip


def test_a_sign_is_said_once_at_the_step_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Three steps, a gradient norm not finite in step 2: one warning naming step 2, the progress lines go on (the
    signs' curves are logged by the trainer beside verl's: tests/unit/test_health_log.py)."""
    import logging

    lines: list[str] = []
    printer = ProgressPrinter(tmp_path, None, lines.append)
    writer = _verl_logger(tmp_path, monkeypatch)
    for step, norm in ((1, 1.0), (2, math.inf), (3, 1.0)):
        writer.log({STEP_SECONDS: 5.0, "actor/grad_norm": norm}, step=step)
    writer.finish()
    with caplog.at_level(logging.WARNING, logger="recipe"):
        printer.poll()
    assert len(lines) == 3
    [warning] = caplog.messages
    assert warning.startswith("health: gradient norm not finite from step 2: actor/grad_norm is inf or NaN")


def test_read_steps_without_a_folder_checks_none_and_a_reader_without_scalars_gives_no_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from recipe.run.progress import read_steps

    monkeypatch.chdir(tmp_path)
    os.mkfifo(tmp_path / "events.out.tfevents.9.planted")  # in the working folder, which is no event folder of ours
    assert read_steps(_Events({1: {STEP_SECONDS: 2.0}})) == {1: {STEP_SECONDS: 2.0}}

    class NoScalars(_Events):
        def Tags(self) -> dict[str, list[str]]:  # noqa: N802 - tensorboard's name
            return {"images": []}

    assert read_steps(NoScalars({})) == {}


def test_every_step_of_a_run_longer_than_tensorboards_default_sample_is_read(tmp_path: Path) -> None:
    """tensorboard's reader keeps 10,000 scalars a tag by default (a random sample past that); `run` keeps them all."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    from recipe.run.progress import event_reader, read_steps

    writer = EventFileWriter(str(tmp_path))
    for step in range(1, 10_002):
        writer.add_event(Event(wall_time=1.0, step=step, summary=Summary(value=[Summary.Value(tag=STEP_SECONDS,
                                                                                              simple_value=1.0)])))  # fmt: skip
    writer.close()
    assert len(read_steps(event_reader(tmp_path), tmp_path)) == 10_001
