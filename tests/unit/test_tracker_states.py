"""One rule for every state of verl's tracker and the saves beside it, in `plan` and `run` alike (issue 50, class 6).

Generated states of the checkpoint root (the tracker: absent, a number verl reads, text it cannot read, a
directory, a FIFO, a dangling or looping link; and saves beside it: none, complete ones, unfinished ones) are
laid on the real file system, and three readers are asked: `plan` (build_plan, in process), `run`'s resume
guard (on a plan made before the state was laid, as when the state changes between the two), and, for the
named states, the real `entrypoint.py plan` and `run` in a process. Each must say what an oracle written from
the rule says: resume from a finished tracked save; start fresh only where nothing is saved; refuse (exit 2,
nothing started, nothing written) everything else, naming the ways out.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings as hypothesis_settings, strategies as st

from recipe.checkpoint_tracker import TRACKER_NAME
from recipe.errors import RecipeConfigError
from recipe.plan import build_plan
from recipe.run_length import RESUME_WAYS_OUT

from .test_plan_orchestration import full

#: The tracker's kinds other than a regular file: none of them holds a step verl can read.
UNREADABLE_KINDS = ("directory", "fifo", "dangling link", "looping link")


@dataclass(frozen=True)
class State:
    """A checkpoint root: the tracker (None: absent; bytes: a regular file; else one of UNREADABLE_KINDS), the saves."""

    tracker: bytes | str | None
    #: step -> whether verl finished that save (its manifest and HF export folder are there).
    saves: tuple[tuple[int, bool], ...]

    def lay(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        for step, finished in self.saves:
            actor = root / f"global_step_{step}" / "actor"
            actor.mkdir(parents=True)
            if finished:
                (actor / "model" / "huggingface").mkdir(parents=True)
                (actor / "ckpt_contents.json").write_text("{}")
        tracker = root / TRACKER_NAME
        if isinstance(self.tracker, bytes):
            tracker.write_bytes(self.tracker)
        elif self.tracker == "directory":
            tracker.mkdir()
        elif self.tracker == "fifo":
            os.mkfifo(tracker)
        elif self.tracker == "dangling link":
            tracker.symlink_to(root / "nowhere")
        elif self.tracker == "looping link":
            tracker.symlink_to(tracker)

    def expected(self) -> tuple[str, int | None]:
        """The oracle: ("resume", step), ("fresh", None) or ("refused", None), from the rule and verl's int() alone."""
        saved = dict(self.saves)
        if isinstance(self.tracker, str):
            return "refused", None
        if self.tracker is None:
            return ("refused", None) if saved else ("fresh", None)
        try:
            step = int(self.tracker.decode())  # what verl 0.9.1 reads: int(f.read().decode())
        except (UnicodeDecodeError, ValueError):
            return "refused", None
        if step in saved:
            return ("resume", step) if saved[step] else ("refused", None)
        return ("refused", None) if saved else ("fresh", None)


def _tracker_texts() -> st.SearchStrategy[bytes]:
    numbers = st.integers(-3, 8).map(str) | st.just("9" * 30) | st.sampled_from([" 2\n", "+2", "0_2", "02"])
    words = st.sampled_from(["", " ", "abc", "2.0", "two", "\n"]) | st.text(max_size=6)
    return (numbers | words).map(str.encode) | st.sampled_from([b"\xff", b"2\x00", b"\xef\xbb\xbf2"])


STATES = st.builds(
    State,
    st.none() | _tracker_texts() | st.sampled_from(UNREADABLE_KINDS),
    st.lists(st.tuples(st.integers(0, 8), st.booleans()), max_size=3, unique_by=lambda save: save[0]).map(tuple),
)


def _root(tmp: Path) -> Path:
    return tmp / "ck" / "grpo_qwen3_5_35b_geo3k" / "qwen3_5_35b_megatron"


def _plan_says(tmp: Path, model: Path) -> tuple[str, int | None, str]:
    """build_plan's answer: its resume action and step, or ("refused", None, the message)."""
    try:
        plan = build_plan(full(tmp, model), {})
    except RecipeConfigError as error:
        return "refused", None, str(error)
    return plan.resume["action"], plan.resume["step"], plan.resume["text"]


def _check(state: State, tmp: Path, model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from recipe.export import hf_check
    from recipe.export.report import ExportReport
    from recipe.run.resume_guard import resume_problem

    # The export's own check has its tests (test_resume_guard.py): here every finished save's export is sound.
    monkeypatch.setattr(hf_check, "verify_export", lambda directory, reference=None: ExportReport(
        directory=str(directory), status="complete", architecture="A", expected_count=1, present_count=1))  # fmt: skip
    before_state = build_plan(full(tmp, model), {})  # nothing laid yet: a fresh start
    state.lay(_root(tmp))
    action, step, text = _plan_says(tmp, model)
    assert (action, step) == state.expected(), text
    guard = resume_problem(before_state)
    assert (guard is not None) == (action == "refused"), guard
    if action == "refused":
        assert text.startswith(f"CHECKPOINT_DIR={str(tmp / 'ck')!r}: ") and text.endswith(RESUME_WAYS_OUT)
        assert "\n" not in text and guard is not None and guard.endswith(RESUME_WAYS_OUT)


@given(state=STATES)
@example(state=State(None, ((2, True),)))  # saves and no tracker: verl would train afresh over them
@example(state=State("dangling link", ((2, True),)))  # verl reads "no tracker"
@example(state=State("looping link", ()))
@example(state=State("directory", ()))
@example(state=State("fifo", ((1, True),)))
@example(state=State(b"5", ((2, True),)))  # a step past the newest save
@example(state=State(b"-1", ((2, True),)))
@example(state=State(b"9" * 30, ()))  # huge, nothing saved: fresh
@example(state=State(b"2", ((2, False),)))  # an empty step folder: verl never finished it
@example(state=State(b"abc", ((2, True),)))
@example(state=State(b"2", ((1, True), (2, True))))  # the control: resumes
@example(state=State(None, ()))  # the control: fresh
@hypothesis_settings(max_examples=8, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_plan_and_runs_guard_follow_one_rule_for_every_tracker_state(
    state: State, tmp_path_factory: pytest.TempPathFactory, model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _check(state, tmp_path_factory.mktemp("state"), model, monkeypatch)


@pytest.mark.parametrize(
    "state",
    [State("dangling link", ((2, True),)), State(None, ((2, True),)), State(b"5", ((2, True),))],
    ids=["dangling-link-beside-a-save", "saves-without-a-tracker", "tracker-past-the-newest-save"],
)
def test_the_real_plan_and_run_refuse_a_fresh_start_over_saves_and_write_nothing(tmp_path: Path, model: Path,
                                                                                  state: State) -> None:
    """Through the real CLI in a process: exit 2, one line naming the ways out, the trainer never started, no file changed."""
    from .runtools import cli, layout_of_one, recorded, run_environment

    env = run_environment(tmp_path, model, **layout_of_one())
    root = Path(env["CHECKPOINT_DIR"]) / env["PROJECT_NAME"] / env["EXPERIMENT_NAME"]
    state.lay(root)
    before = sorted((p, p.is_symlink() or p.stat().st_mtime_ns) for p in tmp_path.rglob("*"))
    for command in (["plan"], ["plan", "--json"], ["run"]):
        done = cli(command, env)
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        errors = [line for line in done.stderr.splitlines() if RESUME_WAYS_OUT in line]
        assert len(errors) == 1 and "EXPERIMENT_NAME" in errors[0], done.stderr
        assert "Traceback" not in done.stderr
    assert recorded(tmp_path) is None
    assert sorted((p, p.is_symlink() or p.stat().st_mtime_ns) for p in tmp_path.rglob("*")) == before
    assert json.dumps(state.expected()) == json.dumps(["refused", None])


# --- the resume point and the planned total, by direct calls (issue 52: every resume_mode; totals raised, lowered,
# estimated) ----------------------------------------------------------------------------------------------------------


def _saved(root: Path, *steps: int, tracked: int | None = None) -> None:
    """Finished saves of `steps` under root, and the tracker naming `tracked` (none when None)."""
    State(None if tracked is None else str(tracked).encode(), tuple((s, True) for s in steps)).lay(root)


@pytest.mark.parametrize(("mode", "resume_from", "step", "reason"), [
    ("disable", None, None, "trainer.resume_mode=disable"),
    ("resume_path", None, None, "trainer.resume_mode=resume_path without trainer.resume_from_path"),
    ("resume_path", "", None, "trainer.resume_mode=resume_path without trainer.resume_from_path"),
    ("resume_path", "/ck/p/e/latest", None, "trainer.resume_from_path=/ck/p/e/latest names no global_step_N directory"),
    ("resume_path", "/ck/p/e/global_step_7", 7, "trainer.resume_from_path=/ck/p/e/global_step_7"),
    ("resume_path", "/ck/global_step_3/x", None, "trainer.resume_from_path=/ck/global_step_3/x names no global_step_N "
                                                  "directory"),
    ("auto", None, 4, "the newest save under {root} (trainer.resume_mode=auto)"),
    (None, None, 4, "the newest save under {root} (trainer.resume_mode=auto)"),  # verl's default mode is auto
])  # fmt: skip
def test_every_resume_mode_names_its_step_and_why(tmp_path: Path, mode: str | None, resume_from: str | None,
                                                   step: int | None, reason: str) -> None:
    from recipe.run_length import StepTotal, resume_point

    _saved(tmp_path, 2, 4, tracked=4)
    point = resume_point(mode, resume_from, tmp_path, StepTotal(4, False))
    assert (point.step, point.reason) == (step, reason.format(root=tmp_path))
    assert point.path == (None if step is None else (tmp_path / "global_step_4" if mode in ("auto", None)
                                                      else Path(str(resume_from))))  # fmt: skip
    assert point.finished is (step is not None and step >= 4)
    assert point.total == StepTotal(4, False)  # every point keeps the plan's total, a fresh start's too


@pytest.mark.parametrize("state", ["empty", "tracker of nothing"])
def test_a_fresh_start_keeps_the_planned_total(tmp_path: Path, state: str) -> None:
    """Nothing saved (with or without a tracker naming a step that is not there): fresh, with the plan's total, which
    `plan --json` states (planned_steps)."""
    from recipe.run_length import StepTotal, resume_point

    if state != "empty":
        (tmp_path / "latest_checkpointed_iteration.txt").write_text("7")
    point = resume_point("auto", None, tmp_path, StepTotal(12, True))
    assert (point.step, point.total, point.to_dict()["planned_steps"]) == (None, StepTotal(12, True), 12)


def test_a_tracker_verl_cannot_read_names_why_after_what_cannot_be_told(tmp_path: Path) -> None:
    from recipe.run_length import ResumeCheckError, resume_point

    (tmp_path / "latest_checkpointed_iteration.txt").write_text("abc")
    with pytest.raises(ResumeCheckError) as refused:
        resume_point("auto", None, tmp_path, None)
    assert str(refused.value).startswith("cannot tell which checkpoint verl would resume from: ")
    assert "abc" in str(refused.value)


@pytest.mark.parametrize(("saved", "total", "finished", "said"), [
    (20, None, False, "resumes from global_step_20: r"),
    (20, (300, False), False, "resumes from global_step_20 (of 300 planned): r"),
    (20, (20, False), True, "resumes from global_step_20 (of 20 planned): r; the run already finished: nothing is "
                            "left to train"),
    (20, (19, False), True, "resumes from global_step_20 (of 19 planned): r; the run already finished: nothing is "
                            "left to train"),  # the total lowered after the save
    (20, (21, False), False, "resumes from global_step_20 (of 21 planned): r"),  # raised: one more step
    (20, (20, True), True, "resumes from global_step_20 (of about 20 planned): r; the run already finished: nothing "
                           "is left to train"),
    (20, (21, True), False, "resumes from global_step_20 (of about 21 planned): r"),
    (None, (20, False), False, "starts fresh: r"),
])  # fmt: skip
def test_a_resume_point_against_a_total_raised_lowered_or_estimated(
    saved: int | None, total: tuple[int, bool] | None, finished: bool, said: str
) -> None:
    from recipe.run_length import ResumePoint, StepTotal

    planned = None if total is None else StepTotal(*total)
    point = ResumePoint(saved, None if saved is None else Path(f"/ck/global_step_{saved}"), "r", planned)
    assert (point.finished, point.describe()) == (finished, said)
    assert point.to_dict() == {
        "action": "fresh" if saved is None else "resume", "step": saved,
        "path": None if saved is None else f"/ck/global_step_{saved}", "reason": "r",
        "planned_steps": None if total is None else total[0], "planned_steps_estimated": None if total is None else total[1],
        "finished": finished,
    }  # fmt: skip


def test_the_total_says_about_only_when_estimated() -> None:
    from recipe.run_length import StepTotal, total_steps

    assert (str(StepTotal(12, False)), str(StepTotal(12, True))) == ("12", "about 12")
    assert total_steps("12", Path("/absent.parquet"), 4, 1) == StepTotal(12, False)
    assert total_steps("twelve", Path("/absent.parquet"), 4, 1) is None


def test_the_saves_are_listed_lowest_step_first_by_number_and_only_verls_names(tmp_path: Path) -> None:
    from recipe.run_length import saved_steps

    assert saved_steps(tmp_path / "absent") == []
    for name in ("global_step_10", "global_step_9", "global_step_100", "global_step_x", "global_step_", "step_3",
                 "global_step_2.tmp", "global_step_٣"):  # the last one's digit is Arabic-Indic: not verl's
        (tmp_path / name).mkdir()
    (tmp_path / "global_step_1").write_text("a file counts too")
    assert saved_steps(tmp_path) == ["global_step_1", "global_step_9", "global_step_10", "global_step_100"]


@pytest.mark.parametrize(("steps", "listed"), [
    ((1, 2, 3), "global_step_1, global_step_2, global_step_3"),
    ((1, 2, 3, 4), "global_step_1, global_step_2, global_step_3 and 1 more"),
    ((5, 6, 7, 8, 9, 10), "global_step_5, global_step_6, global_step_7 and 3 more"),
])  # fmt: skip
def test_a_fresh_start_over_saves_is_refused_naming_three_of_them_and_how_many_more(
    tmp_path: Path, steps: tuple[int, ...], listed: str
) -> None:
    from recipe.run_length import ResumeCheckError, resume_point

    _saved(tmp_path, *steps)
    with pytest.raises(ResumeCheckError) as refused:
        resume_point("auto", None, tmp_path, None)
    assert str(refused.value) == (f"no tracker, so verl would train afresh over the saves beside it ({listed}), "
                                  "overwriting or mixing them")  # fmt: skip
    (tmp_path / TRACKER_NAME).write_text("99")
    with pytest.raises(ResumeCheckError) as named:
        resume_point("auto", None, tmp_path, None)
    assert str(named.value).startswith(f"{tmp_path / TRACKER_NAME} names a step that is not saved, so verl would ")


def test_auto_without_saves_starts_fresh_and_says_why(tmp_path: Path) -> None:
    from recipe.run_length import resume_point

    assert resume_point("auto", None, tmp_path, None).reason == f"nothing saved under {tmp_path} yet"
    (tmp_path / TRACKER_NAME).write_text("3")
    fresh = resume_point("auto", None, tmp_path, None)
    assert (fresh.step, fresh.reason) == (None, f"the tracker under {tmp_path} names a step that is not saved, and "
                                                "nothing is")  # fmt: skip


def test_a_tracked_save_verl_never_finished_or_without_its_hf_export_is_refused_by_name(tmp_path: Path) -> None:
    from recipe.run_length import RESUMED_HF_DIR, ResumeCheckError, resume_point

    State(b"5", ((5, False),)).lay(tmp_path)
    step_dir = tmp_path / "global_step_5"
    with pytest.raises(ResumeCheckError) as unfinished:
        resume_point("auto", None, tmp_path, None)
    assert str(unfinished.value) == (f"the checkpoint resume would load (step 5) is incomplete: "
                                     f"{step_dir / 'actor' / 'ckpt_contents.json'}, which verl writes last, is missing")  # fmt: skip
    (step_dir / "actor" / "ckpt_contents.json").write_text("{}")
    with pytest.raises(ResumeCheckError) as no_export:
        resume_point("auto", None, tmp_path, None)
    assert str(no_export.value) == (f"the checkpoint resume would load (step 5) has no HF export at "
                                    f"{step_dir / RESUMED_HF_DIR} (the weights verl reloads), so it cannot be checked")  # fmt: skip
    assert RESUMED_HF_DIR == "actor/model/huggingface"
    (tmp_path / TRACKER_NAME).unlink()
    (tmp_path / TRACKER_NAME).symlink_to(tmp_path / "nowhere")
    with pytest.raises(ResumeCheckError) as dangling:
        resume_point("auto", None, tmp_path, None)
    assert str(dangling.value) == (f"cannot tell which checkpoint verl would resume from: {tmp_path / TRACKER_NAME} is "
                                   "a link that leads nowhere (dangling or looping)")  # fmt: skip
