"""`entrypoint.py doctor` as a call: its text report, its `--json` document, `--only`, `--timeout` and exit codes.

run_doctor is called in this process with the machine stubbed where it differs from node to
node (settings, device detection, the driver, Python and the user) and with a plan of checks
whose results are known, so that every printed line can be pinned exactly as docs/doctor.md ("doctor:
check an image and a node") shows it. The real checks run in tests/unit/test_doctor.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import recipe.settings
from recipe import __version__
from recipe.device import DeviceDetection
from recipe.doctor import checks, command, facts
from recipe.doctor.runner import CheckResult, Probe, Step
from recipe.errors import RecipeConfigError

PYTHON = {"version": "3.11.7", "implementation": "CPython", "executable": "/venv/bin/python", "machine": "x86_64"}
USER = {"uid": 1000, "gid": 1000, "name": "recipe", "groups": [1000]}
VERSIONS = {"grpo-recipe": "0.4.0", "torch": "2.11.0+cu130", "verl": "0.9.1"}  # every other distribution: not installed


# --- arguments -----------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "seconds"), [("5", 5.0), ("0.5", 0.5), ("86400", 86400.0), ("1e-3", 0.001)])
def test_timeout_accepts_seconds_up_to_a_day(text: str, seconds: float) -> None:
    assert command._positive_seconds(text) == seconds


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("abc", "'abc': not a number of seconds"),
        ("", "'': not a number of seconds"),
        ("0", "'0': must be more than 0 and at most 86400 seconds (a day)"),
        ("-1", "'-1': must be more than 0 and at most 86400 seconds (a day)"),
        ("86400.5", "'86400.5': must be more than 0 and at most 86400 seconds (a day)"),
        ("inf", "'inf': must be more than 0 and at most 86400 seconds (a day)"),
        ("nan", "'nan': must be more than 0 and at most 86400 seconds (a day)"),
    ],
)
def test_timeout_refuses_what_is_not_a_positive_number_of_seconds(text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        command._positive_seconds(text)
    assert str(refused.value) == message


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="entrypoint.py")
    command.add_doctor_parser(top.add_subparsers(dest="command"))
    return top


def test_the_doctor_arguments() -> None:
    args = parser().parse_args(["doctor", "--json", "--only", "import:*", "--only", "labels", "--timeout", "2.5"])
    assert (args.command, args.json, args.only, args.timeout) == ("doctor", True, ["import:*", "labels"], 2.5)
    plain = parser().parse_args(["doctor"])
    assert (plain.json, plain.only, plain.timeout) == (False, None, None)


def test_a_bad_timeout_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parser().parse_args(["doctor", "--timeout", "0"])
    assert exited.value.code == 2
    assert "argument --timeout: '0': must be more than 0 and at most 86400 seconds (a day)" in capsys.readouterr().err


# --- the environment report ------------------------------------------------------------------


def environment(**changes: Any) -> dict[str, Any]:
    env: dict[str, Any] = {
        "recipe_version": "0.4.0",
        "image": {"info_dir": "/etc/grpo-recipe", "labels": None, "label_files": [], "locks": {}},
        "python": PYTHON,
        "user": USER,
        "device": {"name": "gpu", "source": "auto", "reason": "no accelerator found", "visible_devices": 0},
        "driver": {"problem": None},
        "versions": {"grpo-recipe": "0.4.0", "vllm": None},
        "checkpoint_dir": "/ck",
    }
    env.update(changes)
    return env


def test_the_report_of_a_bare_machine() -> None:
    assert command._environment_text(environment()) == [
        "image      not in an image (/etc/grpo-recipe/labels.d missing)",
        "locks      none found",
        "python     3.11.7 CPython /venv/bin/python (x86_64)",
        "user       uid 1000 (recipe), gid 1000",
        "device     gpu: no accelerator found; 0 device node(s) visible",
        "driver     not visible",
        "versions   grpo-recipe 0.4.0; not installed: vllm",
    ]


def test_the_report_in_an_image_with_a_driver() -> None:
    image = {
        "info_dir": "/etc/grpo-recipe",
        "labels": {"org.opencontainers.image.title": "grpo-recipe", "org.opencontainers.image.version": "0.4.0",
                   "io.grpo-recipe.framework": "full"},
        "label_files": ["/etc/grpo-recipe/labels.d/framework.labels", "/etc/grpo-recipe/labels.d/recipe.labels"],
        "locks": {"gpu.lock": "ab12", "requirements.lock": "cd34"},
    }  # fmt: skip
    driver = {"kernel_module": "570.86.15", "driver_version": "570.86.15", "cuda_driver_version": "12.8", "empty": "",
              "gpus": [{"name": "NVIDIA H200", "memory_total": "143771 MiB"}] * 8, "problem": None}  # fmt: skip
    text = command._environment_text(environment(
        image=image, driver=driver, user={**USER, "name": None}, versions={"torch": "2.11.0", "verl": "0.9.1"},
        device={"name": "gpu", "source": "auto", "reason": "8 /dev/nvidiaN nodes", "visible_devices": 8},
    ))  # fmt: skip
    assert text == [
        ("image      grpo-recipe 0.4.0, framework full (labels: /etc/grpo-recipe/labels.d/framework.labels, "
        "/etc/grpo-recipe/labels.d/recipe.labels)"),
        "locks      gpu.lock sha256:ab12, requirements.lock sha256:cd34",
        "python     3.11.7 CPython /venv/bin/python (x86_64)",
        "user       uid 1000 (no passwd entry), gid 1000",
        "device     gpu: 8 /dev/nvidiaN nodes; 8 device node(s) visible",
        "driver     kernel_module 570.86.15, driver_version 570.86.15, cuda_driver_version 12.8; 8 x NVIDIA H200 (143771 MiB)",
        "versions   torch 2.11.0, verl 0.9.1",
    ]


def test_one_gpu_is_reported_with_its_memory() -> None:
    driver = {"driver_version": "570.86.15", "gpus": [{"name": "NVIDIA L4", "memory_total": "23034 MiB"}]}
    assert command._environment_text(environment(driver=driver))[5] == "driver     driver_version 570.86.15; 1 x NVIDIA L4 (23034 MiB)"


def test_the_report_names_unknown_labels_and_the_drivers_problem() -> None:
    image = {"info_dir": "/i", "labels": {}, "label_files": [], "locks": {}}
    driver = {"kernel_module": "550.54.15", "problem": "nvidia-smi -L exited 18: version mismatch"}
    text = command._environment_text(environment(image=image, driver=driver, versions={"vllm": None, "ray": None}))
    assert text[0] == "image      ? ?, framework ? (labels: )"
    assert text[5] == "driver     kernel_module 550.54.15; nvidia-smi -L exited 18: version mismatch"
    assert text[6] == "versions   none; not installed: vllm, ray"
    hung = command._environment_text(environment(driver={"problem": "npu-smi info gave no answer in 20 s (hung driver?)"}))
    assert hung[5] == "driver     not visible; npu-smi info gave no answer in 20 s (hung driver?)"


@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch) -> None:
    """What differs from node to node, fixed: Python, the user, the installed versions."""
    monkeypatch.setattr(facts, "python_facts", lambda: PYTHON)
    monkeypatch.setattr(facts, "user_facts", lambda: USER)
    monkeypatch.setattr(facts, "distribution_version", lambda name: VERSIONS.get(name))


@pytest.mark.parametrize("device", ["gpu", "npu"])
def test_the_environment_document(node: None, tmp_path: Path, device: str) -> None:
    (tmp_path / "requirements.lock").write_bytes(b"")
    settings = types.SimpleNamespace(checkpoint_dir=Path("/ck"))
    detection = DeviceDetection(device, "setting", "DEVICE is set", 0)
    driver = facts.DriverFacts({"driver_version": "550"}, "a problem")
    labels = ({"io.grpo-recipe.device": device}, [str(tmp_path / "labels.d" / "recipe.labels")])
    document = command._environment(settings, detection, tmp_path, labels, driver)
    assert document == {
        "recipe_version": __version__,
        "image": {"info_dir": str(tmp_path), "labels": labels[0], "label_files": labels[1],
                  "locks": {"requirements.lock": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"}},
        "python": PYTHON,
        "user": USER,
        "device": {"name": device, "source": "setting", "reason": "DEVICE is set", "visible_devices": 0},
        "driver": {"driver_version": "550", "problem": "a problem"},
        "versions": {name: VERSIONS.get(name) for name in facts.REPORTED_DISTRIBUTIONS[device]},
        "checkpoint_dir": "/ck",
    }  # fmt: skip
    # The torch_npu and vllm-ascend builds are reported on npu, the CUDA stack's on gpu.
    assert ("torch-npu" in document["versions"]) == (device == "npu")
    assert ("transformer-engine" in document["versions"]) == (device == "gpu")
    bare = command._environment(settings, detection, tmp_path / "absent", None, facts.DriverFacts())
    assert bare["image"] == {"info_dir": str(tmp_path / "absent"), "labels": None, "label_files": [], "locks": {}}
    assert bare["driver"] == {"problem": None}


# --- order of the results --------------------------------------------------------------------


def result(name: str, category: str, status: str = "ok", reason: str = "fine", seconds: float = 0.0) -> CheckResult:
    return CheckResult(name, category, status, reason, seconds)  # type: ignore[arg-type]


def test_results_come_by_category_imports_by_name_and_the_rest_as_planned() -> None:
    planned = ["user", "writable:CHECKPOINT_DIR", "writable:HF_HOME", "shm", "labels", "import:b", "triton_launcher", "allocator_switch", "devices", "matmul", "collective"]
    results = [
        result("collective", "device"), result("matmul:cuda:1", "device"), result("matmul:cuda:0", "device"),
        result("other", "elsewhere"), result("devices", "device"), result("allocator_switch", "framework"),
        result("unplanned", "framework"), result("triton_launcher", "framework"), result("import:b", "imports"),
        result("import:Zed", "imports"), result("import:a", "imports"), result("labels", "environment"),
        result("import:torchvision", "imports"), result("import:torch_npu", "imports"),
        result("user", "environment"), result("shm", "environment"), result("writable:HF_HOME", "environment"),
        result("writable:CHECKPOINT_DIR", "environment"),
    ]  # fmt: skip
    ordered = sorted(results, key=command._order_key(planned))
    assert [r.name for r in ordered] == [
        "user", "writable:CHECKPOINT_DIR", "writable:HF_HOME", "shm", "labels",
        "import:a", "import:b", "import:torch_npu", "import:torchvision", "import:Zed",  # by name, as pip lists them
        "triton_launcher", "allocator_switch", "unplanned",  # a check not planned comes after the planned ones
        "devices", "matmul:cuda:1", "matmul:cuda:0", "collective",  # matmul's per-device checks where matmul was
        "other",  # an unknown category last
    ]  # fmt: skip


def test_a_result_line_is_status_seconds_name_reason() -> None:
    assert command._result_line(result("import:torch", "imports", "warn", "why", 1.234)) == (
        "  warn     1.23s  import:torch                   why"
    )
    assert command._result_line(result("x" * 31, "device", "fail", "r", 123.456)) == f"  fail   123.46s  {'x' * 31} r"


# --- run_doctor: the whole command -------------------------------------------------------------


class Doctor:
    """run_doctor on a stubbed node; `plan` is what build_plan returns, `probe_results` what each probe reports."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
        self.monkeypatch = monkeypatch
        self.tmp_path = tmp_path
        self.settings = types.SimpleNamespace(checkpoint_dir=tmp_path / "ck", expandable_segments=True, device="gpu",
                                              device_memory_gib=None, cann_chip=None)  # fmt: skip
        self.detection = DeviceDetection("gpu", "auto", "no accelerator found", 0)
        self.plan = checks.Plan()
        self.probe_results: dict[str, list[CheckResult]] = {}
        self.build_plan_calls: list[dict[str, Any]] = []
        self.driver_calls: list[tuple[str, dict[str, str]]] = []
        self.chip_calls = 0
        self.mismatch: str | None = None
        self.clock = [100.0, 102.34567]
        monkeypatch.setattr(recipe.settings, "load_settings", lambda: self.settings)
        self.detect_calls: list[tuple[str, dict[str, str]]] = []
        monkeypatch.setattr(command, "detect_device", lambda choice, environ: self.detect_calls.append((choice, environ)) or self.detection)
        monkeypatch.setattr(command, "chip_problem", self._chip_problem)
        monkeypatch.setattr(facts, "driver_facts", self._driver)
        monkeypatch.setattr(checks, "build_plan", self._build_plan)
        monkeypatch.setattr(command, "run_probe", lambda probe: self.probe_results[probe.name])
        monkeypatch.setattr(command, "time", types.SimpleNamespace(monotonic=lambda: self.clock.pop(0)))
        # The checks run here time themselves; a stopped clock makes their 0.00 s the fixture's, not the
        # machine's (CI's slower machine once took 1 ms over the driver check).
        monkeypatch.setattr(checks, "time", types.SimpleNamespace(perf_counter=lambda: 50.0))
        monkeypatch.setenv("RECIPE_IMAGE_INFO_DIR", str(tmp_path / "not-an-image"))

    def _chip_problem(self) -> str | None:
        self.chip_calls += 1
        return self.mismatch

    def _driver(self, device: str, environ: dict[str, str]) -> facts.DriverFacts:
        self.driver_calls.append((device, environ))
        return facts.DriverFacts({"driver_version": "550.54.15"})

    def _build_plan(self, device: str, detection: DeviceDetection, **kwargs: Any) -> checks.Plan:
        self.build_plan_calls.append({"device": device, "detection": detection, **kwargs})
        return self.plan

    def in_image(self, **labels: str) -> Path:
        info = self.tmp_path / "image-info"
        (info / "labels.d").mkdir(parents=True)
        (info / "labels.d" / "recipe.labels").write_text("".join(f"{k}={v}\n" for k, v in labels.items()))
        self.monkeypatch.setenv("RECIPE_IMAGE_INFO_DIR", str(info))
        return info

    def __call__(self, *only: str, as_json: bool = False, timeout: float | None = None, no_devices: bool = False) -> int:
        return command.run_doctor(argparse.Namespace(json=as_json, only=list(only) or None, timeout=timeout,
                                                     no_devices=no_devices))  # fmt: skip


@pytest.fixture
def doctor(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, node: None) -> Doctor:
    return Doctor(monkeypatch, tmp_path)


def local(status: str, reason: str) -> Callable[[], tuple[str, str]]:
    return lambda: (status, reason)


def a_plan(doctor: Doctor) -> None:
    """A plan as on a CPU machine outside an image: environment checks here, imports in two probes."""
    doctor.plan = checks.Plan(
        local=[
            ("user", "environment", local("warn", "running as root (uid 0); the images run as uid 1000")),
            ("shm", "environment", local("ok", "/dev/shm is 64.0 GiB (60.0 GiB free)")),
            # As build_plan makes it: the driver check asks the driver callable run_doctor passes in.
            ("driver", "device", lambda: checks.check_driver("gpu", doctor.build_plan_calls[-1]["driver"]())),
        ],
        probes=[
            Probe("imports-0", [Step("import:torch", "import", "imports", 180.0), Step("import:Abc", "import", "imports", 180.0)], {}),
            Probe("imports-1", [Step("transformer_engine", "transformer_engine", "framework", 120.0)], {}),
        ],
        decided=[CheckResult("import:vllm", "imports", "fail", "not installed (run checks it)", 0.0)],
        missing=["vllm"],
        notes=["verl is not installed: its verl-core requirements cannot be read"],
    )  # fmt: skip
    doctor.probe_results = {
        "imports-0": [CheckResult("import:torch", "imports", "ok", "torch 2.11.0: import torch", 1.2, 180.0),
                      CheckResult("import:Abc", "imports", "ok", "abc 1: import abc", 0.03, 180.0)],
        "imports-1": [CheckResult("transformer_engine", "framework", "fail", "megatron.core HAVE_TE is False", 0.5, 120.0)],
    }  # fmt: skip


def test_the_text_report_outside_an_image(doctor: Doctor, capsys: pytest.CaptureFixture[str]) -> None:
    a_plan(doctor)
    assert doctor() == 0  # what only the image provides is not counted against this node
    out = capsys.readouterr().out
    info = doctor.tmp_path / "not-an-image"
    assert out.splitlines() == [
        f"doctor: grpo-recipe {__version__}, device gpu",
        f"  image      not in an image ({info}/labels.d missing)",
        "  locks      none found",
        "  python     3.11.7 CPython /venv/bin/python (x86_64)",
        "  user       uid 1000 (recipe), gid 1000",
        "  device     gpu: no accelerator found; 0 device node(s) visible",
        "  driver     driver_version 550.54.15",
        "  versions   grpo-recipe 0.4.0, torch 2.11.0+cu130, verl 0.9.1; not installed: "
        + ", ".join(name for name in facts.REPORTED_DISTRIBUTIONS["gpu"] if name not in VERSIONS),
        "  note       verl is not installed: its verl-core requirements cannot be read",
        "checks: 4 here, 3 in 2 probe process(es) side by side, each bounded by its timeout",
        "  warn     0.00s  user                           running as root (uid 0); the images run as uid 1000",
        "  ok       0.00s  shm                            /dev/shm is 64.0 GiB (60.0 GiB free)",
        "  ok       0.03s  import:Abc                     abc 1: import abc",
        "  ok       1.20s  import:torch                   torch 2.11.0: import torch",
        "  warn     0.00s  import:vllm                    not installed (run checks it) [not in an image: the image provides this]",
        "  warn     0.50s  transformer_engine             megatron.core HAVE_TE is False [not in an image: the image provides this]",
        "  ok       0.00s  driver                         NVIDIA driver 550.54.15",
        "doctor: 4 ok, 3 warn, 0 fail in 2.3 s; exit 0",
        "not in an image, so not counted against this node: import:vllm, transformer_engine (use the image)",
        "not installed: vllm",
    ]
    # The report and the driver check share one run of the driver's tools.
    assert [device for device, _ in doctor.driver_calls] == ["gpu"]


def test_in_an_image_what_the_image_provides_fails_and_exit_1(doctor: Doctor, capsys: pytest.CaptureFixture[str]) -> None:
    a_plan(doctor)
    info = doctor.in_image(**{"io.grpo-recipe.device": "gpu"})
    assert doctor() == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == f"  image      ? ?, framework ? (labels: {info / 'labels.d' / 'recipe.labels'})"
    assert "  fail     0.00s  import:vllm                    not installed (run checks it)" in lines
    assert lines[-3:] == [
        "doctor: 4 ok, 1 warn, 2 fail in 2.3 s; exit 1",
        "failed: import:vllm, transformer_engine",
        "not installed: vllm",
    ]


def test_the_json_document(doctor: Doctor, capsys: pytest.CaptureFixture[str]) -> None:
    a_plan(doctor)
    doctor.plan.local.append(("labels", "environment", local("fail", "verl 0.9.1 installed, 0.9.0 labelled")))
    assert doctor(as_json=True) == 1
    document = json.loads(capsys.readouterr().out)  # stdout is the document and nothing else
    assert document["environment"] == command._environment(
        doctor.settings, doctor.detection, doctor.tmp_path / "not-an-image", None, facts.DriverFacts({"driver_version": "550.54.15"})
    )
    assert {k: v for k, v in document.items() if k != "environment"} == {
        "schema_version": 1,
        "command": "doctor",
        "status": "fail",
        "exit_code": 1,
        "seconds": 2.346,
        "notes": ["verl is not installed: its verl-core requirements cannot be read"],
        "checks": [
            {"name": "user", "category": "environment", "status": "warn",
             "reason": "running as root (uid 0); the images run as uid 1000", "seconds": 0.0, "timeout_s": None},
            {"name": "shm", "category": "environment", "status": "ok", "reason": "/dev/shm is 64.0 GiB (60.0 GiB free)",
             "seconds": 0.0, "timeout_s": None},
            {"name": "labels", "category": "environment", "status": "fail", "reason": "verl 0.9.1 installed, 0.9.0 labelled",
             "seconds": 0.0, "timeout_s": None},
            {"name": "import:Abc", "category": "imports", "status": "ok", "reason": "abc 1: import abc", "seconds": 0.03,
             "timeout_s": 180.0},
            {"name": "import:torch", "category": "imports", "status": "ok", "reason": "torch 2.11.0: import torch",
             "seconds": 1.2, "timeout_s": 180.0},
            {"name": "import:vllm", "category": "imports", "status": "warn",
             "reason": "not installed (run checks it) [not in an image: the image provides this]", "seconds": 0.0,
             "timeout_s": None},
            {"name": "transformer_engine", "category": "framework", "status": "warn",
             "reason": "megatron.core HAVE_TE is False [not in an image: the image provides this]", "seconds": 0.5,
             "timeout_s": 120.0},
            {"name": "driver", "category": "device", "status": "ok", "reason": "NVIDIA driver 550.54.15", "seconds": 0.0,
             "timeout_s": None},
        ],
        "summary": {"ok": 4, "warn": 3, "fail": 1, "failed": ["labels"], "missing": ["vllm"],
                    "image_only": ["import:vllm", "transformer_engine"]},
    }  # fmt: skip


@pytest.mark.parametrize(
    ("statuses", "status", "code"),
    [(["ok", "ok"], "ok", 0), (["ok", "warn"], "warn", 0), (["warn", "fail"], "fail", 1), (["fail", "fail"], "fail", 1)],
)
def test_the_documents_status_is_the_worst_check(
    doctor: Doctor, capsys: pytest.CaptureFixture[str], statuses: list[str], status: str, code: int
) -> None:
    doctor.plan = checks.Plan(local=[(f"c{i}", "environment", local(s, "r")) for i, s in enumerate(statuses)])
    assert doctor(as_json=True) == code
    document = json.loads(capsys.readouterr().out)
    assert (document["status"], document["exit_code"]) == (status, code)
    assert document["summary"] == {"ok": statuses.count("ok"), "warn": statuses.count("warn"), "fail": statuses.count("fail"),
                                   "failed": [f"c{i}" for i, s in enumerate(statuses) if s == "fail"], "missing": [],
                                   "image_only": []}  # fmt: skip


def test_a_clean_run_prints_no_failed_or_missing_line(doctor: Doctor, capsys: pytest.CaptureFixture[str]) -> None:
    doctor.plan = checks.Plan(local=[("user", "environment", local("ok", "uid 1000 (recipe), not root"))])
    assert doctor() == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2:] == ["  ok       0.00s  user                           uid 1000 (recipe), not root",
                          "doctor: 1 ok, 0 warn, 0 fail in 2.3 s; exit 0"]  # fmt: skip
    assert "checks: 1 here, 0 in 0 probe process(es) side by side, each bounded by its timeout" in lines


def test_doctor_plans_with_the_settings_the_labels_and_the_timeout(doctor: Doctor, capsys: pytest.CaptureFixture[str]) -> None:
    doctor.plan = checks.Plan(local=[("user", "environment", local("ok", "fine"))])
    info = doctor.in_image(**{"io.grpo-recipe.device": "gpu"})
    doctor.settings.expandable_segments = False
    doctor.settings.device_memory_gib = 141.0
    assert doctor(timeout=7.5) == 0
    (call,) = doctor.build_plan_calls
    driver = call.pop("driver")
    assert call == {
        "device": "gpu", "detection": doctor.detection, "checkpoint_dir": doctor.tmp_path / "ck", "expandable_segments": False,
        "labels": {"io.grpo-recipe.device": "gpu"}, "info_dir": info, "environ": dict(os.environ), "timeout_s": 7.5,
        "assumed_memory": (141.0, "DEVICE_MEMORY_GIB"), "devices_required": True,
    }  # fmt: skip
    assert driver().facts == {"driver_version": "550.54.15"}
    assert doctor.driver_calls == [("gpu", dict(os.environ))]  # asked once, whoever asks
    assert doctor.detect_calls == [("gpu", dict(os.environ))]  # DEVICE as set, against this environment


def test_without_labels_or_a_memory_setting_plan_assumes_the_default_device(doctor: Doctor, capsys: pytest.CaptureFixture[str]) -> None:
    doctor.plan = checks.Plan(local=[("user", "environment", local("ok", "fine"))])
    assert doctor() == 0
    (call,) = doctor.build_plan_calls
    assert (call["labels"], call["timeout_s"]) == (None, None)
    assert call["assumed_memory"] == (80.0, "an H100 or A100 80GB; DEVICE_MEMORY_GIB for another")


def test_on_npu_plan_assumes_the_memory_of_the_chip_the_image_is_built_for(
    doctor: Doctor, capsys: pytest.CaptureFixture[str]
) -> None:
    doctor.plan = checks.Plan(local=[("user", "environment", local("ok", "fine"))])
    doctor.detection = DeviceDetection("npu", "setting", "DEVICE is set", 0)
    doctor.settings.device = "npu"
    doctor.in_image(**{"io.grpo-recipe.cann.chip": "910b"})
    assert doctor() == 0
    memory, source = doctor.build_plan_calls[0]["assumed_memory"]
    assert memory == 64 and source.startswith("one 910b NPU")  # README: DEVICE_MEMORY_GIB npu 64 (a3 and 910b)
    assert doctor.detect_calls == [("npu", dict(os.environ))]


def test_bad_settings_exit_2_with_each_problem(doctor: Doctor, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def refuse() -> None:
        raise RecipeConfigError(["DEVICE='tpu': must be one of 'auto', 'gpu' or 'npu'", "TP='x': not an integer"])

    monkeypatch.setattr(recipe.settings, "load_settings", refuse)
    assert doctor(as_json=True) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == ["error: DEVICE='tpu': must be one of 'auto', 'gpu' or 'npu'", "error: TP='x': not an integer"]
    assert json.loads(captured.out) == {"schema_version": 1, "command": "doctor", "status": "error", "exit_code": 2,
                                        "errors": ["DEVICE='tpu': must be one of 'auto', 'gpu' or 'npu'", "TP='x': not an integer"]}  # fmt: skip
    assert doctor() == 2 and capsys.readouterr().out == ""


@pytest.mark.parametrize(
    ("device", "visible", "asked"),
    [("npu", 16, True), ("npu", 0, False), ("gpu", 8, False)],
)
def test_an_npu_image_for_the_other_chip_cannot_run_and_says_so_alone(
    doctor: Doctor, capsys: pytest.CaptureFixture[str], device: str, visible: int, asked: bool
) -> None:
    doctor.detection = DeviceDetection(device, "auto", "devices", visible)  # type: ignore[arg-type]
    doctor.mismatch = "this node's NPUs are a3, but the image's vllm-ascend is built for 910b"
    doctor.plan = checks.Plan(local=[("user", "environment", local("ok", "fine"))])
    code = doctor(as_json=True)
    captured = capsys.readouterr()
    assert doctor.chip_calls == int(asked)
    if asked:
        assert code == 2 and doctor.build_plan_calls == []
        assert captured.err == "error: this node's NPUs are a3, but the image's vllm-ascend is built for 910b\n"
        assert json.loads(captured.out)["errors"] == [doctor.mismatch]
    else:
        assert code == 0 and json.loads(captured.out)["checks"][0]["name"] == "user"


@pytest.mark.parametrize(
    ("only", "kept"),
    [
        (["import:*"], ["import:Abc", "import:torch", "import:vllm"]),
        (["shm", "driver"], ["shm", "driver"]),
        (["matmul:cuda:0"], ["matmul"]),  # a device's check selects the step that checks every device
        (["transformer_*", "user"], ["user", "transformer_engine"]),
    ],
)
def test_only_runs_the_checks_whose_name_matches(
    doctor: Doctor, capsys: pytest.CaptureFixture[str], only: list[str], kept: list[str]
) -> None:
    a_plan(doctor)
    doctor.plan.probes.append(Probe("device", [Step("matmul", "matmul", "device", 60.0)], {}, on_hang="stop"))
    doctor.probe_results["device"] = [CheckResult("matmul:cuda:0", "device", "ok", "512x512 float32 matmul correct", 0.1, 60.0)]
    doctor(*only, as_json=True)
    names = [check["name"] for check in json.loads(capsys.readouterr().out)["checks"]]
    assert names == [name if name != "matmul" else "matmul:cuda:0" for name in kept]


def test_only_that_matches_nothing_exits_2_naming_every_check(doctor: Doctor, capsys: pytest.CaptureFixture[str]) -> None:
    a_plan(doctor)
    assert doctor("no-such-check", "x\x1b[31m") == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "error: --only no-such-check x\\x1b[31m: matches none of the checks "
        "(driver, import:Abc, import:torch, import:vllm, shm, transformer_engine, user)\n"
    )
    a_plan(doctor)  # afresh: --only narrowed the one above
    assert doctor("nothing", as_json=True) == 2
    assert json.loads(capsys.readouterr().out)["errors"] == [
        "--only nothing: matches none of the checks (driver, import:Abc, import:torch, import:vllm, shm, transformer_engine, user)"
    ]


def test_every_distribution_not_installed_is_named_on_the_last_line(doctor: Doctor, capsys: pytest.CaptureFixture[str]) -> None:
    doctor.plan = checks.Plan(
        decided=[CheckResult("import:vllm", "imports", "fail", "not installed (run checks it)", 0.0),
                 CheckResult("import:nvtx", "imports", "fail", "not installed (verl's verl-core extra)", 0.0)],
        missing=["vllm", "nvtx"],
    )  # fmt: skip
    doctor()
    assert capsys.readouterr().out.splitlines()[-1] == "not installed: vllm, nvtx"


# --- --help: what README documents ---------------------------------------------------------------


def test_the_usage_line_and_exit_codes_are_the_documented_ones(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit):
        parser().parse_args(["doctor", "--help"])
    text = capsys.readouterr().out
    # README: `entrypoint.py doctor [--json] [--only PATTERN] [--no-devices] [--timeout SECONDS]`, exit codes 0, 1, 2.
    assert text.splitlines()[0] == (
        "usage: entrypoint.py doctor [-h] [--json] [--only PATTERN] [--no-devices] [--timeout SECONDS]")
    codes = text.split("\nexit codes:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert [line.split()[0] for line in codes] == ["0", "1", "2"]
    examples = [line.strip() for line in text.split("\nexample:\n", 1)[1].splitlines() if line.strip()]
    assert examples and all(example.startswith("entrypoint.py doctor") for example in examples)
    for example in examples:  # each one the parser accepts
        parser().parse_args(shlex.split(example)[1:])
