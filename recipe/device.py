"""Which accelerator this machine has, found without importing torch or torch_npu.

Upstream's script runs `python -c 'import torch_npu'` to decide, which costs
seconds and says nothing about why. Here the evidence is, in order of weight:
device nodes under /dev, driver files, then installed-package metadata (an image
built for one target, started on a machine without its devices).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Callable, Literal, Mapping

Device = Literal["gpu", "npu"]

#: GPUs per node when NDEVICES_PER_NODE is unset; on npu the chip decides (recipe.chip.CHIPS:
#: 16 on a3, 8 cards of 2 dies; 8 on 910b).
DEFAULT_GPUS_PER_NODE = 8

_NVIDIA_NODE = re.compile(r"^nvidia(\d+)$")
_DAVINCI_NODE = re.compile(r"^davinci(\d+)$")

_NPU_DRIVER_FILES = ("usr/local/Ascend/driver/version.info", "usr/local/bin/npu-smi")
_GPU_DRIVER_FILES = ("proc/driver/nvidia/version",)
# Packages that only an image for that target carries.
_NPU_PACKAGES = ("torch_npu", "vllm_ascend", "vllm-ascend")
_GPU_PACKAGES = ("nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime", "nvidia-cuda-runtime-cu13")


@dataclass(frozen=True)
class DeviceDetection:
    """The device a run targets, and why."""

    name: Device
    source: Literal["setting", "auto"]
    reason: str
    #: Accelerator device nodes visible now (0 when none: `plan` works, `run` refuses).
    visible_devices: int

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form for `plan --json`."""
        return {
            "name": self.name,
            "source": self.source,
            "reason": self.reason,
            "visible_devices": self.visible_devices,
        }


def _package_installed(name: str) -> bool:
    try:
        metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return False
    return True


def count_device_nodes(device: Device, root: Path = Path("/")) -> int:
    """Number of accelerator nodes of `device` under root/dev (/dev/nvidiaN or /dev/davinciN)."""
    pattern = _NVIDIA_NODE if device == "gpu" else _DAVINCI_NODE
    dev = root / "dev"
    try:
        return sum(1 for entry in dev.iterdir() if pattern.match(entry.name))
    except OSError:
        return 0


def detect_device(
    choice: Literal["auto", "gpu", "npu"],
    root: Path = Path("/"),
    environ: Mapping[str, str] | None = None,
    package_installed: Callable[[str], bool] = _package_installed,
) -> DeviceDetection:
    """Resolve DEVICE. An explicit gpu/npu is kept as given; `auto` looks at the machine.

    With no evidence at all, auto plans for gpu and says so: `plan` works anywhere.
    """
    environ = {} if environ is None else environ
    if choice != "auto":
        return DeviceDetection(choice, "setting", f"DEVICE={choice} was set", count_device_nodes(choice, root))

    gpus, npus = count_device_nodes("gpu", root), count_device_nodes("npu", root)
    if npus and not gpus:
        return DeviceDetection("npu", "auto", f"{npus} Ascend device node(s) /dev/davinciN found", npus)
    if gpus and not npus:
        return DeviceDetection("gpu", "auto", f"{gpus} NVIDIA device node(s) /dev/nvidiaN found", gpus)
    if gpus and npus:
        # Both kinds on one machine is unusual enough that guessing would hide a mistake.
        return DeviceDetection(
            "gpu", "auto", f"both NVIDIA ({gpus}) and Ascend ({npus}) device nodes found; chose gpu, set DEVICE", gpus
        )

    for relative in _NPU_DRIVER_FILES:
        if (root / relative).exists():
            return DeviceDetection("npu", "auto", f"Ascend driver file /{relative} found, but no /dev/davinciN", 0)
    for relative in _GPU_DRIVER_FILES:
        if (root / relative).exists():
            return DeviceDetection("gpu", "auto", f"NVIDIA driver file /{relative} found, but no /dev/nvidiaN", 0)

    for package in _NPU_PACKAGES:
        if package_installed(package):
            return DeviceDetection("npu", "auto", f"no accelerator found; package {package} is installed", 0)
    for package in _GPU_PACKAGES:
        if package_installed(package):
            return DeviceDetection("gpu", "auto", f"no accelerator found; package {package} is installed", 0)
    if environ.get("NVIDIA_VISIBLE_DEVICES", "") not in {"", "void", "none"}:
        # CUDA base images set this; without device nodes it only tells which image we are in.
        return DeviceDetection("gpu", "auto", "no accelerator found; NVIDIA_VISIBLE_DEVICES is set (CUDA image)", 0)
    return DeviceDetection("gpu", "auto", "no accelerator found; planned for gpu (set DEVICE=npu for Ascend)", 0)
