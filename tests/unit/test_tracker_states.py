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
