"""Caches, checkpoints and home are where the recipe expects them, and writable by its user."""

from __future__ import annotations

from typing import Any

import pytest

from conftest import Image


@pytest.mark.parametrize("folder", ["/cache/huggingface", "/checkpoints", "/home/recipe"])
def test_folder_is_writable_by_the_user(host: Any, folder: str) -> None:
    probe = f"{folder}/.write-probe"
    assert host.run("touch %s && rm %s", probe, probe).rc == 0


@pytest.mark.parametrize("folder", ["/models", "/data", "/checkpoints", "/cache/huggingface"])
def test_volume_declared(image: Image, folder: str) -> None:
    assert folder in (image.config.get("Volumes") or {})


def test_hf_home_is_the_cache_folder(image: Image) -> None:
    assert image.env.get("HF_HOME") == "/cache/huggingface"


def test_python_is_the_framework_venv(host: Any) -> None:
    assert host.check_output("command -v python3") == "/opt/venv/bin/python3"
