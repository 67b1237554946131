"""`run` itself by direct calls (recipe.run.trainer.run_command): the checks before anything starts, the run record
written first and copied into each new save, the Ray role that decides how the trainer starts, the smoke verdict.

README (`run`), docs/reproducibility.md: exit 2 before anything starts when the machine is unfit or resuming is unsafe;
`run` writes the run record to <checkpoint root>/run-record.json and copies it into each global_step_N it saves
(as soon as that save's HF export is checked, and at the end into saves without one); with PROFILE=smoke it prints
the verdict, writes it beside the checkpoints and exits 4 when it fails. The machine here lacks an accelerator and
vLLM: the device count and the package lookup are set as runtools does, and the trainer's process is replaced by
a recording function (test_trainer_supervision.py tests the real one). test_run_command.py runs it all in a process.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from recipe.device import DeviceDetection
from recipe.errors import RecipeConfigError
from recipe.launch import override_value
from recipe.plan import Plan, build_plan
from recipe.record_file import RECORD_NAME
from recipe.run import preflight, trainer
from recipe.run.trainer import EXIT_SMOKE_FAILED, _export_watcher, run_command
from recipe.smoke.verdict import Check, Verdict
from tests.unit.envtools import HANG_GUARD_S, settings_of
from tests.unit.runtools import PipedStdout

ONE_DEVICE = {"DEVICE": "gpu", "NDEVICES_PER_NODE": "1", "TP": "1", "PP": "1", "CP": "1", "EP": "1", "ETP": "1",
              "GEN_TP": "1", "PROJECT_NAME": "p", "EXPERIMENT_NAME": "e"}  # fmt: skip


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Plan]:
    """A sound one-device gpu plan and a smoke plan, built once; tests give them their own folders."""
    from recipe.smoke import shipped_model_dir

    folder = tmp_path_factory.mktemp("plans")
    (folder / "model").mkdir()
    (folder / "model" / "config.json").write_bytes((shipped_model_dir() / "config.json").read_bytes())
    full = settings_of(**ONE_DEVICE, MODEL_PATH=str(folder / "model"), CHECKPOINT_DIR=str(folder / "ck"))
    smoke = settings_of(PROFILE="smoke", DEVICE="gpu", CHECKPOINT_DIR=str(folder / "smoke-ck"))
    return {"full": build_plan(full, environ={}), "smoke": build_plan(smoke, environ={})}


class Trainer:
    """Stands in for the trainer's process: records each start, answers with `code`."""

    def __init__(self, code: int = 0) -> None:
        self.code = code
        self.calls: list[tuple[list[str], dict[str, str]]] = []

    def __call__(self, argv: Any, env: dict[str, str]) -> int:
        self.calls.append((list(argv), dict(env)))
        return self.code


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch) -> Trainer:
    """A fit machine (packages, RAM, no chip mismatch) whose trainer process is recorded, not started."""
    monkeypatch.setattr(preflight, "_importable", lambda module: True)
    monkeypatch.setattr(preflight, "node_memory_bytes", lambda: None)
    monkeypatch.delenv(trainer.TEST_TRAINER_VARIABLE, raising=False)
    started = Trainer()
    monkeypatch.setattr(trainer, "execute", started)
    # The resume guard has its own tests (test_resume_guard.py); here nothing is there to resume.
    monkeypatch.setattr(trainer, "resume_problem", lambda plan: None)
    return started


def _ours(base: Plan, tmp_path: Path, *, devices: int = 1, device: str = "gpu", **settings: str) -> Plan:
    """`base` with this test's folders (model, data, checkpoints under tmp_path) and devices."""
    values: dict[str, str] = {**ONE_DEVICE, "DEVICE": device, "CHECKPOINT_DIR": str(tmp_path / "ck")}
    if settings.get("PROFILE") != "smoke":
        (tmp_path / "model").mkdir(parents=True, exist_ok=True)
        (tmp_path / "model" / "config.json").write_text("{}")
        for name in ("train.parquet", "test.parquet"):
            (tmp_path / name).touch()
        values |= {"MODEL_PATH": str(tmp_path / "model"), "TRAIN_FILES": str(tmp_path / "train.parquet"),
                   "VAL_FILES": str(tmp_path / "test.parquet")}  # fmt: skip
    values |= settings
    detection = DeviceDetection(name=device, source="setting", reason=f"DEVICE={device} was set", visible_devices=devices)  # type: ignore[arg-type]
    return dataclasses.replace(base, settings=settings_of(**values), device=detection)


def _root(tmp_path: Path) -> Path:
    return tmp_path / "ck" / "p" / "e"


# --- before anything starts --------------------------------------------------------------------


def test_an_unfit_machine_is_refused_before_anything_is_made(plans: dict[str, Plan], tmp_path: Path, machine: Trainer) -> None:
    plan = _ours(plans["full"], tmp_path, devices=0)
    (tmp_path / "train.parquet").unlink()
    with pytest.raises(RecipeConfigError) as caught:
        run_command(plan)
    assert [line.split("=")[0] for line in caught.value.problems] == ["DEVICE", "TRAIN_FILES"]
    assert machine.calls == [] and not (tmp_path / "ck").exists()


def test_an_unsafe_resume_is_refused_once_the_machine_is_fit(
    plans: dict[str, Plan], tmp_path: Path, machine: Trainer, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[Plan] = []
    monkeypatch.setattr(trainer, "resume_problem", lambda plan: asked.append(plan) or "CHECKPOINT_DIR='x': broken export")
    plan = _ours(plans["full"], tmp_path)
    with pytest.raises(RecipeConfigError) as caught:
        run_command(plan)
    assert caught.value.problems == ["CHECKPOINT_DIR='x': broken export"]
    assert asked == [plan] and machine.calls == [] and not (tmp_path / "ck").exists()


def test_the_resume_guard_waits_for_a_fit_machine(
    plans: dict[str, Plan], tmp_path: Path, machine: Trainer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It imports torch and transformers: an unfit machine is told so first, alone."""
    monkeypatch.setattr(trainer, "resume_problem", lambda plan: pytest.fail("the resume guard ran on an unfit machine"))
    with pytest.raises(RecipeConfigError) as caught:
        run_command(_ours(plans["full"], tmp_path, devices=0))
    assert [line.split(":")[0] for line in caught.value.problems] == ["DEVICE=gpu"]


def test_a_worker_node_runs_no_resume_guard(plans: dict[str, Plan], tmp_path: Path, machine: Trainer,
                                             monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The trainer, and the checkpoint it resumes, are the head's."""
    monkeypatch.setattr(trainer, "resume_problem", lambda plan: pytest.fail("a worker ran the resume guard"))
    joined: list[dict[str, Any]] = []
    monkeypatch.setattr(trainer.supervisors, "run_worker", lambda role, **kw: joined.append({"role": role, **kw}) or 0)
    plan = _ours(plans["full"], tmp_path, NNODES="2", NODE_RANK="1", MASTER_ADDR="10.0.0.1", RAY_WAIT_TIMEOUT="77",
                 RAY_START_ARGS="--node-ip-address 10.0.0.2 --dashboard-agent-listen-port=52366")
    assert run_command(plan) == 0
    [call] = joined
    assert call["role"].kind == "worker" and call["role"].address == "10.0.0.1:6379"
    assert call["options"].node_ip_address == "10.0.0.2"  # RAY_START_ARGS: this node's `ray start` flags
    assert call["options"].extra_args == ("--dashboard-agent-listen-port=52366",)
    assert (call["join_timeout_s"], call["rejoin_grace_s"]) == (77, 77)
    assert call["env"]["RECIPE_CHECKPOINT_ROOT"] == str(_root(tmp_path))
    assert machine.calls == [] and not (_root(tmp_path) / RECORD_NAME).exists()  # a worker writes no record


def test_the_smoke_profile_never_runs_the_resume_guard(plans: dict[str, Plan], tmp_path: Path, machine: Trainer,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """It never resumes (resume_mode=disable), so an old smoke export cannot block it."""
    monkeypatch.setattr(trainer, "resume_problem", lambda plan: pytest.fail("the smoke profile ran the resume guard"))
    monkeypatch.setattr(trainer, "_prepare_smoke", lambda root: None)
    machine.code = 1
    assert run_command(_ours(plans["smoke"], tmp_path, PROFILE="smoke")) == 1


def test_an_npu_node_whose_chip_vllm_ascend_was_not_built_for_is_refused(
    plans: dict[str, Plan], tmp_path: Path, machine: Trainer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trainer, "chip_problem", lambda: "ASCEND_CHIP: vllm-ascend was built for another chip")
    with pytest.raises(RecipeConfigError) as caught:
        run_command(_ours(plans["full"], tmp_path, device="npu"))
    assert caught.value.problems == ["ASCEND_CHIP: vllm-ascend was built for another chip"]
    assert machine.calls == []


def test_the_chip_is_asked_only_on_a_fit_npu_node(
    plans: dict[str, Plan], tmp_path: Path, machine: Trainer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trainer, "chip_problem", lambda: pytest.fail("the chip was asked"))
    monkeypatch.setattr(trainer, "resume_problem", lambda plan: None)
    assert run_command(_ours(plans["full"], tmp_path)) == 0  # gpu: no chip to ask
    with pytest.raises(RecipeConfigError):
        run_command(_ours(plans["full"], tmp_path / "npu", device="npu", devices=0))  # unfit: said first, alone


def test_a_checkpoint_dir_that_cannot_be_created_is_refused_naming_why(
    plans: dict[str, Plan], tmp_path: Path, machine: Trainer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the checks and the start (another process, a full disk): exit 2, nothing started."""
    monkeypatch.setattr(trainer, "run_problems", lambda plan: [])
    (tmp_path / "ck").write_text("a file where the folder goes")
    with pytest.raises(RecipeConfigError) as caught:
        run_command(_ours(plans["full"], tmp_path))
    assert caught.value.problems == [f"CHECKPOINT_DIR={str(tmp_path / 'ck')!r}: cannot be created (File exists)"]
    assert machine.calls == []
    # An error without the OS's text (a file system driver's own): named by its kind.
    (tmp_path / "ck").unlink()

    mkdir = Path.mkdir

    def refused(self: Path, *args: Any, **kwargs: Any) -> None:
        if self == tmp_path / "ck":
            raise OSError()
        mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", refused)
    with pytest.raises(RecipeConfigError) as caught:
        run_command(_ours(plans["full"], tmp_path))
    assert caught.value.problems == [f"CHECKPOINT_DIR={str(tmp_path / 'ck')!r}: cannot be created (OSError)"]


# --- a single node: the trainer started, its code ours ---------------------------------------------


@pytest.mark.parametrize("code", [0, 1, 143])
def test_a_single_node_runs_the_plans_command_and_returns_its_code(
    plans: dict[str, Plan], tmp_path: Path, machine: Trainer, capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture, code: int,
) -> None:  # fmt: skip
    machine.code = code
    plan = _ours(plans["full"], tmp_path)
    with caplog.at_level(logging.INFO, logger="recipe"):
        assert run_command(plan, progress=False) == code
    assert "Ray: NNODES=1: the trainer starts its own local Ray" in caplog.messages
    [(argv, env)] = machine.calls
    assert argv == plan.argv
    assert f"Executing: {' '.join(plan.argv[:3])}" in capsys.readouterr().out
    for name, value in plan.env.items():
        assert env.get(name) == value, name
    # Every node's checkpoint root, for the head's shared-storage check (Ray workers inherit it).
    assert env["RECIPE_CHECKPOINT_ROOT"] == str(_root(tmp_path))
    assert (tmp_path / "ck").is_dir()


def test_a_checkpoint_dir_several_folders_deep_is_made(plans: dict[str, Plan], tmp_path: Path, machine: Trainer) -> None:
    plan = _ours(plans["full"], tmp_path, CHECKPOINT_DIR=str(tmp_path / "a" / "b" / "ck"))
    assert run_command(plan, progress=False) == 0
    assert (tmp_path / "a" / "b" / "ck" / "p" / "e" / RECORD_NAME).is_file()


def test_the_run_record_is_written_before_the_trainer_starts(plans: dict[str, Plan], tmp_path: Path, machine: Trainer,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    seen: list[dict[str, Any]] = []

    def trainer_reading_the_record(argv: Any, env: dict[str, str]) -> int:
        seen.append(json.loads((_root(tmp_path) / RECORD_NAME).read_text()))
        return 0

    monkeypatch.setattr(trainer, "execute", trainer_reading_the_record)
    plan = _ours(plans["full"], tmp_path)
    assert run_command(plan, progress=False) == 0
    [record] = seen
    assert record["provenance"] == plan.provenance and set(record) == {"provenance", "started_at"}


# --- the run record in each new save ----------------------------------------------------------------


def test_each_step_saved_during_the_run_gets_the_record_and_older_steps_keep_theirs(
    plans: dict[str, Plan], tmp_path: Path, machine: Trainer, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _root(tmp_path)
    (root / "global_step_1").mkdir(parents=True)  # from an earlier run: it says what made it, or nothing
    (root / "global_step_2").mkdir()
    (root / "global_step_2" / RECORD_NAME).write_text("the earlier run's record\n")

    def saving_trainer(argv: Any, env: dict[str, str]) -> int:
        (root / "global_step_3" / "actor").mkdir(parents=True)  # a save without an HF export
        return 0

    monkeypatch.setattr(trainer, "execute", saving_trainer)
    assert run_command(_ours(plans["full"], tmp_path), progress=False) == 0
    assert (root / "global_step_3" / RECORD_NAME).read_bytes() == (root / RECORD_NAME).read_bytes()
    assert not (root / "global_step_1" / RECORD_NAME).exists()
    assert (root / "global_step_2" / RECORD_NAME).read_text() == "the earlier run's record\n"


class Watcher:
    """Stands in for the export watcher (recipe.export.watch): reports one checked export of step 2 when asked."""

    def __init__(self) -> None:
        self.report = threading.Event()
        self.reported = threading.Event()
        self.calls: list[dict[str, Any]] = []

    def __call__(self, root: Path, stop: threading.Event, **kwargs: Any) -> None:
        thread = threading.current_thread()
        self.calls.append({"root": root, "thread": (thread.name, thread.daemon), **kwargs})
        while not stop.wait(0.005):
            if self.report.is_set() and not self.reported.is_set():
                try:
                    kwargs["on_report"](object(), None)
                finally:
                    self.reported.set()  # the test goes on to see what it did, even if it raised
        self.calls[-1]["stopped"] = True


def test_a_step_gets_the_record_as_soon_as_its_hf_export_is_checked(
    plans: dict[str, Plan], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not only at the end: a run killed later still leaves each checked save saying what made it."""
    watcher = Watcher()
    monkeypatch.setattr(trainer, "watch_exports", watcher)
    plan = _ours(plans["full"], tmp_path)
    root = _root(tmp_path)
    with _export_watcher(plan):
        (root / "global_step_2" / "actor" / "model" / "huggingface").mkdir(parents=True)
        watcher.report.set()
        assert watcher.reported.wait(HANG_GUARD_S)
        assert (root / "global_step_2" / RECORD_NAME).read_bytes() == (root / RECORD_NAME).read_bytes()
    [call] = watcher.calls
    assert call["root"] == root and call["reference"] == plan.settings.model_path
    assert call["stopped"] is True  # the watcher is told to make its last sweep, and waited for
    assert call["thread"] == ("hf-export-check", True)  # named in thread dumps; never keeps the process alive


def test_the_record_written_is_the_plans_provenance(plans: dict[str, Plan], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trainer, "watch_exports", Watcher())
    plan = _ours(plans["full"], tmp_path)
    with _export_watcher(plan):
        stored = json.loads((_root(tmp_path) / RECORD_NAME).read_text())
    assert stored["provenance"] == plan.provenance


def test_a_record_that_cannot_be_written_stops_the_run_before_it_starts(
    plans: dict[str, Plan], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    watcher = Watcher()
    monkeypatch.setattr(trainer, "watch_exports", watcher)
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "p").write_text("a file where the project folder goes")
    with pytest.raises(RecipeConfigError) as caught, _export_watcher(_ours(plans["full"], tmp_path)):
        pytest.fail("the run went on without its record")
    assert caught.value.problems == [
        (
            f"CHECKPOINT_DIR={str(tmp_path / 'ck')!r}: cannot write the run record into {_root(tmp_path)} "
            "(Not a directory); nothing was started"
        )
    ]
    assert watcher.calls == []


# --- several nodes: how the trainer starts --------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "start", "device", "resource"),
    [
        ({"NNODES": "2", "NODE_RANK": "0", "MASTER_ADDR": "10.0.0.1"}, "run_head", "gpu", "GPU"),
        ({"NNODES": "2", "NODE_RANK": "0", "MASTER_ADDR": "10.0.0.1"}, "run_head", "npu", "NPU"),
        ({"RAY_ADDRESS": "ray-head:6379"}, "run_joined", "gpu", "GPU"),
    ],
)
def test_a_head_or_a_joined_node_starts_the_trainer_through_ray(
    plans: dict[str, Plan], tmp_path: Path, machine: Trainer, monkeypatch: pytest.MonkeyPatch,
    settings: dict[str, str], start: str, device: str, resource: str,
) -> None:  # fmt: skip
    monkeypatch.setattr(trainer, "chip_problem", lambda: None)
    monkeypatch.setattr(trainer, "resume_problem", lambda plan: None)
    calls: list[dict[str, Any]] = []

    def supervised(role: Any, argv: Any, **kwargs: Any) -> int:
        calls.append({"role": role, "argv": argv, **kwargs})
        return kwargs["run_trainer"](argv, kwargs["env"])  # the head runs the trainer once the cluster is up

    other = {"run_head": "run_joined", "run_joined": "run_head"}[start]
    monkeypatch.setattr(trainer.supervisors, start, supervised)
    monkeypatch.setattr(trainer.supervisors, other, lambda *a, **k: pytest.fail(f"{other} was called"))
    machine.code = 9
    plan = _ours(plans["full"], tmp_path, device=device, RAY_WAIT_TIMEOUT="55",
                 RAY_START_ARGS="--node-ip-address=10.0.0.9 --object-store-memory=1000000000", **settings)
    assert run_command(plan, progress=False) == 9
    [call] = calls
    if start == "run_head":  # this node's `ray start` flags, and its address for the recipe's own Ray clients
        assert call["options"].node_ip_address == "10.0.0.9"
        assert call["options"].extra_args == ("--object-store-memory=1000000000",)
    else:  # KubeRay started the node: only the address, for the clients
        assert call["node_ip_address"] == "10.0.0.9" and "options" not in call
    assert call["role"].kind == {"run_head": "head", "run_joined": "join-existing"}[start]
    assert call["argv"] == plan.argv and call["resource_name"] == resource
    assert (call["devices_per_node"], call["timeout_s"]) == (plan.layout.ndevices_per_node, 55)
    assert call["checkpoint_dir"] == str(tmp_path / "ck")
    assert call["env"]["RECIPE_CHECKPOINT_ROOT"] == str(_root(tmp_path))
    assert [argv for argv, _ in machine.calls] == [plan.argv]
    assert (_root(tmp_path) / RECORD_NAME).is_file()


# --- progress lines ---------------------------------------------------------------------------------


def test_progress_lines_are_printed_when_asked(plans: dict[str, Plan], tmp_path: Path, machine: Trainer,
                                               monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    started: list[tuple[Path, Any]] = []
    bounds: list[Any] = []

    class Printing:
        def __init__(self, directory: Path, total: Any, emit: Callable[[str], None] | None, limits: Any) -> None:
            # The steps are read on every run (the signs of a failing run are always said); the lines only when asked.
            bounds.append(limits)
            if emit is not None:
                started.append((directory, total))
                emit("progress: step 1/?")  # each line goes straight to stdout

        def __enter__(self) -> None:
            return None

        def __exit__(self, *exc: object) -> None:
            return None

    monkeypatch.setattr(trainer, "printing_progress", Printing)
    plan = _ours(plans["full"], tmp_path, HEALTH_THRESHOLDS="mismatch_kl=0.005")
    assert run_command(plan, progress=False) == 0
    assert started == []
    # The signs are judged with HEALTH_THRESHOLDS, lines or not.
    assert [limits.mismatch_kl for limits in bounds] == [0.005] and bounds[0] == plan.settings.thresholds
    auto = dataclasses.replace(plan, settings=plan.settings.model_copy(update={"progress": "auto"}))
    assert run_command(auto, progress=None) == 0  # pytest's stdout is no terminal
    assert started == []
    assert "progress:" not in capsys.readouterr().out
    assert run_command(plan, progress=True) == 0
    [(directory, total)] = started
    assert directory == Path(str(plan.env["TENSORBOARD_DIR"]))
    assert total is None  # no trainer.total_training_steps and an empty parquet file: no total to show
    assert "progress: step 1/?\n" in capsys.readouterr().out


def test_each_progress_line_is_seen_as_it_is_printed(plans: dict[str, Plan], tmp_path: Path, machine: Trainer,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Through `docker logs` (a pipe), a buffered progress line would only show at the end of the run."""
    piped = PipedStdout()
    monkeypatch.setattr("sys.stdout", piped)
    emitted: list[str] = []

    def printing(directory: Path, total: Any, emit: Callable[[str], None], limits: Any) -> _Null:
        emit("progress: step 1/3")
        emitted.append(piped.unflushed)
        return _Null()

    monkeypatch.setattr(trainer, "printing_progress", printing)
    assert run_command(_ours(plans["full"], tmp_path), progress=True) == 0
    assert emitted == [""] and "progress: step 1/3\n" in piped.getvalue()


def test_progress_counts_the_steps_of_the_epochs_over_the_data(plans: dict[str, Plan], tmp_path: Path,
                                                                machine: Trainer, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """No trainer.total_training_steps: rows // TRAIN_BATCH_SIZE * TOTAL_EPOCHS, as verl counts them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from recipe.run_length import StepTotal

    totals: list[Any] = []
    monkeypatch.setattr(trainer, "printing_progress", lambda d, total, emit, limits: totals.append(total) or _Null())
    plan = _ours(plans["full"], tmp_path, TRAIN_BATCH_SIZE="4", TOTAL_EPOCHS="3")
    # The file the trainer reads: data.train_files as the overrides give it (the base plan's names its own folder).
    plan = dataclasses.replace(plan, overrides=[*plan.overrides, f"data.train_files={tmp_path / 'train.parquet'}"])
    pq.write_table(pa.table({"prompt": [str(i) for i in range(21)]}), tmp_path / "train.parquet")
    assert run_command(plan, progress=True) == 0
    assert totals == [StepTotal(15, True)]  # 21 rows: 5 full batches an epoch (verl drops the last), 3 epochs


def test_progress_counts_the_steps_of_the_configured_total(plans: dict[str, Plan], tmp_path: Path,
                                                            machine: Trainer, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    from recipe.run_length import StepTotal

    totals: list[Any] = []
    monkeypatch.setattr(trainer, "printing_progress", lambda d, total, emit, limits: totals.append(total) or _Null())
    plan = _ours(plans["full"], tmp_path)
    plan = dataclasses.replace(plan, overrides=[*plan.overrides, "trainer.total_training_steps=12"])
    monkeypatch.setattr(trainer.sys.stdout, "isatty", lambda: True)  # a terminal: on without asking
    assert run_command(plan) == 0
    assert totals == [StepTotal(12, False)]


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


# --- PROFILE=smoke: its assets, then its verdict ------------------------------------------------


class Judge:
    """Stands in for the smoke verdict (recipe.smoke.verdict.smoke_verdict): records its inputs, answers `result`."""

    def __init__(self) -> None:
        self.asked: list[tuple[Any, ...]] = []
        self.result = Verdict((Check("steps", True, "3 of 3", "every step 1..3"),))

    def __call__(self, *args: Any) -> Verdict:
        self.asked.append(args)
        return self.result


@pytest.fixture
def verdicts(monkeypatch: pytest.MonkeyPatch) -> Judge:
    import recipe.smoke.verdict

    judge = Judge()
    monkeypatch.setattr(recipe.smoke.verdict, "smoke_verdict", judge)
    # The training prompts' lengths: counted from the plan's training file with the trainer's model.
    monkeypatch.setattr(recipe.smoke.verdict, "count_training_prompts", lambda data, model: ("counted", data, model))
    return judge


def _smoke(plans: dict[str, Plan], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Plan, list[Path]]:
    built: list[Path] = []
    monkeypatch.setattr(trainer, "_prepare_smoke", built.append)
    return _ours(plans["smoke"], tmp_path, PROFILE="smoke"), built


def test_a_smoke_run_builds_its_assets_then_prints_and_writes_its_verdict(
    plans: dict[str, Plan], tmp_path: Path, machine: Trainer, monkeypatch: pytest.MonkeyPatch,
    verdicts: Judge, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    plan, built = _smoke(plans, tmp_path, monkeypatch)
    assert run_command(plan, progress=False) == 0
    assert built == [tmp_path / "ck" / "smoke-assets"]
    [args] = verdicts.asked
    root = tmp_path / "ck" / plan.settings.project_name / plan.settings.experiment_name
    # The metrics verl's file logger wrote, the profile's 3 steps, the saves, the model the trainer was told to load.
    trained = Path(override_value(plan.overrides, "actor_rollout_ref.model.path") or "")
    assert trained.name == "model" and trained.parent.name == "smoke-assets"
    data = Path(override_value(plan.overrides, "data.train_files") or "")
    assert data.name == "train.parquet" and data.parent.parent.name == "smoke-assets"
    # Judged from step 1: the run started fresh.
    assert args == (Path(str(plan.env["VERL_FILE_LOGGER_PATH"])), 3, root, trained, ("counted", data, trained), 1)
    out = capsys.readouterr().out
    assert out.endswith("smoke verdict:\n  PASS  steps  3 of 3  (limit: every step 1..3)\nsmoke: PASS\n")
    written = json.loads((root / "smoke-verdict.json").read_text())
    assert written == {"passed": True, "checks": [{"name": "steps", "passed": True, "measured": "3 of 3",
                                                    "limit": "every step 1..3"}]}  # fmt: skip
    assert (root / "smoke-verdict.json").read_text().endswith("}\n")


def test_a_resumed_smoke_run_is_judged_from_the_step_after_its_save(
    plans: dict[str, Plan], tmp_path: Path, machine: Trainer, monkeypatch: pytest.MonkeyPatch, verdicts: Judge,
) -> None:  # fmt: skip
    """A restart that resumed after step 2 (what `plan` found, plan.resume): its verdict judges steps 3.. alone, the
    ones verl's file logger wrote this time."""
    plan, _ = _smoke(plans, tmp_path, monkeypatch)
    resumed = dataclasses.replace(plan, resume={**plan.resume, "action": "resume", "step": 2})
    assert run_command(resumed, progress=False) == 0
    [args] = verdicts.asked
    assert args[1] == 3 and args[-1] == 3


def test_a_failed_smoke_verdict_exits_4(plans: dict[str, Plan], tmp_path: Path, machine: Trainer,
                                        monkeypatch: pytest.MonkeyPatch, verdicts: Judge) -> None:  # fmt: skip
    verdicts.result = Verdict((Check("steps", True, "3", "3"), Check("reward", False, "0.0", "> 0.1")))
    plan, _ = _smoke(plans, tmp_path, monkeypatch)
    assert EXIT_SMOKE_FAILED == 4
    assert run_command(plan, progress=False) == 4


def test_a_smoke_run_whose_trainer_failed_gets_no_verdict(
    plans: dict[str, Plan], tmp_path: Path, machine: Trainer, monkeypatch: pytest.MonkeyPatch,
    verdicts: Judge, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    machine.code = 137
    plan, _ = _smoke(plans, tmp_path, monkeypatch)
    assert run_command(plan, progress=False) == 137
    assert verdicts.asked == []
    assert capsys.readouterr().out.endswith("smoke: FAIL (the trainer exited 137; no verdict on an unfinished run)\n")


def test_the_smoke_verdict_follows_the_users_steps_and_model(
    plans: dict[str, Plan], tmp_path: Path, machine: Trainer, monkeypatch: pytest.MonkeyPatch, verdicts: Judge
) -> None:
    plan, _ = _smoke(plans, tmp_path, monkeypatch)
    plan = dataclasses.replace(plan, overrides=[*plan.overrides, "trainer.total_training_steps=5",
                                                f"actor_rollout_ref.model.path={tmp_path / 'mine'}"])  # fmt: skip
    assert run_command(plan, progress=False) == 0
    [args] = verdicts.asked
    assert (args[1], args[3]) == (5, tmp_path / "mine")


def test_a_smoke_plan_without_steps_or_model_override_falls_back_to_none_and_the_setting(
    plans: dict[str, Plan], tmp_path: Path, machine: Trainer, monkeypatch: pytest.MonkeyPatch, verdicts: Judge
) -> None:
    plan, _ = _smoke(plans, tmp_path, monkeypatch)
    dropped = ("trainer.total_training_steps=", "actor_rollout_ref.model.path=")
    plan = dataclasses.replace(plan, overrides=[o for o in plan.overrides if not o.startswith(dropped)])
    assert run_command(plan, progress=False) == 0
    [args] = verdicts.asked
    assert (args[1], args[3]) == (0, plan.settings.model_path)


def test_a_verdict_that_cannot_be_written_is_a_warning_not_a_failure(
    plans: dict[str, Plan], tmp_path: Path, machine: Trainer, monkeypatch: pytest.MonkeyPatch,
    verdicts: Judge, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    plan, _ = _smoke(plans, tmp_path, monkeypatch)
    root = tmp_path / "ck" / plan.settings.project_name / plan.settings.experiment_name
    (root / "smoke-verdict.json").mkdir(parents=True)  # a folder where the file goes
    with caplog.at_level(logging.WARNING, logger="recipe"):
        assert run_command(plan, progress=False) == 0
    [message] = [m for m in caplog.messages if m.startswith("cannot write")]
    assert message.startswith(f"cannot write {root / 'smoke-verdict.json'}: [Errno 21] Is a directory")


@pytest.mark.parametrize(("code", "last"), [(0, "smoke: PASS\n"), (1, "no verdict on an unfinished run)\n")])
def test_the_smoke_verdict_is_flushed_before_run_exits(
    plans: dict[str, Plan], tmp_path: Path, machine: Trainer, monkeypatch: pytest.MonkeyPatch,
    verdicts: Judge, code: int, last: str,
) -> None:  # fmt: skip
    """A CI job reading the pipe sees the verdict block whole, before the job's next line."""
    piped = PipedStdout()
    monkeypatch.setattr("sys.stdout", piped)
    machine.code = code
    plan, _ = _smoke(plans, tmp_path, monkeypatch)
    assert run_command(plan, progress=False) == code
    assert piped.getvalue().endswith(last) and piped.unflushed == ""


def test_a_full_run_gets_no_verdict(plans: dict[str, Plan], tmp_path: Path, machine: Trainer,
                                    monkeypatch: pytest.MonkeyPatch, verdicts: Judge) -> None:  # fmt: skip
    monkeypatch.setattr(trainer, "_prepare_smoke", lambda root: pytest.fail("a full run built smoke assets"))
    machine.code = 0
    assert run_command(_ours(plans["full"], tmp_path), progress=False) == 0
    assert verdicts.asked == []
    assert not os.path.exists(_root(tmp_path) / "smoke-verdict.json")


def test_the_smoke_assets_are_announced_and_built_where_the_plan_points(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import recipe.smoke

    built: list[Path] = []
    monkeypatch.setattr(recipe.smoke, "prepare_smoke_assets", built.append)
    trainer._prepare_smoke(tmp_path / "assets")
    assert built == [tmp_path / "assets"]
    assert capsys.readouterr().out == f"Preparing the smoke model and data in {tmp_path / 'assets'}\n"


def test_the_smoke_assets_are_announced_before_the_build_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Building them takes a while: the line says why the run is quiet, so it is out before the build begins."""
    import recipe.smoke

    piped = PipedStdout()
    monkeypatch.setattr("sys.stdout", piped)
    seen: list[str] = []
    monkeypatch.setattr(recipe.smoke, "prepare_smoke_assets", lambda root: seen.append(piped.unflushed))
    trainer._prepare_smoke(tmp_path / "assets")
    assert seen == [""] and piped.getvalue() == f"Preparing the smoke model and data in {tmp_path / 'assets'}\n"


# --- the run report, the prompt budget, the bench data (issue 52) ---------------------------------------------------


def _rooted(base: Plan, tmp_path: Path, **settings: str) -> Plan:
    """`_ours` with the plan's own checkpoint root and TensorBoard folder under tmp_path too."""
    plan = _ours(base, tmp_path, **settings)
    overrides = [o for o in plan.overrides if not o.startswith("trainer.default_local_dir=")]
    return dataclasses.replace(plan, overrides=[*overrides, f"trainer.default_local_dir='{_root(tmp_path)}'"],
                               env={**plan.env, "TENSORBOARD_DIR": str(tmp_path / "tb")})  # fmt: skip


def test_the_run_report_counts_every_device_of_every_node_and_is_written_beside_the_checkpoints(
    plans: dict[str, Plan], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two nodes of four devices: the report's devices are the world's eight, whatever the trainer's end."""
    plan = _rooted(plans["full"], tmp_path)
    plan = dataclasses.replace(plan, layout=dataclasses.replace(plan.layout, nnodes=2, ndevices_per_node=4))
    assert plan.layout.world_size == 8
    report = trainer.write_run_report(plan, 143)
    assert report is not None and report.devices == 8 and report.outcome == "stopped (SIGTERM)"
    written = json.loads((_root(tmp_path) / trainer.REPORT_FILE).read_text())
    assert (written["devices"], written["exit_code"], written["steps_reported"]) == (8, 143, 0)
    assert capsys.readouterr().out.splitlines()[0] == (
        f"run report ({_root(tmp_path) / 'run-report.json'}): stopped (SIGTERM), 0 step(s) on 8 device(s)")


@pytest.mark.parametrize("peak_tflops", [None, "400"])
def test_the_run_report_gets_the_plans_exit_devices_model_size_peak_memory_and_health_bounds(
    plans: dict[str, Plan], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, peak_tflops: str | None
) -> None:
    """What the report divides by comes from the plan: the model's active parameters per token (none where the plan
    has no sizes), the device's peak (PEAK_TFLOPS, else the gpu default) and the memory estimate."""
    from recipe.run.report import Peak, ReportInputs, build_report

    given: list[ReportInputs] = []
    monkeypatch.setattr(trainer, "build_report", lambda metrics, inputs: given.append(inputs) or build_report(metrics, inputs))
    plan = _rooted(plans["full"], tmp_path, HEALTH_THRESHOLDS="flat_steps=20",
                   **({"PEAK_TFLOPS": peak_tflops} if peak_tflops else {}))  # fmt: skip
    assert plan.model.sizes is not None and plan.model.sizes.active_per_token > 0
    trainer.write_run_report(plan, 3)
    peak = Peak(400.0, "PEAK_TFLOPS") if peak_tflops else Peak(989.0, "an H100's dense bf16 peak; PEAK_TFLOPS for another")
    assert given == [ReportInputs(3, plan.layout.world_size, plan.model.sizes.active_per_token, peak, plan.memory,
                                  plan.settings.thresholds)]  # fmt: skip
    assert given[0].thresholds.flat_steps == 20
    no_sizes = dataclasses.replace(plan, model=dataclasses.replace(plan.model, sizes=None))
    trainer.write_run_report(no_sizes, 3)
    assert given[-1].active_per_token is None


def test_a_run_report_that_cannot_be_read_or_written_is_a_warning_and_the_exit_stays(
    plans: dict[str, Plan], tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plan = _rooted(plans["full"], tmp_path)
    (tmp_path / "tb").mkdir()
    os.mkfifo(tmp_path / "tb" / "events.out.tfevents.1.host")  # never opened: named instead
    with caplog.at_level(logging.WARNING, logger="recipe"):
        assert trainer.write_run_report(plan, 1) is None
    assert caplog.messages == [f"no run report: cannot read verl's metrics under {tmp_path / 'tb'} "
                               f"({tmp_path / 'tb' / 'events.out.tfevents.1.host'}: not a regular file)"]  # fmt: skip
    caplog.clear()
    (tmp_path / "tb" / "events.out.tfevents.1.host").unlink()
    _root(tmp_path).mkdir(parents=True)
    (_root(tmp_path) / trainer.REPORT_FILE).mkdir()  # a folder where the report goes
    with caplog.at_level(logging.WARNING, logger="recipe"):
        report = trainer.write_run_report(plan, 1)
    assert report is not None and report.outcome == "failed (exit 1)"
    [warning] = caplog.messages
    assert warning == f"cannot write {_root(tmp_path) / trainer.REPORT_FILE}: Is a directory"  # the OS's reason
    assert "run report (" in capsys.readouterr().out  # the table all the same
    caplog.clear()

    def fails(target: Path, write: Callable[[Any], None]) -> None:
        raise PermissionError()  # an error without the OS's text: its kind instead

    monkeypatch.setattr(trainer, "atomic_write", fails)
    with caplog.at_level(logging.WARNING, logger="recipe"):
        trainer.write_run_report(plan, 1)
    assert caplog.messages == [f"cannot write {_root(tmp_path) / trainer.REPORT_FILE}: PermissionError"]


def _manifest(tmp_path: Path, tokens: list[int]) -> None:
    """prepare-data's manifest beside the plan's training file, with these prompt lengths."""
    import hashlib

    train = tmp_path / "train.parquet"
    record = {"files": {"train": {"file": train.name, "sha256": hashlib.sha256(train.read_bytes()).hexdigest()}},
              "prompt_tokens": {"train": {"tokens": tokens}}}  # fmt: skip
    (tmp_path / "manifest.json").write_text(json.dumps(record))


@pytest.mark.parametrize(("tokens", "limit", "said"), [
    (None, "1024", "INFO prompt lengths against data.max_prompt_length: not checked (no manifest.json beside {train} "
                   "(prepare-data writes one))"),
    ([10] * 98 + [2000, 3000], "abc", "INFO prompt lengths against data.max_prompt_length: not checked "
                                      "(data.max_prompt_length=abc)"),
    ([10] * 98 + [2000, 3000], "1024", "WARNING data.max_prompt_length=1024: verl will drop 2 of the 100 training rows "
                                       "(2.0 %)"),
    ([10] * 99 + [3000], "1024", None),  # 1 %: not more than 1 %
])  # fmt: skip
def test_the_prompt_budget_is_checked_against_the_plans_limit_and_training_file(
    plans: dict[str, Plan], tmp_path: Path, caplog: pytest.LogCaptureFixture, tokens: list[int] | None, limit: str,
    said: str | None,
) -> None:  # fmt: skip
    plan = _ours(plans["full"], tmp_path)
    overrides = [o for o in plan.overrides if not o.startswith(("data.max_prompt_length=", "data.train_files="))]
    plan = dataclasses.replace(plan, overrides=[*overrides, f"data.max_prompt_length={limit}",
                                                f"data.train_files='{tmp_path / 'train.parquet'}'"])  # fmt: skip
    if tokens is not None:
        _manifest(tmp_path, tokens)
    with caplog.at_level(logging.INFO, logger="recipe"):
        trainer._warn_about_prompt_budget(plan)
    lines = [f"{r.levelname} {r.getMessage()}" for r in caplog.records if "prompt" in r.getMessage()]
    if said is None:
        assert lines == []
    else:
        [line] = lines
        assert line.startswith(said.format(train=tmp_path / "train.parquet")), line


def test_the_bench_writes_its_rows_only_where_the_plan_reads_them(
    plans: dict[str, Plan], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The plan's steps x TRAIN_BATCH_SIZE rows under CHECKPOINT_DIR/bench-data; nothing when data.train_files is
    the user's (issue 52: a user's files under CHECKPOINT_DIR are never replaced)."""
    import recipe.bench
    from recipe.smoke import shipped_model_dir

    written: list[tuple[Path, int, int]] = []
    monkeypatch.setattr(recipe.bench, "write_bench_data", lambda directory, *rows: written.append((directory, *rows)))
    settings = settings_of(**ONE_DEVICE, PROFILE="bench", CHECKPOINT_DIR=str(tmp_path / "ck"), TRAIN_BATCH_SIZE=3,
                           MODEL_PATH=str(shipped_model_dir()))  # fmt: skip
    plan = build_plan(settings, environ={}, extra_overrides=["trainer.total_training_steps=5"])
    trainer.prepare_bench(plan)
    assert written == [(tmp_path / "ck" / "bench-data", 15, 3)]
    assert capsys.readouterr().out == f"Writing the bench's 15 synthetic prompts in {tmp_path / 'ck' / 'bench-data'}\n"
    mine = tmp_path / "ck" / "mine" / "train.parquet"
    trainer.prepare_bench(dataclasses.replace(plan, overrides=[*plan.overrides, f"data.train_files='{mine}'"]))
    trainer.prepare_bench(plans["full"])  # no bench: nothing
    assert len(written) == 1


def test_a_worker_asks_the_heads_report_written_after_it_joined(
    plans: dict[str, Plan], tmp_path: Path, machine: Trainer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The report under the plan's checkpoint root, as it was when the worker joined: one the head writes later
    saying exit 0 is a finished run; the one already there is an earlier run's."""
    joined: list[dict[str, Any]] = []
    monkeypatch.setattr(trainer.supervisors, "run_worker", lambda role, **kw: joined.append(kw) or 0)
    plan = _rooted(plans["full"], tmp_path, NNODES="2", NODE_RANK="1", MASTER_ADDR="10.0.0.1")
    report = _root(tmp_path) / "run-report.json"
    report.parent.mkdir(parents=True)
    report.write_text(json.dumps({"outcome": "finished", "exit_code": 0}))  # an earlier run's
    assert run_command(plan) == 0
    run_ended = joined[0]["run_ended"]
    assert run_ended() is None
    report.write_text(json.dumps({"outcome": "finished", "exit_code": 0, "steps_reported": 12}))
    assert run_ended() == "the head's run report (run-report.json) says it finished with exit 0"
