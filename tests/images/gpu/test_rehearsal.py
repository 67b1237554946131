"""The trainer's start path in the gpu image, without a GPU (tests/rehearsal.py).

verl's real `python -m verl.trainer.main_ppo` runs in the image with the recipe's own
PROFILE=smoke argv, under a local Ray that declares one GPU. It must get through every
stage that needs no device (config, Ray, TransferQueue, dataset and processor, resource
pool, worker groups) and stop only at the first device use, with that failure named.
This is what a missing TransferQueue, mathruler or megatron-energon in the lock breaks.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from conftest import DOCKER, Image

REHEARSAL = Path(__file__).resolve().parents[2] / "rehearsal.py"
#: The trainer's own time limit inside the container, and ours around the container.
TRAINER_TIMEOUT_S = 900
CONTAINER_TIMEOUT_S = TRAINER_TIMEOUT_S + 300
#: The stages verl 0.9.1 reaches before its first device use (tests/rehearsal.py STAGES).
BEFORE_DEVICE = ("config", "ray", "transfer_queue", "dataset", "resource_pool", "worker_group")


@pytest.fixture(scope="module")
def rehearsal(image: Image) -> dict[str, Any]:
    """Run the rehearsal once in a fresh container of the image, as its own user."""
    with REHEARSAL.open("rb") as script:
        done = subprocess.run(
            # Ray's object store wants more than Docker's default 64 MB of /dev/shm.
            [DOCKER, "run", "--rm", "-i", "--shm-size=2g", "--entrypoint", "python3", image.ref,
             "-", "--timeout", str(TRAINER_TIMEOUT_S)],
            stdin=script, capture_output=True, timeout=CONTAINER_TIMEOUT_S, check=False,
        )  # fmt: skip
    stdout = done.stdout.decode(errors="replace")
    try:
        result: dict[str, Any] = json.loads(stdout[stdout.index("{") :])
    except ValueError:
        pytest.fail(f"rehearsal printed no JSON (exit {done.returncode}):\n{done.stderr.decode(errors='replace')[-4000:]}")
    return result


@pytest.mark.framework
@pytest.mark.parametrize("stage", BEFORE_DEVICE)
def test_rehearsal_reaches_stage(rehearsal: dict[str, Any], stage: str) -> None:
    assert stage in rehearsal["reached"], rehearsal.get("failure") or rehearsal.get("setup_error")


@pytest.mark.framework
def test_rehearsal_builds_the_processor(rehearsal: dict[str, Any]) -> None:
    # verl carries on text-only when it cannot build the VLM's processor: here it must build it.
    assert rehearsal["processor_error"] is None


@pytest.mark.framework
def test_rehearsal_stops_at_the_first_device_use(rehearsal: dict[str, Any]) -> None:
    assert rehearsal["stopped_at_device"], rehearsal["failure"]


@pytest.mark.framework
def test_rehearsal_names_the_device_failure(rehearsal: dict[str, Any]) -> None:
    failure = rehearsal["failure"]
    assert failure is not None and failure["device_use"] == "no GPU for NCCL", failure


@pytest.mark.framework
def test_rehearsal_fails_in_verls_process_group_set_up(rehearsal: dict[str, Any]) -> None:
    assert rehearsal["failure"]["raised_in"].startswith("verl/utils/distributed.py:"), rehearsal["failure"]
