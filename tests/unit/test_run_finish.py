"""A finished run stays finished (issue 39): the trainer's process ends with the run's own status, and `run` never trains
a finished run again.

recipe.trainer_main is run for real in a fresh interpreter, over a stand-in `verl.trainer.main_ppo` first on
sys.path, whose teardown crashes like the one upstream reports (an atexit handler that kills the process with
SIGSEGV, standing in for C++ destructors under Ray's threads): through the launcher the status is the run's,
through `python -m verl.trainer.main_ppo` it is 139. `run` itself by direct calls (as test_trainer_run_command.py)
and once end to end with a stand-in trainer that really dies of SIGSEGV.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from recipe.checkpoint_tracker import TRACKER_NAME
from recipe.export.evidence import collect_evidence
from recipe.export.watch import MANIFEST, REPORT_NAME
from recipe.plan import Plan
from recipe.run.finish import MAX_RUN_REPORT_BYTES, final_save, finished_report, report_mark
from recipe.run.trainer import run_command

from .envtools import HANG_GUARD_S, REPO
from .test_trainer_run_command import Trainer, _ours, _root, machine, plans  # noqa: F401  (fixtures)

FAKE_MAIN_PPO = textwrap.dedent(
    """
    import atexit, os, signal, sys
    sys.modules["ray._raylet"] = sys  # what `import ray` loads: the driver's native core
    # The teardown crash: after main returned, interpreter exit dies of SIGSEGV.
    atexit.register(lambda: os.kill(os.getpid(), signal.SIGSEGV))

    class TaskRunnerV1:  # verl's actor class, which recipe.trainer_main places on the head node
        pass

    def main():
        print("argv:", sys.argv[1:], flush=True)
        if "boom=1" in sys.argv[1:]:
            raise RuntimeError("the trainer failed")

    if __name__ == "__main__":
        main()
    """
)


@pytest.fixture(scope="module")
def fake_verl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fake-verl")
    (root / "verl" / "trainer").mkdir(parents=True)
    (root / "verl" / "__init__.py").write_text("")
    (root / "verl" / "trainer" / "__init__.py").write_text("")
    (root / "verl" / "trainer" / "main_ppo.py").write_text(FAKE_MAIN_PPO)
    return root


def _module(name: str, fake: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake), str(REPO)])}
    return subprocess.run([sys.executable, "-m", name, *args], env=env, capture_output=True, text=True,
                          timeout=HANG_GUARD_S, check=False)  # fmt: skip


def test_a_teardown_crash_after_verls_main_returned_is_exit_0_through_the_launcher(fake_verl: Path) -> None:
    direct = _module("verl.trainer.main_ppo", fake_verl, "a=1")
    assert direct.returncode == -signal.SIGSEGV, direct  # upstream's way: the finished run reads as a crash
    ours = _module("recipe.trainer_main", fake_verl, "a=1", "+b='x y'")
    assert ours.returncode == 0, ours.stderr
    assert ours.stdout == "argv: ['a=1', \"+b='x y'\"]\n"  # verl's main reads the same argv


def test_an_exception_in_verls_main_is_exit_1_with_its_traceback(fake_verl: Path) -> None:
    done = _module("recipe.trainer_main", fake_verl, "boom=1")
    assert done.returncode == 1
    assert "Traceback (most recent call last)" in done.stderr and "RuntimeError: the trainer failed" in done.stderr


# --- `run` on a finished run -----------------------------------------------------------------------------------


TOTAL = 2


def _planned(base: Plan, tmp_path: Path) -> Plan:
    """A one-device plan of TOTAL steps, its checkpoints under tmp_path."""
    plan = _ours(base, tmp_path)
    # The module's plan was built for other folders: its checkpoint root is this test's.
    overrides = [o for o in plan.overrides if not o.startswith("trainer.default_local_dir=")]
    return dataclasses.replace(plan, overrides=[*overrides, f"trainer.default_local_dir='{_root(tmp_path)}'",
                                                f"trainer.total_training_steps={TOTAL}"])  # fmt: skip


def _save(tmp_path: Path, step: int, status: str | None = "complete", manifest: bool = True) -> Path:
    """What verl and the export watcher leave after saving `step`: the step folder, its manifest, the report, the tracker."""
    step_dir = _root(tmp_path) / f"global_step_{step}"
    (step_dir / "actor" / "model" / "huggingface").mkdir(parents=True, exist_ok=True)
    if manifest:
        (step_dir / MANIFEST).write_text("{}")
    export = step_dir / "actor" / "model" / "huggingface"
    (export / "config.json").write_text("{}")
    if status is not None:  # where the watcher writes it, beside the export, with what it saw (recipe.export.evidence)
        evidence = collect_evidence(step, step_dir, export).model_dump()
        (step_dir / "actor" / "model" / REPORT_NAME).write_text(json.dumps({"status": status, "evidence": evidence}))
    (_root(tmp_path) / TRACKER_NAME).write_text(str(step))
    return step_dir


class SavesThenDies(Trainer):
    """A trainer that saves `step` and then dies of SIGSEGV (exit 139), or ends with `code`."""

    def __init__(self, tmp_path: Path, step: int, code: int = 128 + signal.SIGSEGV) -> None:
        super().__init__(code)
        self.tmp_path, self.step = tmp_path, step

    def __call__(self, argv: object, env: dict[str, str]) -> int:
        _save(self.tmp_path, self.step)
        return super().__call__(argv, env)


@pytest.mark.parametrize(("saved", "expected"), [(TOTAL, 0), (TOTAL - 1, 139)], ids=["after-final-save", "before-it"])
def test_a_trainer_killed_by_a_signal_after_its_final_save_finished_the_run(
    plans: dict[str, Plan], tmp_path: Path, machine: Trainer, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
    capsys: pytest.CaptureFixture[str], saved: int, expected: int,
) -> None:  # fmt: skip
    from recipe.run import trainer

    monkeypatch.setattr(trainer, "execute", SavesThenDies(tmp_path, saved))
    assert run_command(_planned(plans["full"], tmp_path), progress=False) == expected
    said = [line for line in capsys.readouterr().out.splitlines() if "died of signal" in line]
    assert said == ([f"run: the trainer's process died of signal 11 (exit 139) after the run's last save, step 2 of 2, "
                     f"saved under {_root(tmp_path)} (HF export complete): the run finished; exit 0"] if expected == 0 else [])
    # The run report says the run's own end: finished where the last save excuses the signal.
    assert json.loads((_root(tmp_path) / "run-report.json").read_text())["exit_code"] == expected


@pytest.mark.parametrize(("code", "expected"), [(128, 128), (129, 0)], ids=["exit-128", "sighup"])
def test_only_an_exit_past_128_is_a_signal_that_the_final_save_excuses(
    plans: dict[str, Plan], tmp_path: Path, machine: Trainer, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
    capsys: pytest.CaptureFixture[str], code: int, expected: int,
) -> None:  # fmt: skip
    """128 is an exit status of the trainer's own (signal 0 does not exist); 129 is SIGHUP's (128 + 1)."""
    from recipe.run import trainer

    monkeypatch.setattr(trainer, "execute", SavesThenDies(tmp_path, TOTAL, code))
    assert run_command(_planned(plans["full"], tmp_path), progress=False) == expected
    said = [line for line in capsys.readouterr().out.splitlines() if "died of signal" in line]
    assert said == ([] if expected else ["run: the trainer's process died of signal 1 (exit 129) after the run's last "
                                          f"save, step 2 of 2, saved under {_root(tmp_path)} (HF export complete): the "
                                          "run finished; exit 0"])  # fmt: skip


def test_a_second_run_after_a_finished_one_exits_0_and_starts_nothing(
    plans: dict[str, Plan], tmp_path: Path, machine: Trainer, capsys: pytest.CaptureFixture[str],  # noqa: F811
) -> None:  # fmt: skip
    _save(tmp_path, TOTAL)
    plan = _planned(plans["full"], tmp_path)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert run_command(plan, progress=False) == 0
    assert machine.calls == []
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # nothing written
    assert capsys.readouterr().out == (f"run: already finished at step 2 of 2, saved under {_root(tmp_path)} (HF export "
                                       "complete); nothing trained, nothing written. To train on, raise "
                                       "trainer.total_training_steps; for a new run, another EXPERIMENT_NAME\n")  # fmt: skip


@pytest.mark.parametrize(
    ("step", "status", "manifest", "overrides"),
    [
        (TOTAL - 1, "complete", True, []),  # not the last step
        (TOTAL, "broken", True, []),  # the last save's export is broken: the resume guard says so
        (TOTAL, "complete", False, []),  # verl never finished that save
        (TOTAL, "complete", True, ["trainer.resume_mode=disable"]),  # the user asked to train afresh
        (TOTAL, "complete", True, ["trainer.total_training_steps=3"]),  # more steps asked for: train on
    ],
    ids=["earlier-step", "broken-export", "no-manifest", "resume-disabled", "more-steps"],
)
def test_what_is_not_a_finished_run(plans: dict[str, Plan], tmp_path: Path, step: int, status: str,  # noqa: F811
                                    manifest: bool, overrides: list[str]) -> None:
    _save(tmp_path, step, status, manifest)
    plan = _planned(plans["full"], tmp_path)
    assert final_save(plan) is not None or (step, status, manifest) != (TOTAL, "complete", True)  # the control
    assert final_save(dataclasses.replace(plan, overrides=[*plan.overrides, *overrides])) is None


@pytest.mark.parametrize("report", [b"", b"[" * 100_000, b"\xff", b'{"status": 3}', None])
def test_an_unreadable_report_never_makes_a_run_finished(plans: dict[str, Plan], tmp_path: Path,  # noqa: F811
                                                         report: bytes | None) -> None:
    path = _save(tmp_path, TOTAL, status=None) / "actor" / "model" / REPORT_NAME
    if report is None:
        os.mkfifo(path)  # a FIFO: never opened in a blocking way
    else:
        path.write_bytes(report)
    # Unreadable: the export is checked now, and a folder with only an empty config.json is no sound export.
    assert final_save(_planned(plans["full"], tmp_path)) is None
    path.unlink()
    _save(tmp_path, TOTAL)
    assert final_save(_planned(plans["full"], tmp_path)) is not None  # the control: the watcher's report finishes it


@pytest.fixture(scope="module")
def sound_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen3.5-MoE written by transformers' save_pretrained: an export the watcher finds complete."""
    from .export.conftest import tiny_qwen35_moe

    directory = tmp_path_factory.mktemp("sound") / "hf"
    tiny_qwen35_moe().save_pretrained(directory)
    return directory


def test_run_end_to_end_a_stand_in_that_really_segfaults_after_its_final_save(tmp_path: Path, model: Path,
                                                                               sound_export: Path) -> None:
    """The real CLI in a process; the stand-in trainer saves step 2 of 2, then kills itself with SIGSEGV."""
    from .runtools import cli, layout_of_one, run_environment

    stand_in = tmp_path / "segfaults.py"
    stand_in.write_text(textwrap.dedent(
        """
        import os, shutil, signal, sys
        value = [a for a in sys.argv[1:] if a.startswith("trainer.default_local_dir=")][-1].split("=", 1)[1].strip("'")
        step = os.path.join(value, "global_step_2")
        # A sound export (a real model's files): the export watcher of `run` checks it at its last sweep.
        shutil.copytree(os.environ["STAND_IN_EXPORT"], os.path.join(step, "actor", "model", "huggingface"))
        open(os.path.join(step, "actor", "ckpt_contents.json"), "w").write("{}")
        open(os.path.join(value, "latest_checkpointed_iteration.txt"), "w").write("2")
        os.kill(os.getpid(), signal.SIGSEGV)
        """
    ))
    env = run_environment(tmp_path, model, **layout_of_one(OVERRIDES="trainer.total_training_steps=2"))
    env["RECIPE_TEST_TRAINER"] = f"{sys.executable} {stand_in}"
    env["STAND_IN_EXPORT"] = str(sound_export)
    first = cli(["run"], env)
    assert first.returncode == 0, first.stderr
    assert "died of signal 11 (exit 139) after the run's last save, step 2 of 2" in first.stdout
    second = cli(["run"], env)
    assert second.returncode == 0, second.stderr
    assert "run: already finished at step 2 of 2" in second.stdout and "Executing:" not in second.stdout


@pytest.mark.parametrize("mode", ["auto", "disable", "resume_path"])
@pytest.mark.parametrize(
    ("saved", "total", "estimated"),
    [
        (TOTAL, TOTAL, False),  # the last step saved
        (TOTAL - 1, TOTAL, False),  # one to go
        (TOTAL + 1, TOTAL, False),  # the total lowered after the save
        (TOTAL, TOTAL, True),  # the row estimate, an upper bound of verl's count: reached
        (TOTAL - 1, TOTAL, True),
        (TOTAL + 1, TOTAL, True),
    ],
)
def test_plan_and_the_finish_check_agree_for_every_resume_mode_and_total(
    plans: dict[str, Plan], tmp_path: Path, mode: str, saved: int, total: int, estimated: bool  # noqa: F811
) -> None:
    """Issue 52: `plan` says "the run already finished" exactly where `run` would train nothing (resume_mode=auto
    and the saved step at or past the total, configured or estimated); a step the user chose (resume_path) is
    reported as finished by plan and trained by run (verl then has no step left); disable never finishes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from recipe import plan as plan_module

    step_dir = _save(tmp_path, saved)
    plan = _planned(plans["full"], tmp_path)
    overrides = [o for o in plan.overrides if not o.startswith("trainer.total_training_steps=")]
    if estimated:  # no total configured: rows // TRAIN_BATCH_SIZE x TOTAL_EPOCHS of the training file
        train = tmp_path / "train.parquet"
        plan = dataclasses.replace(plan, settings=plan.settings.model_copy(update={"total_epochs": 1}))
        pq.write_table(pa.table({"prompt": ["p"] * (total * plan.settings.train_batch_size + 1)}), train)
        overrides = [o for o in overrides if not o.startswith("data.train_files=")] + [f"data.train_files='{train}'"]
    else:
        overrides.append(f"trainer.total_training_steps={total}")
    if mode == "resume_path":
        overrides += ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={step_dir}"]
    elif mode == "disable":
        overrides.append("trainer.resume_mode=disable")
    plan = dataclasses.replace(plan, overrides=overrides)
    said = plan_module._resume(plan.settings, plan.overrides, [])
    assert said["planned_steps_estimated"] in (estimated, None), said
    assert said["finished"] is (mode != "disable" and saved >= total), said
    assert (final_save(plan) is not None) is (mode == "auto" and saved >= total)


# --- a worker's question once its head is gone: did the run finish? -----------------------------------------------

FINISHED = {"outcome": "finished", "exit_code": 0, "steps_reported": 2}


def _write_report(path: Path, document: object) -> None:
    path.write_text(json.dumps(document))


def test_a_report_written_while_the_worker_was_joined_saying_exit_0_is_a_finished_run(tmp_path: Path) -> None:
    report = tmp_path / "run-report.json"
    mark = report_mark(report)
    assert mark is None and finished_report(report, mark) is None  # nothing written: the head was lost
    _write_report(report, FINISHED)
    assert finished_report(report, mark) == "the head's run report (run-report.json) says it finished with exit 0"


def test_the_report_seen_at_the_join_is_an_earlier_runs(tmp_path: Path) -> None:
    """A finished run's report left from before, untouched since the worker joined: this run did not finish."""
    report = tmp_path / "run-report.json"
    _write_report(report, FINISHED)
    mark = report_mark(report)
    assert finished_report(report, mark) is None
    _write_report(report, {**FINISHED, "steps_reported": 30})  # the head's new report, another size
    assert finished_report(report, mark) is not None


@given(st.one_of(
    st.fixed_dictionaries({"outcome": st.sampled_from(["failed (exit 1)", "stopped (SIGTERM)", "Finished", ""]),
                           "exit_code": st.just(0)}),
    st.fixed_dictionaries({"outcome": st.just("finished"),
                           "exit_code": st.one_of(st.just(True), st.just(False), st.just(0.0), st.just("0"),
                                                  st.none(), st.integers().filter(bool))}),
    st.just({"outcome": "finished"}), st.just({"exit_code": 0}),
    st.lists(st.integers(), max_size=3), st.text(max_size=20), st.integers(),
))
@example({"outcome": "finished", "exit_code": False})  # 0 == False in Python: a bool is no exit status
@example({"outcome": "finished", "exit_code": 1})
def test_anything_but_finished_with_exit_0_is_no_finished_run(tmp_path_factory: pytest.TempPathFactory,
                                                              document: object) -> None:
    report = tmp_path_factory.mktemp("report") / "run-report.json"
    _write_report(report, document)
    assert finished_report(report, None) is None


@pytest.mark.parametrize("plant", ["directory", "fifo", "dangling link", "not json", "too large", "nan"])
def test_a_report_that_is_no_report_is_no_finished_run(tmp_path: Path, plant: str) -> None:
    report = tmp_path / "run-report.json"
    if plant == "directory":
        report.mkdir()
    elif plant == "fifo":
        os.mkfifo(report)  # never blocks the read
    elif plant == "dangling link":
        report.symlink_to(tmp_path / "absent")
    elif plant == "not json":
        report.write_text('{"outcome": "finished", "exit_code": 0')
    elif plant == "nan":
        report.write_text('{"outcome": "finished", "exit_code": NaN}')
    else:
        report.write_text(json.dumps(FINISHED) + " " * MAX_RUN_REPORT_BYTES)
    assert finished_report(report, None) is None


def test_a_report_at_its_size_bound_is_read(tmp_path: Path) -> None:
    report = tmp_path / "run-report.json"
    text = json.dumps(FINISHED)
    report.write_text(text + " " * (MAX_RUN_REPORT_BYTES - len(text)))
    assert report.stat().st_size == MAX_RUN_REPORT_BYTES
    assert finished_report(report, None) is not None


def test_a_last_save_without_an_hf_export_is_no_finished_run(plans: dict[str, Plan], tmp_path: Path) -> None:  # noqa: F811
    """verl saved the last step, but no HF export lies under it: nothing tells the weights are sound."""
    import shutil

    step_dir = _save(tmp_path, TOTAL)
    plan = _planned(plans["full"], tmp_path)
    assert final_save(plan) is not None  # the control
    shutil.rmtree(step_dir / "actor" / "model" / "huggingface")
    assert final_save(plan) is None


@pytest.mark.parametrize("reference", ["the same model", "one more tensor"])
def test_without_the_watchers_report_the_export_is_checked_now_against_model_path_and_nothing_written(
    plans: dict[str, Plan], tmp_path: Path, sound_export: Path, reference: str  # noqa: F811
) -> None:
    """No report from the watcher (it never swept that save): the export is checked now, against the plan's
    MODEL_PATH (the model the run started from), and no report is written. A tensor of MODEL_PATH the export lost
    makes it broken: no finished run."""
    import shutil

    import torch

    from .export.conftest import rewrite

    step_dir = _save(tmp_path, TOTAL, status=None)
    export = step_dir / "actor" / "model" / "huggingface"
    shutil.rmtree(export)
    shutil.copytree(sound_export, export)
    model = shutil.copytree(sound_export, tmp_path / "model-path")
    if reference == "one more tensor":
        rewrite(model, lambda tensors: tensors.update({"model.language_model.lost.weight": torch.zeros(2)}))
    plan = _planned(plans["full"], tmp_path)
    plan = dataclasses.replace(plan, settings=plan.settings.model_copy(update={"model_path": model}))
    done = final_save(plan)
    if reference == "the same model":
        assert done is not None and done.export_status == "complete" and done.step == TOTAL
    else:
        assert done is None
    assert not (step_dir / "actor" / "model" / REPORT_NAME).exists()  # `run`'s check writes nothing
