"""Shared fixtures for the unit tests, CI's rule that a skip here is a failure (tests/support/skip_policy.py), and
pytest's end after the Ray tests (tests/support/process_end.py)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.skip_policy import pytest_make_collect_report, pytest_runtest_makereport  # noqa: F401
from tests.support.process_end import pytest_sessionstart, pytest_unconfigure  # noqa: F401  (Ray's threads at exit)
import tests.support.hypothesis_profile  # noqa: F401  (no deadline: a verdict never depends on the clock)

from .envtools import clear_settings
from .raytools import ray_env, short_tmp  # noqa: F401  (fixtures of the Ray tests)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """No recipe setting or allocator variable set; tests set what they need with monkeypatch.setenv."""
    clear_settings(monkeypatch)
    yield monkeypatch


@pytest.fixture
def gpu_env(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """clean_env with DEVICE=gpu, CHECKPOINT_DIR under tmp_path (a refused command must leave it absent), and
    tmp_path as the working directory (no .env file)."""
    clean_env.setenv("DEVICE", "gpu")
    clean_env.setenv("CHECKPOINT_DIR", str(tmp_path / "checkpoints"))
    clean_env.chdir(tmp_path)
    return clean_env


@pytest.fixture
def model(tmp_path: Path) -> Path:
    """A model directory with a config.json (the smoke profile's tiny Qwen3.5-MoE; no weights needed)."""
    from recipe.smoke import shipped_model_dir

    directory = tmp_path / "model"
    directory.mkdir()
    shutil.copy(shipped_model_dir() / "config.json", directory / "config.json")
    return directory
