"""Each image's lock carries every distribution the trainer needs (no network, no engine).

A lock that misses one builds fine and dies at the first `docker compose up`: verl 0.9.1's
v1 TaskRunner imports transfer_queue before anything else, and TransferQueue sits only in
verl's verl-core extra. So the lock is checked against three sources of truth:
- verl's own declared verl-core requirements (the installed verl's metadata);
- the packages `run` checks for (recipe.run.preflight);
- the modules the trainer's start path imports, which nothing declares (recipe.run.preflight too).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from pathlib import Path

import pytest

from recipe.run.preflight import TRAINER_MODULES, TRAINER_SUPPORT_MODULES

DOCKER = Path(__file__).resolve().parents[2] / "docker"
DEVICES = ("gpu", "npu")

#: verl-core lists its own test tooling; a training image runs no pytest. These are the
#: only distributions an image may leave out, and each image's excludes.txt says so.
TEST_TOOLING = frozenset({"pytest", "pytest-asyncio", "pytest-rerunfailures"})
#: Per-image exceptions beyond test tooling, each explained in that image's excludes.txt.
IMAGE_EXCEPTIONS: dict[str, frozenset[str]] = {
    "gpu": frozenset(),
    # torchcodec (verl's video inputs only): no aarch64 wheel pairs with the npu image's torch 2.10.
    "npu": frozenset({"torchcodec"}),
}


def normalize(name: str) -> str:
    """PEP 503 name: `TransferQueue` and `transfer_queue` both become `transferqueue`/`transfer-queue`."""
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_distributions(text: str) -> set[str]:
    """Normalized names pinned by a uv/pip-compile lock (`name==version \\` lines)."""
    names = set()
    for line in text.splitlines():
        match = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==", line)
        if match:
            names.add(normalize(match.group(1)))
    return names


def image_distributions(device: str) -> set[str]:
    """Everything docker/<device>/ installs from a lock (wheels, sdists, vLLM's source pin)."""
    names: set[str] = set()
    for lock in sorted((DOCKER / device).glob("*.lock")):
        names |= lock_distributions(lock.read_text())
    return names


def verl_core_requirements() -> set[str]:
    """Normalized names of the installed verl's `verl-core` extra."""
    requires = importlib.metadata.requires("verl") or []
    names = set()
    for requirement in requires:
        name, _, marker = requirement.partition(";")
        if re.search(r"""extra\s*==\s*["']verl-core["']""", marker):
            names.add(normalize(re.split(r"[\s<>=!~\[(]", name.strip(), maxsplit=1)[0]))
    return names


def required_distributions(device: str) -> set[str]:
    """What the image for DEVICE must carry, before its documented exclusions."""
    run_checks = {*TRAINER_MODULES[device].values(), *TRAINER_SUPPORT_MODULES.values()}
    return verl_core_requirements() | {normalize(name) for name in run_checks}


def missing_from(device: str, locked: set[str]) -> set[str]:
    """Required distributions absent from LOCKED, minus the documented exclusions."""
    return required_distributions(device) - locked - TEST_TOOLING - IMAGE_EXCEPTIONS[device]


def excluded_in(device: str) -> set[str]:
    """Names listed (uncommented) in docker/<device>/excludes.txt."""
    path = DOCKER / device / "excludes.txt"
    return {normalize(line.strip()) for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")}


@pytest.fixture(scope="module", autouse=True)
def _verl_metadata() -> None:
    # The source of truth is the installed verl's metadata: without it this file checks nothing.
    if importlib.util.find_spec("verl") is None:
        pytest.fail("verl is not installed: pip install -e '.[trainer]' (the lock check reads its metadata)")


def test_verl_core_is_what_verl_0_9_1_declares() -> None:
    # Guards the parser: these are the distributions the images once lacked.
    assert {"transferqueue", "mathruler", "torchcodec", "qwen-vl-utils"} <= verl_core_requirements()


@pytest.mark.parametrize("device", DEVICES)
def test_lock_carries_every_distribution_the_trainer_needs(device: str) -> None:
    assert missing_from(device, image_distributions(device)) == set()


@pytest.mark.parametrize("device", DEVICES)
def test_lock_without_transferqueue_is_caught(device: str) -> None:
    text = "\n".join((DOCKER / device / "requirements.lock").read_text().splitlines())
    broken = re.sub(r"(?im)^transferqueue==.*$", "", text)
    assert broken != text
    assert missing_from(device, lock_distributions(broken)) == {"transferqueue"}


@pytest.mark.parametrize("device", DEVICES)
def test_lock_without_a_run_check_package_is_caught(device: str) -> None:
    locked = image_distributions(device) - {"megatron-energon"}
    assert missing_from(device, locked) == {"megatron-energon"}


@pytest.mark.parametrize("device", DEVICES)
def test_exclusions_are_exactly_the_documented_ones(device: str) -> None:
    # An exclusion of something the trainer needs must be one of the documented exceptions.
    needed_but_excluded = excluded_in(device) & required_distributions(device)
    assert needed_but_excluded == TEST_TOOLING | IMAGE_EXCEPTIONS[device]


def test_normalize_matches_module_and_distribution_spellings() -> None:
    assert normalize("TransferQueue") == normalize("transferqueue")
    assert normalize("qwen_vl_utils") == normalize("qwen-vl-utils") == normalize("Qwen.VL_utils")
