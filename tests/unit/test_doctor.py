"""`entrypoint.py doctor` as users run it: real checks in real probe processes, on this CPU venv.

The breakages are real too: a package that fails to import or hangs is put first on
PYTHONPATH, a distribution is missing from the installed verl's verl-core metadata, the C
compiler is broken, the image's labels disagree with what is installed.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from recipe import __version__
from recipe.doctor import checks, trainer_imports
from recipe.doctor.command import SCHEMA_VERSION

from .envtools import ENTRYPOINT, entrypoint_env

CHECK_FIELDS = {"name": str, "category": str, "status": str, "reason": str, "seconds": float}


def doctor(
    tmp_path: Path, *args: str, pythonpath: Path | None = None, in_image: bool = True, **settings: str
) -> subprocess.CompletedProcess[str]:
    """Run `entrypoint.py doctor ARGS` with writable volumes under tmp_path and these settings.

    `in_image`: as inside an image (a labels.d folder, so what the image provides counts as the
    node's); False: as on a bare machine, where doctor reports those failures as warnings.
    """
    env = entrypoint_env(**{"CHECKPOINT_DIR": str(tmp_path / "checkpoints"), "HF_HOME": str(tmp_path / "hf"), **settings})
    for ambient in ("RECIPE_IMAGE_INFO_DIR", "CC"):
        if ambient not in settings:
            env.pop(ambient, None)
    if in_image and "RECIPE_IMAGE_INFO_DIR" not in settings:
        info = tmp_path / "image-info"
        (info / "labels.d").mkdir(parents=True, exist_ok=True)
        (info / "labels.d" / "recipe.labels").write_text(f"io.grpo-recipe.device={settings.get('DEVICE', 'gpu')}\n")
        env["RECIPE_IMAGE_INFO_DIR"] = str(info)
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pythonpath), env.get("PYTHONPATH")]))
    return subprocess.run([*ENTRYPOINT, "doctor", *args], env=env, capture_output=True, text=True, timeout=300, check=False)


def report(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    return json.loads(done.stdout)


def by_name(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {check["name"]: check for check in document["checks"]}


def fake_packages(root: Path, **modules: str) -> Path:
    """Packages NAME/__init__.py with the given source, to put first on PYTHONPATH."""
    for name, source in modules.items():
        (root / name).mkdir(parents=True)
        (root / name / "__init__.py").write_text(source)
    return root


# --- exit codes and the JSON document -----------------------------------------------------


def test_exit_0_when_every_selected_check_passes(tmp_path: Path) -> None:
    done = doctor(tmp_path, "--json", "--only", "import:packaging", "--only", "import:pyzmq", "--only", "writable:*")
    assert done.returncode == 0, done.stdout + done.stderr
    document = report(done)
    assert document["exit_code"] == 0 and document["status"] in {"ok", "warn"}
    assert {c["status"] for c in document["checks"]} == {"ok"}
    assert set(by_name(document)) == {
        "import:packaging", "import:pyzmq", "writable:CHECKPOINT_DIR", "writable:HF_HOME", "writable:TMPDIR"
    }


def test_json_document_schema(tmp_path: Path) -> None:
    done = doctor(tmp_path, "--json", "--only", "import:p*", "--only", "user", "--only", "labels", "--only", "devices",
                  "--no-devices", in_image=False)  # fmt: skip
    document = report(done)  # stdout is exactly one JSON document
    assert document["schema_version"] == SCHEMA_VERSION and document["command"] == "doctor"
    assert set(document) == {"schema_version", "command", "status", "exit_code", "seconds", "environment", "notes",
                             "checks", "summary"}
    assert document["exit_code"] == done.returncode
    environment = document["environment"]
    assert set(environment) == {"recipe_version", "image", "python", "user", "device", "driver", "versions",
                                "checkpoint_dir"}
    assert environment["recipe_version"] == __version__
    assert set(environment["image"]) == {"info_dir", "labels", "label_files", "locks"}
    assert environment["image"]["labels"] is None  # not in an image here
    assert set(environment["device"]) == {"name", "source", "reason", "visible_devices"}
    assert environment["versions"]["torch"] and "TransferQueue" in environment["versions"]
    assert environment["user"]["uid"] == os.getuid()
    for check in document["checks"]:
        for field, kind in CHECK_FIELDS.items():
            assert isinstance(check[field], kind), (field, check)
        assert check["status"] in {"ok", "warn", "fail"} and check["reason"]
        assert check["category"] in {"environment", "imports", "framework", "device"}
    summary = document["summary"]
    assert [summary[s] for s in ("ok", "warn", "fail")] == [
        sum(c["status"] == s for c in document["checks"]) for s in ("ok", "warn", "fail")
    ]
    assert summary["failed"] == [c["name"] for c in document["checks"] if c["status"] == "fail"]
    # No device here, and --no-devices: the device checks are one warning that says why, not a failure.
    devices = by_name(document)["devices"]
    assert devices["status"] == "warn" and "no gpu device visible" in devices["reason"]


def test_a_node_whose_devices_are_not_visible_fails(tmp_path: Path) -> None:
    """Issue 54: DEVICE=npu on a node that lost its device mounts (here: none at all) fails, exit 1, naming the flag
    for a machine without accelerators by design."""
    done = doctor(tmp_path, "--json", "--only", "devices", DEVICE="npu")
    assert done.returncode == 1, done.stdout + done.stderr
    devices = by_name(report(done))["devices"]
    assert devices["status"] == "fail" and devices["reason"].startswith("no npu device visible (")
    assert devices["reason"].endswith("on a machine without accelerators by design (CI, a build host): doctor --no-devices")


def test_text_report_prints_each_checks_time_and_exit_code(tmp_path: Path) -> None:
    done = doctor(tmp_path, "--only", "import:packaging", "--only", "labels", in_image=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"doctor: grpo-recipe {__version__}, device gpu"
    assert any(line.strip().startswith("python") for line in lines)
    row = next(line for line in lines if "import:packaging" in line).split()
    assert row[0] == "ok" and row[1].endswith("s") and float(row[1][:-1]) >= 0
    assert lines[-1].startswith("doctor: 1 ok, 1 warn, 0 fail in ") and lines[-1].endswith("exit 0")


def test_exit_2_on_bad_settings_with_one_line_and_a_json_error(tmp_path: Path) -> None:
    done = doctor(tmp_path, "--json", DEVICE="tpu")
    assert done.returncode == 2
    assert done.stderr.strip() == "error: DEVICE='tpu': must be one of 'auto', 'gpu' or 'npu'"
    assert report(done) == {"schema_version": SCHEMA_VERSION, "command": "doctor", "status": "error",
                            "exit_code": 2, "errors": ["DEVICE='tpu': must be one of 'auto', 'gpu' or 'npu'"]}


def test_exit_2_when_only_selects_nothing(tmp_path: Path) -> None:
    done = doctor(tmp_path, "--only", "no-such-check")
    assert done.returncode == 2 and "--only no-such-check: matches none of the checks" in done.stderr
    assert "import:TransferQueue" in done.stderr  # the names one could have meant


@pytest.mark.parametrize("timeout", ["0", "-1", "inf", "nan", "-inf", "1e400", "86401"])
def test_timeout_must_be_positive_and_finite(tmp_path: Path, timeout: str) -> None:
    """`--json` prints the timeout: inf or nan there would be `Infinity`/`NaN`, which is not JSON. The refusal
    itself is a strict JSON document on stdout (a reader of --json reads stdout alone)."""
    done = doctor(tmp_path, "--json", f"--timeout={timeout}")
    assert done.returncode == 2
    document = json.loads(done.stdout, parse_constant=lambda constant: pytest.fail(f"{constant} in --json output"))
    assert document["status"] == "error" and document["exit_code"] == 2
    assert f"--timeout: {timeout!r}: must be more than 0 and at most 86400 seconds" in done.stderr


def test_a_pattern_with_control_characters_is_printed_escaped(tmp_path: Path) -> None:
    done = doctor(tmp_path, "--only", "x\x1b[31m\nforged: ok")
    assert done.returncode == 2 and "\x1b" not in done.stderr
    [line] = [text for text in done.stderr.splitlines() if "--only" in text]
    assert "--only x\\x1b[31m\\nforged: ok: matches none" in line


# --- imports -------------------------------------------------------------------------------


def test_a_broken_package_first_on_pythonpath_fails_its_import_check(tmp_path: Path) -> None:
    fakes = fake_packages(
        tmp_path / "fakes",
        transfer_queue='raise ImportError("libdoctorfake.so: cannot open shared object file: No such file or directory")\n',
    )
    done = doctor(tmp_path, "--json", "--only", "import:TransferQueue", "--only", "import:cachetools", pythonpath=fakes)
    assert done.returncode == 1
    checks_ = by_name(report(done))
    assert checks_["import:TransferQueue"]["status"] == "fail"
    assert checks_["import:TransferQueue"]["reason"] == (
        "import transfer_queue: ImportError: libdoctorfake.so: cannot open shared object file: No such file or directory"
    )
    assert checks_["import:cachetools"]["status"] == "ok"
    assert report(done)["summary"]["failed"] == ["import:TransferQueue"]


def test_a_hung_import_is_a_fail_after_its_timeout_and_the_rest_still_run(tmp_path: Path) -> None:
    fakes = fake_packages(tmp_path / "fakes", mathruler="import time\ntime.sleep(120)\n")
    done = doctor(
        tmp_path, "--json", "--timeout", "3", "--only", "import:mathruler", "--only", "import:cachetools",
        "--only", "import:msgspec", "--only", "import:dill", pythonpath=fakes,
    )
    assert done.returncode == 1
    checks_ = by_name(report(done))
    hung = checks_["import:mathruler"]
    assert hung["status"] == "fail" and hung["reason"] == "hung: no answer in 3 s, killed"
    # The reason proves the kill (an import that ran its 120 s would be "ok"); no upper bound
    # on the time: that would measure the machine.
    assert hung["seconds"] >= 3 and hung["timeout_s"] == 3
    assert {checks_[n]["status"] for n in ("import:cachetools", "import:msgspec", "import:dill")} == {"ok"}


def test_a_distribution_missing_from_verl_core_is_named(tmp_path: Path) -> None:
    # A verl whose verl-core extra needs a distribution that is not installed, as an image
    # built without TransferQueue would: the metadata found first on sys.path is this one.
    fakes = tmp_path / "fakes"
    info = fakes / "verl-0.9.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: verl\nVersion: 0.9.1\n"
        'Requires-Dist: doctor-absent-dist; extra == "verl-core"\n'
        'Requires-Dist: msgspec; extra == "verl-core"\n'
        'Requires-Dist: pytest; extra == "verl-core"\n'
    )
    done = doctor(tmp_path, "--json", "--only", "import:*", pythonpath=fakes)
    document = report(done)
    checks_ = by_name(document)
    assert checks_["import:doctor-absent-dist"] == {
        "name": "import:doctor-absent-dist", "category": "imports", "status": "fail",
        "reason": "not installed (verl's verl-core extra)", "seconds": 0.0, "timeout_s": None,
    }
    assert "doctor-absent-dist" in document["summary"]["missing"]
    assert checks_["import:msgspec"]["status"] == "ok"
    assert "import:pytest" not in checks_  # verl-core's test tooling is no image's business


def test_npu_reports_the_missing_framework_by_name(tmp_path: Path) -> None:
    # What the npu recipe image on its stand-in base must say: the NPU framework is not there.
    done = doctor(tmp_path, "--json", "--only", "import:*", "--only", "torch_npu", DEVICE="npu")
    document = report(done)
    assert done.returncode == 1
    assert {"torch_npu", "vllm-ascend"} <= set(document["summary"]["missing"])
    assert by_name(document)["torch_npu"]["reason"] == "ModuleNotFoundError: No module named 'torch_npu'"
    assert "import:torchcodec" not in by_name(document)  # left out of the npu image on purpose


def test_import_targets_cover_what_run_checks_and_verl_core() -> None:
    from recipe.run.preflight import TRAINER_MODULES, TRAINER_SUPPORT_MODULES

    for device in ("gpu", "npu"):
        targets, notes = trainer_imports.import_targets(device)
        names = {trainer_imports.normalize(t.distribution) for t in targets}
        assert notes == []
        assert {trainer_imports.normalize(d) for d in [*TRAINER_MODULES[device].values(), *TRAINER_SUPPORT_MODULES.values()]} <= names
        assert {"transferqueue", "mathruler", "qwen-vl-utils", "pyzmq"} <= names
        assert not names & {"pytest", "pytest-asyncio", "pytest-rerunfailures"}
        assert ("torchcodec" in names) == (device == "gpu")
        modules = {trainer_imports.normalize(t.distribution): t.modules for t in targets}
        assert modules["transferqueue"] == ["transfer_queue"]  # not the `recipe` or `tests` it also ships
        assert modules["pyzmq"] == ["zmq"] and modules["hydra-core"] == ["hydra"]


# --- framework checks ----------------------------------------------------------------------


def test_transformer_engine_missing_is_a_fail_naming_have_te(tmp_path: Path) -> None:
    # This venv has megatron-core without Transformer Engine: exactly the silent fallback.
    check = by_name(report(doctor(tmp_path, "--json", "--only", "transformer_engine")))["transformer_engine"]
    assert check["status"] == "fail"
    assert check["reason"].startswith("megatron.core HAVE_TE is False: Megatron falls back to local layers silently")
    assert "No module named 'transformer_engine'" in check["reason"]


def test_triton_builds_a_launcher_and_fails_without_a_working_compiler(tmp_path: Path) -> None:
    good = by_name(report(doctor(tmp_path, "--json", "--only", "triton_launcher")))["triton_launcher"]
    assert good["status"] == "ok" and "built and loaded doctor_launcher" in good["reason"]
    broken = by_name(report(doctor(tmp_path, "--json", "--only", "triton_launcher", CC="/bin/false")))
    assert broken["triton_launcher"]["status"] == "fail"
    assert broken["triton_launcher"]["reason"] == "the C compiler /bin/false exited 1: no message"
    absent = by_name(report(doctor(tmp_path, "--json", "--only", "triton_launcher", CC=str(tmp_path / "no-cc"))))
    assert absent["triton_launcher"]["reason"].startswith(f"no C compiler: {tmp_path / 'no-cc'} not found")


def test_torch_npu_failure_names_the_libraries_the_loader_cannot_find(tmp_path: Path) -> None:
    # A torch_npu whose extension links a library that is gone, as torch_npu links CANN's.
    fakes = tmp_path / "fakes"
    package = fakes / "torch_npu"
    package.mkdir(parents=True)
    (tmp_path / "dep.c").write_text("int doctor_dep(void) { return 1; }\n")
    (tmp_path / "ext.c").write_text("int doctor_dep(void);\nint doctor_ext(void) { return doctor_dep(); }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(tmp_path / "libdoctordep.so"), str(tmp_path / "dep.c")], check=True)
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-o", str(package / "libdoctorext.so"), str(tmp_path / "ext.c"),
         f"-L{tmp_path}", "-ldoctordep"],
        check=True,
    )
    (tmp_path / "libdoctordep.so").unlink()
    (package / "__init__.py").write_text("import ctypes, os\nctypes.CDLL(os.path.join(os.path.dirname(__file__), 'libdoctorext.so'))\n")
    check = by_name(report(doctor(tmp_path, "--json", "--only", "torch_npu", pythonpath=fakes, DEVICE="npu")))["torch_npu"]
    assert check["status"] == "fail"
    assert check["reason"].startswith("OSError: libdoctordep.so: cannot open shared object file")
    assert "libraries not found: libdoctordep.so (CANN's set_env.sh sets LD_LIBRARY_PATH" in check["reason"]


def test_allocator_switch_is_what_worker_setup_checks(tmp_path: Path) -> None:
    gpu = by_name(report(doctor(tmp_path, "--json", "--only", "allocator_switch")))["allocator_switch"]
    assert gpu == {**gpu, "status": "ok", "reason": "torch.cuda.memory._set_allocator_settings exists"}
    npu = by_name(report(doctor(tmp_path, "--json", "--only", "allocator_switch", DEVICE="npu")))
    assert npu["allocator_switch"]["status"] == "fail"
    assert npu["allocator_switch"]["reason"].startswith("torch_npu is not installed: verl cannot switch")
    off = by_name(report(doctor(tmp_path, "--json", "--only", "allocator_switch", DEVICE="npu", EXPANDABLE_SEGMENTS="false")))
    assert off["allocator_switch"]["status"] == "warn"


# --- environment checks --------------------------------------------------------------------


def image_info(root: Path, **labels: str) -> Path:
    (root / "labels.d").mkdir(parents=True)
    framework = {k: v for k, v in labels.items() if "framework" in k or ".version" in k and "opencontainers" not in k}
    recipe = {k: v for k, v in labels.items() if k not in framework}
    (root / "labels.d" / "framework.labels").write_text("".join(f"{k}={v}\n" for k, v in framework.items()))
    (root / "labels.d" / "recipe.labels").write_text("# written by the recipe stage\n" + "".join(f"{k}={v}\n" for k, v in recipe.items()))
    (root / "requirements.lock").write_text("verl==0.9.1 \\\n    --hash=sha256:00\n")
    return root


def installed(name: str) -> str:
    from importlib import metadata

    return metadata.version(name)


def test_labels_that_match_pass_and_the_lock_digest_is_reported(tmp_path: Path) -> None:
    info = image_info(
        tmp_path / "image",
        **{
            "io.grpo-recipe.framework": "full",
            "io.grpo-recipe.torch.version": installed("torch").split("+")[0],
            "io.grpo-recipe.verl.version": installed("verl"),
            "io.grpo-recipe.megatron-core.version": installed("megatron-core"),
            "org.opencontainers.image.version": __version__,
            "io.grpo-recipe.device": "gpu",
        },
    )
    document = report(doctor(tmp_path, "--json", "--only", "labels", RECIPE_IMAGE_INFO_DIR=str(info)))
    check = by_name(document)["labels"]
    assert check["status"] == "ok", check
    assert check["reason"] == "framework full; 4 labelled version(s) match: grpo-recipe, megatron-core, torch, verl"
    image = document["environment"]["image"]
    assert image["labels"]["io.grpo-recipe.verl.version"] == installed("verl")
    assert image["locks"] == {"requirements.lock": hashlib.sha256((info / "requirements.lock").read_bytes()).hexdigest()}


def test_labels_that_disagree_fail_naming_each(tmp_path: Path) -> None:
    info = image_info(
        tmp_path / "image",
        **{"io.grpo-recipe.verl.version": "0.9.0", "io.grpo-recipe.vllm.version": "0.24.0", "io.grpo-recipe.device": "npu"},
    )
    done = doctor(tmp_path, "--json", "--only", "labels", RECIPE_IMAGE_INFO_DIR=str(info), DEVICE="gpu")
    assert done.returncode == 1
    assert by_name(report(done))["labels"]["reason"] == (
        "this image is built for npu, DEVICE resolves to gpu; "
        f"verl {installed('verl')} installed, 0.9.0 labelled; vllm 0.24.0 labelled, not installed (or not found)"
    )


def test_root_is_a_fail_inside_an_image_and_a_warning_outside() -> None:
    inside, outside = checks.check_user(in_image=True), checks.check_user(in_image=False)
    if os.getuid() == 0:
        assert inside[0] == "fail" and "the image's user is recipe (uid 1000)" in inside[1]
        assert outside[0] == "warn"
    else:
        assert inside[0] == outside[0] == "ok"


def test_a_volume_that_cannot_be_written_fails(tmp_path: Path) -> None:
    status, reason = checks.check_writable("CHECKPOINT_DIR", Path("/proc/doctor-checkpoints"))
    assert status == "fail" and reason.startswith("CHECKPOINT_DIR='/proc/doctor-checkpoints' (missing; its parent /proc")
    assert "not writable by uid" in reason
    a_file = tmp_path / "file"
    a_file.write_text("")
    assert checks.check_writable("HF_HOME", a_file / "hub")[0] == "fail"
    status, reason = checks.check_writable("HF_HOME", tmp_path)
    assert status == "ok" and list(tmp_path.iterdir()) == [a_file]  # the probe file is gone


def test_probes_split_heavy_imports_across_processes() -> None:
    from recipe.doctor.runner import Step

    def chain(name: str, weight: int) -> tuple[int, list[Step]]:
        return weight, [Step(name, "import", "imports", 1.0)]

    bins = checks.split_into_probes([chain("light1", 1), chain("verl", 3), chain("vllm", 3), chain("light2", 1)], 2)
    assert [[s.name for s in b] for b in bins] == [["verl", "light1"], ["vllm", "light2"]]
    assert len(checks.split_into_probes([chain("a", 1)], 4)) == 1


def test_cann_and_cuda_labels_are_compared_with_the_toolkit_and_torch(tmp_path: Path) -> None:
    toolkit = tmp_path / "ascend-toolkit"
    (toolkit / "aarch64-linux").mkdir(parents=True)
    (toolkit / "aarch64-linux" / "ascend_toolkit_install.info").write_text("package_name=Ascend-cann-toolkit\nversion=9.1.0\n")
    environ = {"ASCEND_TOOLKIT_HOME": str(toolkit)}
    info = tmp_path / "image"
    assert checks.check_labels({"io.grpo-recipe.cann.version": "9.1.0"}, info, "npu", environ)[0] == "ok"
    assert checks.check_labels({"io.grpo-recipe.cann.version": "9.0.0"}, info, "npu", environ) == (
        "fail", "cann 9.1.0 installed, 9.0.0 labelled"
    )
    # This venv's torch is a CPU build: no CUDA to match a CUDA label.
    assert checks.check_labels({"io.grpo-recipe.cuda.version": "13.0"}, info, "gpu", {}) == (
        "fail", "cuda 13.0 labelled, not installed (or not found)"
    )


def fake_tool(bin_dir: Path, name: str, script: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text("#!/bin/sh\n" + script)
    (bin_dir / name).chmod(0o755)


def test_driver_facts_come_from_nvidia_smi_and_a_hung_one_is_a_fail(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from recipe.doctor import facts

    table = "| NVIDIA-SMI 550.54.15    Driver Version: 550.54.15    CUDA Version: 12.4 |"
    fake_tool(tmp_path / "bin", "nvidia-smi", f"""case "$1" in
  --query-gpu=*) echo "0, NVIDIA H200, 550.54.15, 143771 MiB"; echo "1, NVIDIA H200, 550.54.15, 143771 MiB";;
  *) echo "{table}";;
esac
""")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    found = facts.nvidia_driver()
    assert found.problem is None
    assert (found.facts["driver_version"], found.facts["cuda_driver_version"]) == ("550.54.15", "12.4")
    assert [g["name"] for g in found.facts["gpus"]] == ["NVIDIA H200", "NVIDIA H200"]
    monkeypatch.setattr(facts, "torch_cuda_version", lambda: "12.8")
    assert checks.check_driver("gpu", found) == (
        "ok", "NVIDIA driver 550.54.15, supports CUDA 12.4; 2 x NVIDIA H200"
    )
    monkeypatch.setattr(facts, "torch_cuda_version", lambda: "13.0")
    assert checks.check_driver("gpu", found) == (
        "fail", "NVIDIA driver 550.54.15, supports CUDA 12.4; torch is built for CUDA 13.0: the host needs a newer driver"
    )
    fake_tool(tmp_path / "bin", "nvidia-smi", "sleep 60; echo late\n")
    monkeypatch.setattr(facts, "DRIVER_TOOL_TIMEOUT_S", 1.0)
    monkeypatch.setattr(facts, "NVIDIA_PROC_VERSION", tmp_path / "version")
    (tmp_path / "version").write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:05 UTC 2024\n")
    hung = facts.nvidia_driver()
    assert hung.facts["kernel_module"] == "550.54.15"
    assert checks.check_driver("gpu", hung) == (
        "fail", "nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader gave no answer in 1 s (hung driver?)"
    )


def test_shm_size_is_reported_and_a_missing_one_warns(tmp_path: Path) -> None:
    status, reason = checks.check_shm()
    assert status in {"ok", "warn"} and reason.startswith("/dev/shm is ")
    status, reason = checks.check_shm(tmp_path / "no-shm")
    assert status == "warn" and "NCCL/HCCL and Ray's object store use it" in reason


# --- issue 27: behaviours a one-line bug broke unnoticed ------------------------------------


@pytest.mark.parametrize("timeout", ["0.5", "5", "59", "61", "600"])
def test_every_check_gets_exactly_the_timeout_asked_for(tmp_path: Path, timeout: str) -> None:
    """`--timeout` sets every check's limit as given: not floored, capped or rounded to a default."""
    done = doctor(tmp_path, "--json", "--timeout", timeout, "--only", "import:packaging", "--only", "import:pyzmq")
    limits = {check["name"]: check["timeout_s"] for check in report(done)["checks"]}
    assert limits == {"import:packaging": float(timeout), "import:pyzmq": float(timeout)}, done.stderr


@pytest.mark.parametrize(("total", "status"), [(64 << 20, "warn"), ((1 << 30) - 1, "warn"), (1 << 30, "ok"), (64 << 30, "ok")])
def test_shm_warns_under_the_documented_1_gib(monkeypatch: pytest.MonkeyPatch, total: int, status: str) -> None:
    """docs/doctor.md: `shm` (warn under 1 GiB); Docker's default is 64 MB, compose.yaml sets 64 GB."""
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _path: usage(total, 0, total))
    assert checks.check_shm()[0] == status


def test_json_keeps_the_drivers_problem(tmp_path: Path) -> None:
    """A driver tool that answers with an error: the reason belongs in environment.driver.problem."""
    fake_tool(tmp_path / "bin", "nvidia-smi", "echo 'Failed to initialize NVML: Driver/library version mismatch' >&2; exit 18\n")
    path = f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"
    done = doctor(tmp_path, "--json", "--only", "user", DEVICE="gpu", PATH=path)
    problem = report(done)["environment"]["driver"]["problem"]
    assert problem and "Driver/library version mismatch" in problem, done.stdout


@pytest.mark.parametrize("as_json", [False, True])
def test_a_local_check_that_raises_is_a_failure_and_exit_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], as_json: bool
) -> None:
    import argparse

    from recipe.doctor.command import EXIT_FAILED, run_doctor

    def broken() -> tuple[str, str]:
        raise OSError("statvfs failed")

    monkeypatch.setattr(checks, "check_shm", broken)
    for name, value in {"CHECKPOINT_DIR": tmp_path / "ck", "HF_HOME": tmp_path / "hf"}.items():
        monkeypatch.setenv(name, str(value))
    code = run_doctor(argparse.Namespace(json=as_json, only=["shm", "user"], timeout=None))
    assert code == EXIT_FAILED == 1
    out = capsys.readouterr().out
    if as_json:
        document = json.loads(out)
        assert by_name(document)["shm"]["status"] == "fail" and document["summary"]["failed"] == ["shm"]
        assert document["exit_code"] == 1
    else:
        assert "statvfs failed" in out and "failed: shm" in out



@pytest.mark.parametrize("in_image", [True, False])
def test_what_only_the_image_provides_counts_against_the_node_only_in_an_image(tmp_path: Path, in_image: bool) -> None:
    """On a bare machine a missing trainer package is the image's to provide: a warning named as such, exit 0."""
    fakes = fake_packages(tmp_path / "fakes", mathruler="raise ImportError('broken on purpose')\n")
    done = doctor(tmp_path, "--json", "--only", "import:mathruler", "--only", "writable:*", pythonpath=fakes,
                  in_image=in_image)  # fmt: skip
    document = report(done)
    check = by_name(document)["import:mathruler"]
    if in_image:
        assert (done.returncode, check["status"], document["summary"]["image_only"]) == (1, "fail", [])
    else:
        assert (done.returncode, check["status"]) == (0, "warn")
        assert check["reason"].endswith("[not in an image: the image provides this]")
        assert document["summary"]["image_only"] == ["import:mathruler"]
    text = doctor(tmp_path, "--only", "import:mathruler", pythonpath=fakes, in_image=in_image).stdout
    assert ("not counted against this node: import:mathruler" in text) is not in_image


# --- device memory against what plan's estimate assumes -------------------------------------------


class _Accelerator:
    """torch.cuda's memory calls as a node with these devices answers them (no device here)."""

    def __init__(self, totals_gib: list[float]) -> None:
        self.totals = [int(gib * (1 << 30)) for gib in totals_gib]

    def device_count(self) -> int:
        return len(self.totals)

    def mem_get_info(self, index: int) -> tuple[int, int]:
        return self.totals[index], self.totals[index]


@pytest.mark.parametrize(
    ("totals", "status"),
    [([79.2] * 8, "ok"), ([141.0] * 8, "ok"), ([79.2, 70.0], "warn"), ([39.4] * 8, "warn")],
)
def test_memory_warns_when_a_device_has_less_than_plan_assumes(
    monkeypatch: pytest.MonkeyPatch, totals: list[float], status: str
) -> None:
    """An H100 80GB reports 79.2 GiB: that is the 80 GiB plan assumes; a device with a tenth less is a warning
    naming the DEVICE_MEMORY_GIB that would make plan's estimate right."""
    from recipe.doctor import device_steps, probe

    monkeypatch.setattr(device_steps, "accelerator", lambda device_type: _Accelerator(totals))
    out = probe.Outcome()
    device_steps.step_memory(out, "cuda", 80, "an H100 or A100 80GB")
    assert out.status == status, out.reason
    if status == "warn":
        assert f"assumes 80 GiB (an H100 or A100 80GB), the driver reports {min(totals):.1f}" in out.reason
        assert f"DEVICE_MEMORY_GIB={min(totals):.0f}" in out.reason


def test_the_memory_check_is_given_what_plan_assumes(tmp_path: Path) -> None:
    from recipe.device import DeviceDetection
    from recipe.doctor import facts

    plan = checks.build_plan(
        "gpu", DeviceDetection("gpu", "setting", "test", visible_devices=8),
        checkpoint_dir=tmp_path, expandable_segments=True, labels=None, info_dir=tmp_path,
        driver=lambda: facts.DriverFacts(), environ={}, timeout_s=None, assumed_memory=(141.0, "DEVICE_MEMORY_GIB"),
    )  # fmt: skip
    (memory,) = [step for probe in plan.probes for step in probe.steps if step.name == "memory"]
    assert memory.args == {"device_type": "cuda", "assumed_gib": 141.0, "assumed_source": "DEVICE_MEMORY_GIB"}
