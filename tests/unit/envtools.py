"""Test helpers: a clean environment so the machine's own variables never leak into a test."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from recipe.settings import Settings

REPO = Path(__file__).resolve().parents[2]
ALLOC_VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_NPU_ALLOC_CONF")
#: The limit on a subprocess or a thread that should end by itself: it stops a hang, it never
#: judges speed, so it is far above any loaded machine's time (issue 13: a tight one flaked).
HANG_GUARD_S = 600


def clear_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Remove every recipe setting and allocator variable from the environment."""
    names = {name.upper() for name in Settings.model_fields} | set(ALLOC_VARIABLES)
    for key in list(os.environ):
        if key.upper() in names:
            monkeypatch.delenv(key)


def settings_of(**values: object) -> Settings:
    """Settings from these values alone (names as in the environment, any case), not from os.environ."""
    return Settings.model_validate({k.lower(): v for k, v in values.items()})


def entrypoint_env(**settings: str) -> dict[str, str]:
    """A subprocess environment with only the given recipe settings (and what Python needs)."""
    names = {name.upper() for name in Settings.model_fields} | set(ALLOC_VARIABLES)
    env = {k: v for k, v in os.environ.items() if k.upper() not in names}
    env.update(settings)
    return env


ENTRYPOINT = [sys.executable, str(REPO / "entrypoint.py")]
