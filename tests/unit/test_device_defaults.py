"""DEVICE=auto's defaults: the installed-package check it uses unless told otherwise, and no environment at all."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pytest

from recipe import device
from recipe.device import detect_device


def _bare(root: Path) -> Path:
    (root / "dev").mkdir()
    return root


@pytest.mark.parametrize("name", ["pytest", "PyTest", "no-such-distribution-grpo-recipe"])
def test_the_default_package_check_is_installed_metadata(name: str) -> None:
    try:
        metadata.distribution(name)
        installed = True
    except metadata.PackageNotFoundError:
        installed = False
    assert device._package_installed(name) is installed
    assert installed is (name.lower() == "pytest")


def test_auto_on_a_bare_machine_asks_the_installed_packages_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a `package_installed`, an npu image (torch_npu's metadata installed) is recognised on a bare machine."""
    asked: list[str] = []

    def distribution(name: str) -> object:
        asked.append(name)
        if name == "torch_npu":
            return object()
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(device.metadata, "distribution", distribution)
    found = detect_device("auto", root=_bare(tmp_path), environ={})
    assert (found.name, found.reason) == ("npu", "no accelerator found; package torch_npu is installed")
    assert asked == ["torch_npu"]


def test_without_an_environment_auto_reads_none(tmp_path: Path) -> None:
    """`environ` left out is an empty environment (the caller passes os.environ when it means it)."""
    found = detect_device("auto", root=_bare(tmp_path), package_installed=lambda name: False)
    assert (found.name, found.reason, found.visible_devices) == (
        "gpu", "no accelerator found; planned for gpu (set DEVICE=npu for Ascend)", 0
    )
