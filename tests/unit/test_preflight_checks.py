"""`run`'s preflight by direct calls (recipe.run.preflight): what makes this machine unfit although the plan is sound,
each as the exact line `run` prints before anything starts (exit 2).

README (`run`): everything `plan` checks, then the machine: devices visible, the model's config.json, readable
data files, a writable checkpoint directory, the trainer's packages installed, and a node RAM that holds what the
plan keeps on the host. One real plan is built per module (a one-device gpu plan of the smoke model's config);
each test changes only what it checks. test_run_command.py runs the same checks through the CLI in a process.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import types
from pathlib import Path

import pytest

from recipe.device import DeviceDetection
from recipe.memory_fit import GIB, MemoryEstimate, Phase, Term
from recipe.plan import Plan, build_plan
from recipe.run import preflight
from recipe.run.preflight import host_memory_problem, node_memory_bytes, run_problems
from tests.unit.envtools import REPO, settings_of

UID = os.getuid()
ONE_DEVICE = {"DEVICE": "gpu", "NDEVICES_PER_NODE": "1", "TP": "1", "PP": "1", "CP": "1", "EP": "1", "ETP": "1",
              "GEN_TP": "1"}  # fmt: skip


@pytest.fixture(scope="module")
def base_plan(tmp_path_factory: pytest.TempPathFactory) -> Plan:
    """A sound one-device gpu plan; tests replace its settings, device, layout or estimate."""
    from recipe.smoke import shipped_model_dir

    folder = tmp_path_factory.mktemp("plan")
    (folder / "model").mkdir()
    (folder / "model" / "config.json").write_bytes((shipped_model_dir() / "config.json").read_bytes())
    for name in ("train.parquet", "test.parquet"):
        (folder / name).touch()
    settings = settings_of(**ONE_DEVICE, MODEL_PATH=str(folder / "model"), TRAIN_FILES=str(folder / "train.parquet"),
                           VAL_FILES=str(folder / "test.parquet"), CHECKPOINT_DIR=str(folder / "ck"))  # fmt: skip
    return build_plan(settings, environ={})


@pytest.fixture
def fit(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine with the trainer's packages and ample RAM: only what a test changes can be wrong."""
    monkeypatch.setattr(preflight, "_importable", lambda module: True)
    monkeypatch.setattr(preflight, "node_memory_bytes", lambda: None)


def _machine(tmp_path: Path, *, devices: int = 1, **settings: str) -> tuple[Path, dict[str, str]]:
    """Settings of a one-device plan whose model, data and checkpoint folder are under tmp_path."""
    (tmp_path / "model").mkdir(exist_ok=True)
    (tmp_path / "model" / "config.json").write_text("{}")
    for name in ("train.parquet", "test.parquet"):
        (tmp_path / name).touch()
    values = {**ONE_DEVICE, "MODEL_PATH": str(tmp_path / "model"), "TRAIN_FILES": str(tmp_path / "train.parquet"),
              "VAL_FILES": str(tmp_path / "test.parquet"), "CHECKPOINT_DIR": str(tmp_path / "ck"), **settings}  # fmt: skip
    return tmp_path, values


def _plan(base: Plan, values: dict[str, str], devices: int = 1, ndevices_per_node: int = 1,
          device: str = "gpu") -> Plan:  # fmt: skip
    detection = DeviceDetection(name=device, source="setting", reason=f"DEVICE={device} was set", visible_devices=devices)  # type: ignore[arg-type]
    layout = dataclasses.replace(base.layout, ndevices_per_node=ndevices_per_node)
    return dataclasses.replace(base, settings=settings_of(**values), device=detection, layout=layout)


# --- a fit machine, and each way it is unfit -------------------------------------------------


@pytest.mark.usefixtures("fit")
def test_a_fit_machine_has_no_problem(base_plan: Plan, tmp_path: Path) -> None:
    _, values = _machine(tmp_path)
    assert run_problems(_plan(base_plan, values)) == []


@pytest.mark.usefixtures("fit")
@pytest.mark.parametrize(
    ("visible", "per_node", "problem"),
    [
        (0, 1, "DEVICE=gpu: no gpu device found (DEVICE=gpu was set); run needs one"),
        (0, 8, "DEVICE=gpu: no gpu device found (DEVICE=gpu was set); run needs one"),  # one line, not two
        (1, 8, "NDEVICES_PER_NODE=8: only 1 gpu device(s) visible on this node"),
        (7, 8, "NDEVICES_PER_NODE=8: only 7 gpu device(s) visible on this node"),
        (8, 8, None),
        (16, 8, None),  # more than it uses: fine
    ],
)
def test_the_devices_this_node_shows_must_cover_ndevices_per_node(
    base_plan: Plan, tmp_path: Path, visible: int, per_node: int, problem: str | None
) -> None:
    _, values = _machine(tmp_path)
    plan = _plan(base_plan, values, devices=visible, ndevices_per_node=per_node)
    assert run_problems(plan) == ([problem] if problem else [])


@pytest.mark.usefixtures("fit")
@pytest.mark.parametrize("kind", ["no config.json", "config.json is a folder", "no model folder"])
def test_a_model_without_its_config_json_is_refused(base_plan: Plan, tmp_path: Path, kind: str) -> None:
    root, values = _machine(tmp_path)
    config = root / "model" / "config.json"
    config.unlink()
    if kind == "config.json is a folder":
        config.mkdir()
    elif kind == "no model folder":
        values["MODEL_PATH"] = str(root / "absent")
    assert run_problems(_plan(base_plan, values)) == [
        f"MODEL_PATH={values['MODEL_PATH']!r}: no config.json there (download the model first)"
    ]


@pytest.mark.usefixtures("fit")
@pytest.mark.parametrize("name", ["TRAIN_FILES", "VAL_FILES"])
def test_a_missing_data_file_is_refused_with_the_way_to_make_it(base_plan: Plan, tmp_path: Path, name: str) -> None:
    root, values = _machine(tmp_path)
    values[name] = str(root / "absent.parquet")
    assert run_problems(_plan(base_plan, values)) == [
        f"{name}={str(root / 'absent.parquet')!r}: file not found (run `entrypoint.py prepare-data` or set {name})"
    ]


@pytest.mark.usefixtures("fit")
def test_both_missing_data_files_are_named_train_first(base_plan: Plan, tmp_path: Path) -> None:
    root, values = _machine(tmp_path)
    (root / "train.parquet").unlink()
    (root / "test.parquet").unlink()
    assert [line.split("=")[0] for line in run_problems(_plan(base_plan, values))] == ["TRAIN_FILES", "VAL_FILES"]


@pytest.mark.usefixtures("fit")
@pytest.mark.parametrize("name", ["TRAIN_FILES", "VAL_FILES"])
def test_a_data_file_this_user_cannot_read_is_refused_naming_the_uid(
    base_plan: Plan, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    # Tests run as root, which reads any mode: the access check answers as it does for another user.
    _, values = _machine(tmp_path)
    real_access = os.access
    unreadable = values[name]
    monkeypatch.setattr(os, "access", lambda p, mode: real_access(p, mode) and not (str(p) == unreadable and mode & os.R_OK))
    assert run_problems(_plan(base_plan, values)) == [f"{name}={unreadable!r}: file is not readable by uid {UID}"]


@pytest.mark.usefixtures("fit")
@pytest.mark.parametrize("depth", ["the folder itself", "its parent", "three levels above"])
def test_a_checkpoint_dir_not_made_yet_is_fine_when_its_nearest_folder_is_writable(
    base_plan: Plan, tmp_path: Path, depth: str
) -> None:
    root, values = _machine(tmp_path)
    target = {"the folder itself": root / "ck", "its parent": root / "ck" / "new", "three levels above": root / "a" / "b" / "c"}[depth]
    if depth == "the folder itself":
        target.mkdir()
    values["CHECKPOINT_DIR"] = str(target)
    assert run_problems(_plan(base_plan, values)) == []


@pytest.mark.usefixtures("fit")
@pytest.mark.parametrize("where", ["the folder", "a parent", "an executable file"])
def test_a_checkpoint_dir_under_a_file_is_refused(base_plan: Plan, tmp_path: Path, where: str) -> None:
    root, values = _machine(tmp_path)
    (root / "blocker").write_text("a file")
    if where == "an executable file":
        (root / "blocker").chmod(0o755)  # writable and "searchable" to os.access, yet no folder
    target = root / "blocker" / "ck" if where == "a parent" else root / "blocker"
    values["CHECKPOINT_DIR"] = str(target)
    assert run_problems(_plan(base_plan, values)) == [f"CHECKPOINT_DIR={str(target)!r}: not writable by uid {UID}"]


@pytest.mark.usefixtures("fit")
@pytest.mark.parametrize("denied", [os.W_OK, os.X_OK], ids=["no write", "no search"])
def test_a_checkpoint_dir_this_user_cannot_write_into_is_refused(
    base_plan: Plan, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, denied: int
) -> None:
    """Creating a folder in it needs both write and search (x) permission on the nearest existing folder."""
    root, values = _machine(tmp_path)
    real_access = os.access
    nearest = str(root)  # CHECKPOINT_DIR=root/ck does not exist yet: root is where it would be made
    monkeypatch.setattr(os, "access", lambda p, mode: real_access(p, mode) and not (str(p) == nearest and mode & denied))
    assert run_problems(_plan(base_plan, values)) == [f"CHECKPOINT_DIR={values['CHECKPOINT_DIR']!r}: not writable by uid {UID}"]


@pytest.mark.usefixtures("fit")
def test_every_problem_is_named_at_once_in_the_order_run_checks_them(base_plan: Plan, tmp_path: Path) -> None:
    root, values = _machine(tmp_path)
    (root / "model" / "config.json").unlink()
    (root / "train.parquet").unlink()
    (root / "file").touch()
    values["CHECKPOINT_DIR"] = str(root / "file" / "ck")
    problems = run_problems(_plan(base_plan, values, devices=0))
    assert [line.split("=")[0] for line in problems] == ["DEVICE", "MODEL_PATH", "TRAIN_FILES", "CHECKPOINT_DIR"]


# --- PROFILE=smoke: run builds the model and data under CHECKPOINT_DIR/smoke-assets ---------------


@pytest.mark.usefixtures("fit")
def test_the_smoke_profile_s_own_model_and_data_need_not_exist_yet(base_plan: Plan, tmp_path: Path) -> None:
    values = {"PROFILE": "smoke", "DEVICE": "gpu", "CHECKPOINT_DIR": str(tmp_path / "ck")}
    plan = _plan(base_plan, values)
    assert plan.settings.model_path == tmp_path / "ck" / "smoke-assets" / "model"  # the profile's own place
    assert run_problems(plan) == []


@pytest.mark.usefixtures("fit")
def test_smoke_paths_pointed_elsewhere_are_checked(base_plan: Plan, tmp_path: Path) -> None:
    values = {"PROFILE": "smoke", "DEVICE": "gpu", "CHECKPOINT_DIR": str(tmp_path / "ck"),
              "MODEL_PATH": str(tmp_path / "mine"), "TRAIN_FILES": str(tmp_path / "mine.parquet")}  # fmt: skip
    assert run_problems(_plan(base_plan, values)) == [
        f"MODEL_PATH={str(tmp_path / 'mine')!r}: no config.json there (download the model first)",
        f"TRAIN_FILES={str(tmp_path / 'mine.parquet')!r}: file not found (run `entrypoint.py prepare-data` or set TRAIN_FILES)",
    ]


@pytest.mark.usefixtures("fit")
def test_the_full_profile_checks_paths_under_smoke_assets_too(base_plan: Plan, tmp_path: Path) -> None:
    """Only PROFILE=smoke builds them: a full run pointed there finds nothing made for it."""
    assets = tmp_path / "ck" / "smoke-assets"
    values = {**ONE_DEVICE, "CHECKPOINT_DIR": str(tmp_path / "ck"), "MODEL_PATH": str(assets / "model"),
              "TRAIN_FILES": str(assets / "data" / "train.parquet"), "VAL_FILES": str(assets / "data" / "test.parquet")}  # fmt: skip
    assert [line.split("=")[0] for line in run_problems(_plan(base_plan, values))] == ["MODEL_PATH", "TRAIN_FILES", "VAL_FILES"]


# --- the trainer's packages ----------------------------------------------------------------

GPU_PACKAGES = "verl, vllm, megatron-bridge, qwen-vl-utils, mathruler, TransferQueue, megatron-energon"
NPU_PACKAGES = "verl, vllm-ascend, torch_npu, megatron-bridge, qwen-vl-utils, mathruler, TransferQueue, megatron-energon"


@pytest.mark.parametrize(("device", "packages"), [("gpu", GPU_PACKAGES), ("npu", NPU_PACKAGES)])
def test_missing_trainer_packages_are_named_with_the_image_to_use(
    base_plan: Plan, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, device: str, packages: str
) -> None:
    monkeypatch.setattr(preflight, "_importable", lambda module: False)
    monkeypatch.setattr(preflight, "node_memory_bytes", lambda: None)
    _, values = _machine(tmp_path)
    assert run_problems(_plan(base_plan, values, device=device)) == [
        (
            f"DEVICE={device}: trainer packages not installed ({packages}); use the {device} image "
            f"(docker compose run --rm {device}), or install the packages of docker/{device}/requirements.lock "
            "beside the trainer extra (pip install '.[trainer]')"
        )
    ]


@pytest.mark.parametrize(("device", "packages"), [("gpu", GPU_PACKAGES), ("npu", NPU_PACKAGES)])
def test_each_package_named_is_in_the_lock_the_message_points_to(device: str, packages: str) -> None:
    lock = (REPO / "docker" / device / "requirements.lock").read_text().lower()
    for package in packages.split(", "):
        assert re.search(rf"^{re.sub(r'[-_]', '[-_]', package.lower())}==", lock, re.MULTILINE), package


@pytest.mark.parametrize(
    ("module", "package"),
    [("verl", "verl"), ("vllm", "vllm"), ("megatron.bridge", "megatron-bridge"), ("qwen_vl_utils", "qwen-vl-utils"),
     ("mathruler", "mathruler"), ("transfer_queue", "TransferQueue"), ("megatron.energon", "megatron-energon")],
)  # fmt: skip
def test_one_missing_module_names_the_package_that_provides_it(
    base_plan: Plan, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str, package: str
) -> None:
    monkeypatch.setattr(preflight, "_importable", lambda name: name != module)
    monkeypatch.setattr(preflight, "node_memory_bytes", lambda: None)
    _, values = _machine(tmp_path)
    [line] = run_problems(_plan(base_plan, values))
    assert line.startswith(f"DEVICE=gpu: trainer packages not installed ({package}); ")


def test_a_module_is_importable_only_when_python_can_find_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from recipe.run.preflight import _importable

    assert _importable("json") and _importable("os.path")
    assert not _importable("no_such_module_grpo")
    assert not _importable("no_such_module_grpo.sub")  # the parent's ImportError
    assert not _importable("json.no_such_sub")
    broken = types.ModuleType("half_imported_grpo")
    broken.__spec__ = None  # find_spec raises ValueError for such a module
    monkeypatch.setitem(sys.modules, "half_imported_grpo", broken)
    assert not _importable("half_imported_grpo")


# --- the node's RAM against what the plan keeps on the host --------------------------------------


def _estimate(plan: Plan, *gib: float) -> MemoryEstimate:
    """The estimate's shape (memory_fit): the two device phases, then the host's; only the host's is the node's RAM."""
    terms = [Term(f"term{i}", g * GIB, True, "NNODES") for i, g in enumerate(gib)]
    actor = Phase("actor phase (training)", [Term("weights", 1000 * GIB, True, "TP")], 80 * GIB)
    rollout = Phase("rollout phase (vLLM awake)", [Term("kv cache", 2000 * GIB, True, "GEN_TP")], 80 * GIB)
    return MemoryEstimate([actor, rollout, Phase("host RAM per node", terms, None)], 80.0, "DEVICE=gpu", 1.0, plan.layout)


def test_host_ram_that_holds_the_offloaded_state_is_no_problem(base_plan: Plan) -> None:
    plan = dataclasses.replace(base_plan, memory=_estimate(base_plan, 100, 200))
    assert host_memory_problem(plan, 300 * GIB) is None  # exactly enough
    assert host_memory_problem(plan, 301 * GIB) is None
    assert host_memory_problem(plan, None) is None  # unknown RAM: nothing to compare
    assert host_memory_problem(dataclasses.replace(base_plan, memory=None), 1) is None  # no estimate


def test_too_little_host_ram_names_the_layout_both_figures_and_the_two_largest_terms(base_plan: Plan) -> None:
    plan = dataclasses.replace(
        base_plan,
        memory=_estimate(base_plan, 20, 393, 5, 300),
        settings=settings_of(**ONE_DEVICE, OFFLOAD="true"),
        layout=dataclasses.replace(base_plan.layout, ndevices_per_node=8, tp=2, pp=3, ep=4),
    )
    assert host_memory_problem(plan, 512 * GIB) == (
        "OFFLOAD=true, NDEVICES_PER_NODE=8, TP=2, PP=3, EP=4: the plan keeps 718 GiB on each node's host "
        "(term1 393 GiB, term3 300 GiB; docs/memory.md), and this node has 512 GiB (MemTotal, or the container's "
        "memory limit): spread the model over more nodes (NNODES), or raise the container's memory limit"
    )
    assert host_memory_problem(plan, 718 * GIB - 1) is not None  # one byte short


def test_the_offload_setting_is_shown_as_set(base_plan: Plan) -> None:
    plan = dataclasses.replace(base_plan, memory=_estimate(base_plan, 10), settings=settings_of(**ONE_DEVICE, OFFLOAD="false"))
    assert (host_memory_problem(plan, GIB) or "").startswith("OFFLOAD=false, NDEVICES_PER_NODE=1, TP=1, PP=1, EP=1: ")


def test_run_refuses_a_node_without_the_ram(base_plan: Plan, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preflight, "_importable", lambda module: True)
    monkeypatch.setattr(preflight, "node_memory_bytes", lambda: 2 * GIB)
    _, values = _machine(tmp_path)
    plan = dataclasses.replace(_plan(base_plan, values), memory=_estimate(base_plan, 3))
    [line] = run_problems(plan)
    assert line.endswith("the plan keeps 3 GiB on each node's host (term0 3 GiB; docs/memory.md), and this node has 2 GiB "
                         "(MemTotal, or the container's memory limit): spread the model over more nodes (NNODES), or "
                         "raise the container's memory limit")  # fmt: skip


@pytest.mark.parametrize(
    ("meminfo", "limit", "ram"),
    [
        ("MemTotal:       2097152 kB\nMemFree:        1048576 kB\n", None, 2 * GIB),
        ("MemFree:        1 kB\nMemTotal:       2097152 kB\n", None, 2 * GIB),  # wherever the line is
        ("MemTotal:       2097152 kB\n", "max\n", 2 * GIB),  # no cgroup limit
        ("MemTotal:       2097152 kB\n", f"{GIB}\n", GIB),  # the container's limit is lower
        ("MemTotal:       2097152 kB\n", f"{4 * GIB}\n", 2 * GIB),  # a limit above the RAM does not add any
        (None, f"{GIB}\n", GIB),  # no /proc/meminfo: the limit alone
        ("MemTotal:       lots kB\n", None, None),  # unreadable figures are no figure
        ("MemTotalX:      2097152 kB\nSwapTotal: 4194304 kB\n", None, None),
        ("MemTotal:       2097152 kB\n", "-1\n", 2 * GIB),
        (None, None, None),
    ],
)
def test_the_node_s_ram_is_memtotal_or_a_lower_container_limit(
    tmp_path: Path, meminfo: str | None, limit: str | None, ram: int | None
) -> None:
    meminfo_path, limit_path = tmp_path / "meminfo", tmp_path / "memory.max"
    if meminfo is not None:
        meminfo_path.write_text(meminfo)
    if limit is not None:
        limit_path.write_text(limit)
    assert node_memory_bytes(meminfo_path, limit_path) == ram


def test_unreadable_memory_files_are_no_figure(tmp_path: Path) -> None:
    (tmp_path / "meminfo").mkdir()  # reading it fails with IsADirectoryError
    (tmp_path / "memory.max").mkdir()
    assert node_memory_bytes(tmp_path / "meminfo", tmp_path / "memory.max") is None


def test_the_node_s_ram_defaults_to_this_machine_s_files() -> None:
    ram = node_memory_bytes()
    assert ram is not None and ram > 0
    total_kb = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal:"))
    assert ram <= total_kb * 1024
