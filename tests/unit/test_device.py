"""DEVICE=auto detection from device nodes, driver files and package metadata: never by importing torch."""

from __future__ import annotations

from pathlib import Path

import pytest

from recipe.device import count_device_nodes, detect_device


def _machine(root: Path, *files: str) -> Path:
    for relative in files:
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    (root / "dev").mkdir(exist_ok=True)
    return root


def _nothing_installed(_name: str) -> bool:
    return False


def test_ascend_device_nodes_mean_npu(tmp_path: Path) -> None:
    root = _machine(tmp_path, "dev/davinci0", "dev/davinci1", "dev/davinci_manager", "dev/devmm_svm")
    found = detect_device("auto", root=root, package_installed=_nothing_installed)
    assert (found.name, found.source, found.visible_devices) == ("npu", "auto", 2)
    assert "/dev/davinciN" in found.reason


def test_nvidia_device_nodes_mean_gpu(tmp_path: Path) -> None:
    root = _machine(tmp_path, *(f"dev/nvidia{i}" for i in range(8)), "dev/nvidiactl", "dev/nvidia-uvm")
    found = detect_device("auto", root=root, package_installed=_nothing_installed)
    assert (found.name, found.visible_devices) == ("gpu", 8)


def test_control_nodes_alone_are_not_devices(tmp_path: Path) -> None:
    root = _machine(tmp_path, "dev/nvidiactl", "dev/davinci_manager")
    assert count_device_nodes("gpu", root) == 0
    assert count_device_nodes("npu", root) == 0


def test_ascend_driver_without_devices_plans_npu_but_sees_none(tmp_path: Path) -> None:
    root = _machine(tmp_path, "usr/local/Ascend/driver/version.info")
    found = detect_device("auto", root=root, package_installed=_nothing_installed)
    assert (found.name, found.visible_devices) == ("npu", 0)
    assert "driver" in found.reason


def test_an_npu_image_on_a_bare_machine_plans_npu(tmp_path: Path) -> None:
    found = detect_device("auto", root=_machine(tmp_path), package_installed=lambda name: name == "torch_npu")
    assert found.name == "npu" and "torch_npu" in found.reason


def test_no_evidence_plans_gpu_and_says_so(tmp_path: Path) -> None:
    found = detect_device("auto", root=_machine(tmp_path), environ={}, package_installed=_nothing_installed)
    assert (found.name, found.visible_devices) == ("gpu", 0)
    assert "no accelerator found" in found.reason


def test_an_explicit_device_is_kept_even_against_the_evidence(tmp_path: Path) -> None:
    root = _machine(tmp_path, "dev/nvidia0")
    found = detect_device("npu", root=root, package_installed=_nothing_installed)
    assert (found.name, found.source, found.visible_devices) == ("npu", "setting", 0)


def test_this_machine_is_probed_without_importing_torch() -> None:
    import subprocess
    import sys

    code = "import sys; from recipe.device import detect_device; detect_device('auto'); print(sorted(m for m in sys.modules if m.split('.')[0] in {'torch', 'torch_npu'}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


#: Each kind of evidence, the machine it makes, and what `plan` shows for it (README: DEVICE's row).
_EVIDENCE = {
    "davinci nodes": (("dev/davinci0", "dev/davinci1"), set(), {}),
    "nvidia nodes": (("dev/nvidia0", "dev/nvidia1", "dev/nvidia2"), set(), {}),
    "both nodes": (("dev/nvidia0", "dev/davinci0", "dev/davinci1"), set(), {}),
    "ascend version.info": (("usr/local/Ascend/driver/version.info",), set(), {}),
    "npu-smi": (("usr/local/bin/npu-smi",), set(), {}),
    "nvidia driver file": (("proc/driver/nvidia/version",), set(), {}),
    "both driver files": (("proc/driver/nvidia/version", "usr/local/bin/npu-smi"), set(), {}),
    "vllm-ascend installed": ((), {"vllm-ascend"}, {}),
    "cuda runtime installed": ((), {"nvidia-cuda-runtime-cu13"}, {}),
    "both installed": ((), {"nvidia-cuda-runtime-cu12", "torch_npu"}, {}),
    "cuda image env": ((), set(), {"NVIDIA_VISIBLE_DEVICES": "all"}),
    "void cuda env": ((), set(), {"NVIDIA_VISIBLE_DEVICES": "void"}),
    "none cuda env": ((), set(), {"NVIDIA_VISIBLE_DEVICES": "none"}),
    "nothing": ((), set(), {}),
}
_SHOWN = {
    "davinci nodes": ("npu", "2 Ascend device node(s) /dev/davinciN found", 2),
    "nvidia nodes": ("gpu", "3 NVIDIA device node(s) /dev/nvidiaN found", 3),
    "both nodes": ("gpu", "both NVIDIA (1) and Ascend (2) device nodes found; chose gpu, set DEVICE", 1),
    "ascend version.info": ("npu", "Ascend driver file /usr/local/Ascend/driver/version.info found, but no /dev/davinciN", 0),
    "npu-smi": ("npu", "Ascend driver file /usr/local/bin/npu-smi found, but no /dev/davinciN", 0),
    "nvidia driver file": ("gpu", "NVIDIA driver file /proc/driver/nvidia/version found, but no /dev/nvidiaN", 0),
    "both driver files": ("npu", "Ascend driver file /usr/local/bin/npu-smi found, but no /dev/davinciN", 0),
    "vllm-ascend installed": ("npu", "no accelerator found; package vllm-ascend is installed", 0),
    "cuda runtime installed": ("gpu", "no accelerator found; package nvidia-cuda-runtime-cu13 is installed", 0),
    "both installed": ("npu", "no accelerator found; package torch_npu is installed", 0),
    "cuda image env": ("gpu", "no accelerator found; NVIDIA_VISIBLE_DEVICES is set (CUDA image)", 0),
    "void cuda env": ("gpu", "no accelerator found; planned for gpu (set DEVICE=npu for Ascend)", 0),
    "none cuda env": ("gpu", "no accelerator found; planned for gpu (set DEVICE=npu for Ascend)", 0),
    "nothing": ("gpu", "no accelerator found; planned for gpu (set DEVICE=npu for Ascend)", 0),
}  # fmt: skip


@pytest.mark.parametrize("evidence", sorted(_EVIDENCE))
def test_auto_takes_the_strongest_evidence_and_says_which(tmp_path: Path, evidence: str) -> None:
    """Device nodes, then driver files, then installed packages, then a CUDA image's variable; npu first at each."""
    files, installed, environ = _EVIDENCE[evidence]
    found = detect_device("auto", root=_machine(tmp_path, *files), environ=environ, package_installed=installed.__contains__)
    name, reason, visible = _SHOWN[evidence]
    assert (found.name, found.source, found.reason, found.visible_devices) == (name, "auto", reason, visible)
    assert found.to_dict() == {"name": found.name, "source": "auto", "reason": found.reason, "visible_devices": found.visible_devices}


@pytest.mark.parametrize("device", ["gpu", "npu"])
def test_a_set_device_says_so_and_counts_its_own_nodes(tmp_path: Path, device: str) -> None:
    root = _machine(tmp_path, "dev/nvidia0", "dev/davinci0", "dev/davinci1")
    found = detect_device(device, root=root, package_installed=_nothing_installed)
    assert (found.name, found.source, found.reason, found.visible_devices) == (
        device, "setting", f"DEVICE={device} was set", 1 if device == "gpu" else 2
    )


def test_a_missing_dev_folder_counts_no_node(tmp_path: Path) -> None:
    assert count_device_nodes("gpu", tmp_path / "nowhere") == 0
