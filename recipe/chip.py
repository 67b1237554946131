"""Which Ascend chip an npu image is built for, which one this node has, and whether they match.

The one spelling of each chip is CANN's image tag, which is also the image's CANN_CHIP build
argument and its `io.grpo-recipe.cann.chip` label: `a3` (Atlas A3, 910C: 8 cards of 2 dies, 16
logical NPUs) and `910b` (Atlas A2: 8 NPUs).

vllm-ascend decides the same question at start, and refuses a mismatch only then, after the
model is loaded (vllm_ascend/utils.py of 0.23.0, check_ascend_device_type, called from its
NPU worker's constructor): the type it was built for is `__device_type__` in its generated
`_build_info.py` (setup.py's gen_build_info, from SOC_VERSION), and the node's comes from
`torch_npu.npu.get_soc_version()`: 220-225 are A2 (910B1-4), 250-255 A3 (910_93xx). This
module reads the same two facts, without importing vllm_ascend, so that `doctor` and `run`
refuse before anything heavy starts.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Literal

from recipe.numbers import NumberRefused, whole_number
from recipe.read_back import FileRefused, read_prefix

Chip = Literal["a3", "910b"]
#: What an image's chip is when nothing says otherwise: the Dockerfile's default CANN_CHIP.
DEFAULT_CHIP: Chip = "a3"
#: The image label (and labels.d line) that names the chip the image was built for.
CHIP_LABEL = "io.grpo-recipe.cann.chip"


@dataclass(frozen=True)
class ChipFacts:
    """What the recipe needs to know of one chip."""

    #: Logical NPUs per node (NDEVICES_PER_NODE's default).
    devices_per_node: int
    #: vllm-ascend's name of it (`__device_type__`, AscendDeviceType).
    device_type: str
    #: torch_npu.npu.get_soc_version() values of it (vllm_ascend/utils.py check_ascend_device_type).
    soc_versions: range
    #: What an owner calls the machine.
    product: str
    #: HBM of one logical NPU, GiB (an A3 card's 128 GB is two dies of 64; Atlas 800T A2's 910B has 64).
    memory_gib: int


CHIPS: dict[Chip, ChipFacts] = {
    "a3": ChipFacts(16, "A3", range(250, 256), "Atlas A3, 910C", 64),
    "910b": ChipFacts(8, "A2", range(220, 226), "Atlas A2, 910B", 64),
}


def chip_of_device_type(device_type: str | None) -> Chip | None:
    """The chip vllm-ascend calls `device_type` (A2, A3); None for another (310P, A5) or none."""
    return next((chip for chip, facts in CHIPS.items() if facts.device_type == device_type), None)


def chip_of_soc_version(soc_version: int | None) -> Chip | None:
    """The chip of a torch_npu soc_version number; None when it is neither chip's."""
    if soc_version is None:
        return None
    return next((chip for chip, facts in CHIPS.items() if soc_version in facts.soc_versions), None)


def built_device_type(package_dir: Path | None = None) -> str | None:
    """`__device_type__` of the installed vllm-ascend's `_build_info.py`, read as text; None without one."""
    if package_dir is None:
        try:
            spec = find_spec("vllm_ascend")
        except (ImportError, ValueError):
            return None
        locations = list(spec.submodule_search_locations or []) if spec else []
        if not locations:
            return None
        package_dir = Path(locations[0])
    try:
        # Only its head is parsed (setup.py writes a few lines): a file of any size, or no regular file, is
        # read no further, and a FIFO never blocks (recipe.read_back).
        source = read_prefix(package_dir / "_build_info.py", 4 * BUILD_INFO_CHARS).decode("utf-8", "replace")
        tree = ast.parse(source[:BUILD_INFO_CHARS])
    except (FileRefused, SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(target, ast.Name) and target.id == "__device_type__" for target in node.targets)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            return node.value.value
    return None


def mismatch(built_type: str | None, soc_version: int | None, soc_source: str) -> str | None:
    """One line when this node's NPUs are not the chip the image's vllm-ascend was built for; None otherwise.

    Unknown on either side (no vllm-ascend, no NPU answered, a chip the recipe does not
    target) is not a mismatch: the check cannot tell, and says nothing.
    """
    built, found = chip_of_device_type(built_type), chip_of_soc_version(soc_version)
    if built is None or found is None or built == found:
        return None
    return (
        f"CANN_CHIP: this node's NPUs are {found} ({CHIPS[found].product}; {soc_source} says soc_version "
        f"{soc_version}), but this image's vllm-ascend is built for {built} ({CHIPS[built].product}; its "
        f"_build_info.py says {built_type}) and would refuse them when vLLM starts; rebuild the image with "
        f"CANN_CHIP={found} (docker compose build --build-arg CANN_CHIP={found} npu)"
    )


def assumed_chip(labels: dict[str, str] | None, setting: Chip | None = None) -> tuple[Chip, str]:
    """(the chip `plan` assumes on npu, why): the image's label, else the CANN_CHIP setting, else the default.

    The label is a fact about the image (what its vllm-ascend was built for), so it wins; a
    CANN_CHIP that contradicts it is chip_setting_problem's refusal. Outside an image (a laptop
    planning for a node it has not rented yet) CANN_CHIP is all there is to go by.
    """
    label = (labels or {}).get(CHIP_LABEL)
    if label in CHIPS:
        return label, f"the image's label {CHIP_LABEL}={label}"  # type: ignore[return-value]
    if setting is not None:
        where = "not in an image" if labels is None else f"the image has no {CHIP_LABEL} label"
        return setting, f"CANN_CHIP={setting}, {where}"
    if label:
        return DEFAULT_CHIP, f"the image's label {CHIP_LABEL}={label!r} names no chip the recipe knows; default {DEFAULT_CHIP}"
    where = "not in an image" if labels is None else f"the image has no {CHIP_LABEL} label"
    other = next(chip for chip in CHIPS if chip != DEFAULT_CHIP)
    return DEFAULT_CHIP, (
        f"{where}: the Dockerfile's default CANN_CHIP={DEFAULT_CHIP}; for an {CHIPS[other].product} node set CANN_CHIP={other}"
    )


def chip_setting_problem(labels: dict[str, str] | None, setting: Chip | None) -> str | None:
    """Why CANN_CHIP cannot be planned for in this image: its label names the other chip (None when it may)."""
    label = (labels or {}).get(CHIP_LABEL)
    if setting is None or label not in CHIPS or label == setting:
        return None
    return (
        f"CANN_CHIP={setting}: this image is built for {label} ({CHIPS[label].product}; its label {CHIP_LABEL}), "
        f"and its vllm-ascend would refuse {setting} NPUs; unset CANN_CHIP, or rebuild the image with "
        f"CANN_CHIP={setting} (docker compose build npu)"
    )


#: torch_npu's soc_version numbers are three digits; past this the answer is no soc_version.
MAX_SOC_VERSION = 10**6
#: How much of vllm-ascend's _build_info.py is parsed (characters).
BUILD_INFO_CHARS = 65536
#: Run in a fresh interpreter: what torch_npu says this node's NPU is (vllm-ascend's own source of the fact).
SOC_VERSION_PROBE = "import torch_npu; print(int(torch_npu.npu.get_soc_version()))"
#: How long the probe may take: importing torch_npu loads CANN's libraries (seconds).
SOC_VERSION_TIMEOUT_S = 120.0


def node_soc_version(python: str = sys.executable, timeout_s: float = SOC_VERSION_TIMEOUT_S) -> int | None:
    """torch_npu's soc_version of this node's NPU 0, asked in a child process; None when it cannot say."""
    try:
        done = subprocess.run(
            # errors= makes it text, as text=True would, with bytes other than UTF-8 (CANN's chatter) replaced.
            [python, "-c", SOC_VERSION_PROBE], capture_output=True, errors="replace", timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = done.stdout.strip().splitlines()
    # Plain ASCII digits only, as torch_npu prints them (not isdigit(): it takes '²', which int() refuses).
    if done.returncode != 0 or not lines or not (lines[-1].isascii() and lines[-1].isdecimal()):
        return None
    try:  # a number of 5,000 digits, or '²', is no soc_version: never int()'s ValueError
        return whole_number(lines[-1], 0, MAX_SOC_VERSION, "soc_version")
    except NumberRefused:
        return None


def chip_problem(soc_version: int | None = None, built_type: str | None = None) -> str | None:
    """The mismatch line for this node and the installed vllm-ascend (each fact asked for when not given)."""
    built_type = built_type if built_type is not None else built_device_type()
    if chip_of_device_type(built_type) is None:
        return None  # no vllm-ascend (not an npu image), or built for a chip the recipe does not target
    soc_version = soc_version if soc_version is not None else node_soc_version()
    return mismatch(built_type, soc_version, "torch_npu.npu.get_soc_version()")
