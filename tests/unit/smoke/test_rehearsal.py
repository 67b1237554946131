"""The trainer rehearsal (tests/rehearsal.py) in the CPU test venv.

verl's real `python -m verl.trainer.main_ppo`, with the smoke plan's own argv, under a Ray
head of the rehearsal's own with one GPU declared, on a machine without any: it must get
through every stage that needs no device and stop at the first device use, named.

On CPU torch that first use is the actor's process group: verl asks for
`cpu:gloo,cuda:nccl` (verl/utils/distributed.py:initialize_global_process_group_ray, the
first call of TrainingWorker.__init__ inside ActorRolloutRefWorker.init_model), and CPU
torch has no NCCL. The reward set-up is never reached without a device, on CPU or in an
image: verl 0.9.1's V1 trainer builds its RewardLoopManager after init_model (see the
`reward` stage in tests/rehearsal.py).

The full run takes about 2 minutes on 2 cores (TransferQueue starts 9 Ray actors, each a
Python process), the one with TransferQueue hidden about 30 s; more on a loaded machine.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from recipe.smoke import SmokeAssets
from recipe.smoke.profile import SMOKE_ASSETS_DIRNAME
from tests.support.needs import TRAINER_EXTRA, needs

# Skips only when verl is not installed (find_spec); an installed verl that fails to import
# (a missing dependency of its own) is this module's error, with its message.
needs("verl", install=TRAINER_EXTRA)

from ...rehearsal import STAGES, Result, rehearse  # noqa: E402

pytestmark = pytest.mark.verl

#: Stages reached before the first device use (the CPU venv reaches all of them).
BEFORE_DEVICE = [stage.name for stage in STAGES if stage.before_device]


@pytest.fixture(scope="module")
def short_tmp(built: SmokeAssets) -> Iterator[Path]:
    """A short work dir (Ray's unix socket paths under it must stay below 107 bytes).

    Its ck/ is the CHECKPOINT_DIR of both runs, holding the session's smoke build where the
    plan puts it: prepare_smoke_assets reuses a build whose manifest matches.
    """
    path = Path(tempfile.mkdtemp(prefix="rh-", dir="/tmp"))
    (path / "ck").mkdir()
    (path / "ck" / SMOKE_ASSETS_DIRNAME).symlink_to(built.root, target_is_directory=True)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def rehearsal(short_tmp: Path) -> Result:
    """One full rehearsal for the module."""
    return rehearse(short_tmp / "full", timeout_s=600, checkpoint_dir=short_tmp / "ck")


def test_every_stage_before_the_device_is_reached(rehearsal: Result) -> None:
    assert rehearsal.setup_error is None
    assert rehearsal.expected == BEFORE_DEVICE
    assert rehearsal.reached == BEFORE_DEVICE, rehearsal.to_json()
    assert not rehearsal.timed_out


def test_it_stops_at_the_first_device_use_named(rehearsal: Result) -> None:
    failure = rehearsal.failure
    assert failure is not None, rehearsal.to_json()
    assert (failure.type, failure.message) == ("RuntimeError", "Distributed package doesn't have NCCL built in")
    assert failure.device_use == "torch without NCCL (CPU build)"
    assert failure.raised_in == "verl/utils/distributed.py:initialize_global_process_group_ray"
    assert rehearsal.stopped_at_device
    assert rehearsal.exit_code == 1


def test_the_processor_is_built_or_missing_only_torchvision(rehearsal: Result) -> None:
    # verl goes on text-only without a processor. This venv has no torchvision (the trainer
    # extra leaves it out; the images have it), which the Qwen3-VL video processor needs.
    assert rehearsal.processor_error is None or "Torchvision" in rehearsal.processor_error


def test_it_names_a_missing_transferqueue(short_tmp: Path) -> None:
    """Without TransferQueue (not in `pip install verl`) the trainer dies at TaskRunner start.

    Hidden here by a package of that name that raises exactly what a missing one raises,
    ahead of the installed one on PYTHONPATH (Ray's workers inherit it).
    """
    shim = short_tmp / "hide-tq" / "transfer_queue"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'transfer_queue'\", name='transfer_queue')\n", encoding="utf-8"
    )
    environ = {**os.environ, "PYTHONPATH": str(shim.parent)}
    result = rehearse(short_tmp / "no-tq", timeout_s=300, environ=environ, checkpoint_dir=short_tmp / "ck")
    assert result.reached == ["config", "ray"], result.to_json()
    assert result.failure is not None
    assert (result.failure.type, result.failure.message) == ("ModuleNotFoundError", "No module named 'transfer_queue'")
    assert result.failure.raised_in == "verl/trainer/main_ppo.py:run"  # TaskRunnerV1.run: `import transfer_queue as tq`
    assert result.failure.device_use is None and not result.stopped_at_device
