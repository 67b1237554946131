"""The resume guard cannot be walked around (issue 11, item 14).

`run` resumes with verl's `trainer.resume_mode=auto`, which reads
<default_local_dir>/latest_checkpointed_iteration.txt the way verl 0.9.1's
`find_latest_ckpt_path` does: `int(f.read().decode())`, then `global_step_{N}`. The guard
mirrors that parsing (a hypothesis battery compares it with verl's own function on the same
bytes) and refuses, with exit 2 and a way out, whatever it cannot check. A refusal writes nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

from recipe.checkpoint_tracker import ResumeCheckError, tracked_step_dir
from recipe.run.resume_guard import resume_problem
from recipe.errors import RecipeConfigError
from recipe.plan import build_plan
from recipe.settings import Settings
from tests.support.needs import TRAINER_EXTRA, needs
from tests.unit.envtools import HANG_GUARD_S

TRACKER = "latest_checkpointed_iteration.txt"


def _checkpoint(root: Path, export: Path | None, step: int, *, tracker: bytes | None = None, manifest: bool = True) -> Path:
    """Lay out `export` as verl 0.9.1 saves step `step` under root (manifest and tracker last)."""
    actor = root / f"global_step_{step}" / "actor"
    actor.mkdir(parents=True, exist_ok=True)
    if export is not None:
        shutil.copytree(export, actor / "model" / "huggingface")
    if manifest:
        (actor / "ckpt_contents.json").write_text("{}")
    (root / TRACKER).write_bytes(str(step).encode() if tracker is None else tracker)
    return actor


def _plan(checkpoints: Path, *extra: str):  # type: ignore[no-untyped-def]
    settings = Settings.model_validate({"device": "gpu", "checkpoint_dir": checkpoints, "project_name": "p", "experiment_name": "e"})
    return build_plan(settings, {}, extra)


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def _refusal(checkpoints: Path, *extra: str) -> str:
    """The refusal of plan or of the guard (either is exit 2 before anything starts); asserts it writes nothing."""
    before = _snapshot(checkpoints)
    try:
        plan = _plan(checkpoints, *extra)
    except RecipeConfigError as error:
        problem = "\n".join(error.problems)
    else:
        problem = resume_problem(plan)  # type: ignore[assignment]
    assert problem is not None, "allowed"
    assert _snapshot(checkpoints) == before, "the refusal wrote something"
    return problem


def _way_out(problem: str) -> None:
    assert "trainer.resume_mode=resume_path" in problem and "trainer.resume_mode=disable" in problem


def _break(export: Path, tensors_of, rewrite_checkpoint) -> None:  # type: ignore[no-untyped-def]
    norm = next(name for name in tensors_of(export) if name.endswith("norm.weight"))
    rewrite_checkpoint(export, lambda tensors: tensors.pop(norm))


def test_a_zero_padded_tracker_finds_the_broken_step_verl_would_load(qwen35_copy: Path, tmp_path: Path, tensors_of, rewrite_checkpoint) -> None:  # type: ignore[no-untyped-def]
    _break(qwen35_copy, tensors_of, rewrite_checkpoint)
    _checkpoint(tmp_path / "p" / "e", qwen35_copy, 40, tracker=b"040\n")
    problem = _refusal(tmp_path)
    assert "(step 40) has a broken HF export" in problem
    _way_out(problem)


@pytest.mark.parametrize("tracker", [b"\xff\xfe4\x000", b"", b"forty", b"4.0", b"0x28", b"40 41"])
def test_a_tracker_verl_cannot_read_is_refused_without_a_traceback(qwen35_copy: Path, tmp_path: Path, tracker: bytes) -> None:
    _checkpoint(tmp_path / "p" / "e", qwen35_copy, 40, tracker=tracker)
    problem = _refusal(tmp_path)
    assert TRACKER in problem
    _way_out(problem)


def test_a_step_without_ckpt_contents_is_refused(qwen35_copy: Path, tmp_path: Path) -> None:
    _checkpoint(tmp_path / "p" / "e", qwen35_copy, 40, manifest=False)
    problem = _refusal(tmp_path)
    assert "ckpt_contents.json" in problem and "step 40" in problem
    _way_out(problem)


def test_a_step_without_an_hf_export_is_refused(tmp_path: Path) -> None:
    _checkpoint(tmp_path / "p" / "e", None, 40)
    problem = _refusal(tmp_path)
    assert "model/huggingface" in problem
    _way_out(problem)


def test_an_export_lacking_config_json_is_refused(qwen35_copy: Path, tmp_path: Path, tensors_of, rewrite_checkpoint) -> None:  # type: ignore[no-untyped-def]
    _break(qwen35_copy, tensors_of, rewrite_checkpoint)
    (qwen35_copy / "config.json").unlink()
    _checkpoint(tmp_path / "p" / "e", qwen35_copy, 40)
    problem = _refusal(tmp_path)
    assert "cannot be checked" in problem and "config.json" in problem
    _way_out(problem)


def test_an_unknown_architecture_is_refused(qwen35_copy: Path, tmp_path: Path) -> None:
    config = json.loads((qwen35_copy / "config.json").read_text())
    config["architectures"] = ["NoSuchModelForCausalLM"]
    (qwen35_copy / "config.json").write_text(json.dumps(config))
    _checkpoint(tmp_path / "p" / "e", qwen35_copy, 40)
    problem = _refusal(tmp_path)
    assert "cannot be checked" in problem and "NoSuchModelForCausalLM" in problem
    _way_out(problem)


@pytest.mark.parametrize(
    "mode",
    ["trainer.resume_mode=AUTO", "trainer.resume_mode=${oc.env:RECIPE_TEST_RESUME,auto}", "trainer.resume_mode=Auto ",
     "trainer.resume_mode=null", "~trainer.resume_mode", "++trainer.resume_mode=resume", "trainer.resume_mode=[auto]"],
)
def test_a_resume_mode_the_guard_cannot_read_is_refused(qwen35_copy: Path, tmp_path: Path, mode: str, tensors_of, rewrite_checkpoint) -> None:  # type: ignore[no-untyped-def]
    _break(qwen35_copy, tensors_of, rewrite_checkpoint)
    _checkpoint(tmp_path / "p" / "e", qwen35_copy, 40)
    problem = _refusal(tmp_path, mode)
    assert "resume_mode" in problem


def test_the_guard_itself_refuses_a_mode_it_cannot_read(tmp_path: Path) -> None:
    """Even for a plan whose overrides were not checked by build_plan (defence in depth)."""
    plan = _plan(tmp_path)
    hostile = plan.__class__(**{**plan.__dict__, "overrides": [*plan.overrides, "trainer.resume_mode=AUTO"]})
    problem = resume_problem(hostile)
    assert problem is not None and "trainer.resume_mode='AUTO'" in problem
    _way_out(problem)


def test_a_fifo_tracker_is_refused_without_blocking(tmp_path: Path) -> None:
    root = tmp_path / "p" / "e"
    root.mkdir(parents=True)
    os.mkfifo(root / TRACKER)
    out: list[str | None] = []
    worker = threading.Thread(target=lambda: out.append(_refusal(tmp_path)), daemon=True)
    worker.start()
    worker.join(timeout=HANG_GUARD_S)
    assert not worker.is_alive(), "the guard blocked on a FIFO"
    assert out and "not a regular file" in (out[0] or "")


def test_a_tracker_that_is_a_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "p" / "e" / TRACKER).mkdir(parents=True)
    assert "not a regular file" in _refusal(tmp_path)


def test_a_tracker_naming_a_missing_step_trains_from_scratch_like_verl(tmp_path: Path) -> None:
    root = tmp_path / "p" / "e"
    root.mkdir(parents=True)
    (root / TRACKER).write_text("40")
    assert resume_problem(_plan(tmp_path)) is None


def test_disable_is_the_way_out_and_passes(qwen35_copy: Path, tmp_path: Path, tensors_of, rewrite_checkpoint) -> None:  # type: ignore[no-untyped-def]
    _break(qwen35_copy, tensors_of, rewrite_checkpoint)
    _checkpoint(tmp_path / "p" / "e", qwen35_copy, 40, tracker=b"\xff")
    assert resume_problem(_plan(tmp_path, "trainer.resume_mode=disable")) is None


# --- the battery: the guard's reading of the tracker against verl's own ----------------------------

_tracker_bytes = st.one_of(
    st.binary(max_size=12),
    st.text(st.sampled_from(list("0123456789 \t\n+-_.x") + ["٤", "٠", "\u00a0", "\u2003", "０"]), max_size=8).map(lambda s: s.encode()),
    st.integers(-3, 60).map(lambda n: str(n).encode()),
    st.builds(lambda n, pad: (pad + str(n) + pad).encode(), st.integers(0, 60), st.sampled_from(["", " ", "\n", "0", "00"])),
)


@hsettings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=_tracker_bytes)
def test_the_guard_reads_every_tracker_exactly_as_verl_does(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    needs("torch", install=TRAINER_EXTRA)
    checkpoint_manager = needs("verl.utils.checkpoint.checkpoint_manager", install=TRAINER_EXTRA)
    root = tmp_path_factory.mktemp("ck")
    for step in (0, 4, 40, -1):
        (root / f"global_step_{step}").mkdir()
    (root / TRACKER).write_bytes(data)
    try:
        verl_says = checkpoint_manager.find_latest_ckpt_path(str(root))
    except Exception:
        with pytest.raises(ResumeCheckError):
            tracked_step_dir(root)
        return
    ours = tracked_step_dir(root)
    assert (None if ours is None else str(ours[0])) == verl_says


@pytest.mark.parametrize(
    ("where", "error", "shown"),
    [("open_regular", PermissionError(13, "Permission denied"), "cannot be opened (Permission denied)"),
     ("read_bounded", OSError(5, "Input/output error"), "cannot be read (Input/output error)")],
)  # fmt: skip
def test_a_tracker_the_os_will_not_give_is_named_with_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str, error: OSError, shown: str
) -> None:
    """Root opens any file here: the OS's refusals are made, and their line says which and why."""
    from recipe import checkpoint_tracker

    (tmp_path / checkpoint_tracker.TRACKER_NAME).write_text("1")
    (tmp_path / "global_step_1").mkdir()

    def refuse(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr(checkpoint_tracker, where, refuse)
    with pytest.raises(ResumeCheckError) as caught:
        tracked_step_dir(tmp_path)
    assert str(caught.value) == f"{tmp_path / checkpoint_tracker.TRACKER_NAME} {shown}"
