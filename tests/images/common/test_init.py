"""tini is PID 1 and the entrypoint is the recipe's CLI with `run` as default command."""

from __future__ import annotations

from typing import Any

from conftest import Image


def test_pid1_is_tini(host: Any) -> None:
    # /proc rather than ps: a minimal base has no procps.
    assert host.file("/proc/1/comm").content_string.strip() == "tini"


def test_entrypoint_starts_with_tini(image: Image) -> None:
    assert image.config["Entrypoint"][:2] == ["tini", "--"]


def test_entrypoint_runs_the_recipe_cli(image: Image) -> None:
    assert image.config["Entrypoint"][2:] == ["python3", "/opt/recipe/entrypoint.py"]


def test_default_command_is_run(image: Image) -> None:
    assert image.config["Cmd"] == ["run"]


def test_tini_is_on_path(host: Any) -> None:
    assert host.exists("tini")
