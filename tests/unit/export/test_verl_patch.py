"""verl_patch by direct calls: which verl it patches, how (once, on import or at once), what it says when it
cannot, and that the replacement writes transformer_config.json on rank 0 only."""

from __future__ import annotations

import json
import logging
import sys
import types
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from tests.support.needs import TRAINER_EXTRA, needs

from recipe import import_patch
from recipe.export import verl_patch


def _verl_module(with_method: bool = True, with_class: bool = True) -> types.ModuleType:
    """A stand-in for verl's checkpoint manager module, holding verl's own method or not."""
    module = types.ModuleType(verl_patch.TARGET_MODULE)
    if with_class:
        def original(self: Any, local_path: str) -> None:
            """verl's own writer."""

        attributes = {"_save_transformer_config": original} if with_method else {}
        module.MegatronCheckpointManager = type("MegatronCheckpointManager", (), attributes)  # type: ignore[attr-defined]
    return module


def test_the_method_is_replaced_once_keeping_verls_own(caplog: pytest.LogCaptureFixture) -> None:
    module = _verl_module()
    original = module.MegatronCheckpointManager._save_transformer_config
    with caplog.at_level(logging.INFO, logger="recipe.export.verl_patch"):
        assert verl_patch.patch_module(module) is True
        assert verl_patch.patch_module(module) is True  # a second worker hook run: already ours, nothing stacked
    patched = module.MegatronCheckpointManager._save_transformer_config
    assert patched is verl_patch._json_safe_save_transformer_config
    assert patched.__wrapped__ is original
    assert caplog.messages == ["verl's transformer_config.json is written by recipe.export.jsonsafe"]


@pytest.mark.parametrize(("with_class", "with_method"), [(False, False), (True, False)])
def test_a_verl_without_the_method_is_left_alone_and_named(
    caplog: pytest.LogCaptureFixture, with_class: bool, with_method: bool
) -> None:
    module = _verl_module(with_method=with_method, with_class=with_class)
    with caplog.at_level(logging.WARNING, logger="recipe.export.verl_patch"):
        assert verl_patch.patch_module(module) is False
    assert caplog.messages == [
        f"{verl_patch.TARGET_MODULE} has no MegatronCheckpointManager._save_transformer_config: "
        "transformer_config.json is left to verl"
    ]


@pytest.fixture
def clean_import_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """No verl checkpoint module loaded and no finder of ours, restored afterwards."""
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if not isinstance(f, import_patch.PatchOnImport)])
    monkeypatch.delitem(sys.modules, verl_patch.TARGET_MODULE, raising=False)


def _version(installed: str | None) -> Any:
    def version(name: str) -> str:
        # Only verl's own distribution has this version (looked up case-insensitively, as importlib does).
        if installed is None or name.lower() != "verl":
            raise metadata.PackageNotFoundError(name)
        return installed

    return version


def test_without_verl_nothing_is_installed(monkeypatch: pytest.MonkeyPatch, clean_import_state: None) -> None:
    monkeypatch.setattr(import_patch.metadata, "version", _version(None))
    assert verl_patch.install() is False
    assert not any(isinstance(f, import_patch.PatchOnImport) for f in sys.meta_path)


def test_another_verl_version_is_named_and_left_alone(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, clean_import_state: None
) -> None:
    monkeypatch.setattr(import_patch.metadata, "version", _version("0.10.0"))
    with caplog.at_level(logging.WARNING, logger="recipe.import_patch"):
        assert verl_patch.install(("0.9.1", "0.9.2")) is False
    assert caplog.messages == ["verl 0.10.0: transformer_config.json guard not installed (checked against verl 0.9.1, 0.9.2 only)"]
    assert not any(isinstance(f, import_patch.PatchOnImport) for f in sys.meta_path)
    assert verl_patch.VERIFIED_VERL_VERSIONS == ("0.9.1",)


def test_a_loaded_verl_is_patched_at_once(monkeypatch: pytest.MonkeyPatch, clean_import_state: None) -> None:
    monkeypatch.setattr(import_patch.metadata, "version", _version("0.9.1"))
    module = _verl_module()
    monkeypatch.setitem(sys.modules, verl_patch.TARGET_MODULE, module)
    assert verl_patch.install() is True
    assert module.MegatronCheckpointManager._save_transformer_config is verl_patch._json_safe_save_transformer_config
    assert not any(isinstance(f, import_patch.PatchOnImport) for f in sys.meta_path)
    # A loaded verl whose class lacks the method: install says so through its result.
    monkeypatch.setitem(sys.modules, verl_patch.TARGET_MODULE, _verl_module(with_method=False))
    assert verl_patch.install() is False


def test_a_verl_not_loaded_yet_is_patched_when_imported(
    monkeypatch: pytest.MonkeyPatch, clean_import_state: None, tmp_path: Path
) -> None:
    monkeypatch.setattr(import_patch.metadata, "version", _version("0.9.1"))
    assert verl_patch.install() is True
    assert verl_patch.install() is True  # the hook runs in every worker task's process once; one finder
    finders = [f for f in sys.meta_path if isinstance(f, import_patch.PatchOnImport)]
    assert len(finders) == 1 and sys.meta_path[0] is finders[0]  # first, before the finder that would load it
    # The module's file, found where its package says (here a folder of ours): loaded, then patched.
    (tmp_path / "megatron_checkpoint_manager.py").write_text(
        "class MegatronCheckpointManager:\n    def _save_transformer_config(self, local_path):\n        pass\n"
    )
    spec = finders[0].find_spec(verl_patch.TARGET_MODULE, [str(tmp_path)])
    assert spec is not None and spec.loader is not None
    module = types.ModuleType(verl_patch.TARGET_MODULE)
    spec.loader.exec_module(module)
    assert module.MegatronCheckpointManager._save_transformer_config is verl_patch._json_safe_save_transformer_config
    # Other modules, and a target that is not on the given path, are left to the other finders.
    assert finders[0].find_spec("verl.utils.other", [str(tmp_path)]) is None
    assert finders[0].find_spec(verl_patch.TARGET_MODULE, [str(tmp_path / "absent")]) is None


def test_rank_0_writes_every_field_and_other_ranks_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    needs("verl", install=TRAINER_EXTRA)

    class Manager:
        def __init__(self, rank: int) -> None:
            self.rank = rank
            self.transformer_config = {"hidden_size": 8, "init": object()}  # a value JSON cannot hold: a string, noted

    verl_patch._json_safe_save_transformer_config(Manager(1), str(tmp_path))
    assert list(tmp_path.iterdir()) == []
    with caplog.at_level(logging.WARNING):
        verl_patch._json_safe_save_transformer_config(Manager(0), str(tmp_path))
    written = tmp_path / "transformer_config.json"
    assert json.loads(written.read_text()) == {"hidden_size": 8, "init": "<object object>"}
    assert f"{written}: 1 value(s) written as strings (see warnings above)" in caplog.messages
