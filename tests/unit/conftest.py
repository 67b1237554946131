"""Shared fixtures for the unit tests."""

from __future__ import annotations

from typing import Iterator

import pytest

from .envtools import clear_settings


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """No recipe setting or allocator variable set; tests set what they need with monkeypatch.setenv."""
    clear_settings(monkeypatch)
    yield monkeypatch
