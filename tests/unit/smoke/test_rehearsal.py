"""The trainer rehearsal (tests/rehearsal.py) in the CPU test venv: what a missing TransferQueue does.

verl's real `python -m verl.trainer.main_ppo`, with the smoke plan's own argv, under a Ray
head of the rehearsal's own. The whole start path runs twice elsewhere, so not here again:
tests/images/gpu/test_rehearsal.py rehearses it in the gpu image up to the first device use,
and the CPU e2e (tests/e2e) runs the same plan's trainer through every stage and trains.
This run, with TransferQueue hidden, takes about 30 s on 2 cores.
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

from ...rehearsal import rehearse  # noqa: E402

pytestmark = pytest.mark.verl

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
