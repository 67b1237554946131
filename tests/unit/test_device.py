"""DEVICE=auto detection from device nodes, driver files and package metadata: never by importing torch."""

from __future__ import annotations

from pathlib import Path

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
