"""The export's own decisions, before and around Megatron-Bridge: which checkpoint it exports, what it refuses
(one line each, nothing written), which MODEL_PATH files it copies, and the one-process world it sets up and
tears down (real torch.distributed on gloo and megatron-core's parallel state; no Megatron-Bridge needed).

Megatron-Bridge itself (Python >= 3.12) is replaced by small stand-ins where a step only hands values to it;
the real export runs in tests/bridge.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest

from recipe.export import bridge_export
from recipe.export.bridge_export import (
    ExportError,
    _copy_non_weights,
    _forget_leftover_groups,
    export_latest,
    latest_checkpoint,
)
from recipe.export.expected import ExportCheckError
from recipe.export.report import ExportReport


def step(root: Path, n: int, finished: bool = True, dist_ckpt: bool = True) -> Path:
    """A verl save global_step_<n>: its manifest (written last) when finished, megatron's metadata.json when dist_ckpt."""
    directory = root / f"global_step_{n}"
    (directory / "actor" / "model" / "dist_ckpt").mkdir(parents=True)
    if dist_ckpt:
        (directory / "actor" / "model" / "dist_ckpt" / "metadata.json").write_text(
            '{"sharded_backend": "torch_dist"}'
        )
    if finished:
        (directory / "actor" / "ckpt_contents.json").write_text("[]")
    return directory


def model(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text("{}")
    return root


def test_the_newest_finished_step_is_exported_by_number_not_by_name(
    tmp_path: Path,
) -> None:
    step(tmp_path, 9)
    newest = step(tmp_path, 10)
    step(tmp_path, 11, finished=False)  # verl is still writing it
    assert latest_checkpoint(tmp_path) == newest


@pytest.mark.parametrize(
    ("parents", "found"), [("", True), ("p/e", True), ("c/p/e", False)]
)
def test_checkpoints_are_looked_for_up_to_two_levels_below(
    tmp_path: Path, parents: str, found: bool
) -> None:
    saved = step(tmp_path / parents, 1)
    if found:
        assert latest_checkpoint(tmp_path) == saved
    else:
        with pytest.raises(ExportError):
            latest_checkpoint(tmp_path)


def test_no_finished_checkpoint_is_one_line_naming_where_and_what(
    tmp_path: Path,
) -> None:
    step(tmp_path, 1, finished=False)
    with pytest.raises(ExportError) as error:
        latest_checkpoint(tmp_path)
    assert (
        str(error.value)
        == f"{tmp_path}: no finished verl checkpoint (global_step_N/actor/ckpt_contents.json) found"
    )


def test_a_checkpoint_without_megatron_weights_points_at_verify_export(
    tmp_path: Path,
) -> None:
    saved = step(tmp_path / "ck", 3, dist_ckpt=False)
    with pytest.raises(ExportError) as error:
        export_latest(tmp_path / "ck", model(tmp_path / "m"), tmp_path / "out")
    assert str(error.value) == (
        f"{saved}: no Megatron model weights (actor/model/dist_ckpt); with use_dist_checkpointing off the HF export "
        f"verl wrote is the only copy of them: check it with `verify-export {saved / 'actor/model/huggingface'}`"
    )
    assert not (tmp_path / "out").exists()


def test_a_model_path_without_config_is_refused_naming_the_setting(
    tmp_path: Path,
) -> None:
    step(tmp_path / "ck", 1)
    (tmp_path / "m").mkdir()
    with pytest.raises(ExportError) as error:
        export_latest(tmp_path / "ck", tmp_path / "m", tmp_path / "out")
    assert (
        str(error.value) == f"MODEL_PATH={str(tmp_path / 'm')!r}: no config.json there"
    )


def test_a_non_empty_target_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    step(tmp_path / "ck", 1)
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.safetensors").write_text("older export")
    with pytest.raises(ExportError) as error:
        export_latest(tmp_path / "ck", model(tmp_path / "m"), out)
    assert (
        str(error.value) == f"{out}: not empty (an export never mixes with older files)"
    )
    assert [p.name for p in out.iterdir()] == ["old.safetensors"]


@pytest.mark.parametrize("out_exists", [False, True])
def test_without_megatron_bridge_the_export_is_one_line_saying_where_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, out_exists: bool
) -> None:
    # A missing or an empty target is fine: the refusal comes from the import, the next step.
    step(tmp_path / "ck", 1)
    if out_exists:
        (tmp_path / "out").mkdir()
    monkeypatch.setitem(
        sys.modules, "megatron.bridge", None
    )  # `import megatron.bridge` raises ImportError
    with pytest.raises(ExportError) as error:
        export_latest(tmp_path / "ck", model(tmp_path / "m"), tmp_path / "out")
    assert str(error.value) == (
        "Megatron-Bridge cannot be loaded here (ModuleNotFoundError: import of megatron.bridge halted; None in sys.modules); "
        "export runs in the image: docker compose run --rm gpu export --out DIR (or npu)"
    )
    assert error.value.__suppress_context__  # one line, not the import's traceback
    assert [p.name for p in tmp_path.joinpath("out").glob("*")] == []


@pytest.fixture
def fake_bridge(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """megatron.bridge importable (an empty AutoBridge), and the world and the write recorded instead of run."""
    calls: list[tuple[Any, ...]] = []
    module = types.ModuleType("megatron.bridge")
    module.AutoBridge = object  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "megatron.bridge", module)

    class World:
        def __enter__(self) -> None:
            calls.append(("world",))

        def __exit__(self, *exc: object) -> None:
            calls.append(("end of world",))

    monkeypatch.setattr(bridge_export, "one_process_world", World)
    monkeypatch.setattr(
        bridge_export, "_write_export", lambda *args: calls.append(("write", *args))
    )
    return calls


@pytest.mark.parametrize(
    ("cuda", "device", "used"),
    [(False, None, "cpu"), (True, None, "cuda"), (True, "cpu", "cpu")],
)
def test_the_export_runs_inside_its_world_on_the_chosen_device_then_checks_against_the_model(
    tmp_path: Path,
    fake_bridge: list,
    monkeypatch: pytest.MonkeyPatch,
    cuda: bool,
    device: str | None,
    used: str,
) -> None:
    import torch

    saved = step(tmp_path / "ck", 2)
    model_path = model(tmp_path / "m")
    checked: list[tuple[Path, list[str], Path]] = []

    def verify(out: Path, patterns: Any, reference: Path) -> ExportReport:
        checked.append((out, list(patterns), reference))
        return ExportReport(str(out), "complete", "X", 1, 1)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(bridge_export, "verify_export", verify)
    got = export_latest(
        str(tmp_path / "ck"),
        str(model_path),
        str(tmp_path / "out"),
        True,
        ["^p$"],
        device,
    )  # type: ignore[arg-type]
    assert got == ExportReport(str(tmp_path / "out"), "complete", "X", 1, 1)
    assert fake_bridge == [
        ("world",),
        (
            "write",
            saved / "actor/model/dist_ckpt",
            model_path,
            tmp_path / "out",
            True,
            used,
        ),
        ("end of world",),
    ]
    assert checked == [(tmp_path / "out", ["^p$"], model_path)]


def test_an_export_that_cannot_be_checked_is_an_export_error(
    tmp_path: Path, fake_bridge: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    step(tmp_path / "ck", 2)

    def verify(out: Path, patterns: Any, reference: Path) -> ExportReport:
        raise ExportCheckError(f"{out}: no config.json")

    monkeypatch.setattr(bridge_export, "verify_export", verify)
    with pytest.raises(ExportError) as error:
        export_latest(
            tmp_path / "ck", model(tmp_path / "m"), tmp_path / "out", device="cpu"
        )
    assert str(error.value) == f"{tmp_path / 'out'}: no config.json"


@pytest.mark.parametrize(
    ("name", "copied"),
    [
        ("config.json", True),
        ("tokenizer.json", True),
        ("tokenizer_config.json", True),
        ("generation_config.json", True),
        ("preprocessor_config.json", True),
        ("chat_template.jinja", True),
        ("model-00001-of-00002.safetensors", False),
        ("pytorch_model.bin", False),
        ("model.pt", False),
        ("model.pth", False),
        ("model.gguf", False),
        ("model.safetensors.index.json", False),
        ("pytorch_model.bin.index.json", False),
    ],
)
def test_everything_but_the_weights_is_copied_from_model_path(
    tmp_path: Path, name: str, copied: bool
) -> None:
    source, out = tmp_path / "model", tmp_path / "out"
    source.mkdir()
    out.mkdir()
    (source / name).write_text("content")
    (source / "subfolder").mkdir()  # folders are not copied
    _copy_non_weights(source, out)
    assert [p.name for p in out.iterdir()] == ([name] if copied else [])
    if copied:
        assert (out / name).read_text() == "content"


class Group:
    """Stands for torch.distributed.ProcessGroup."""


def test_every_parallel_state_global_still_holding_a_group_is_reset() -> None:
    group = Group()
    state = types.SimpleNamespace(
        _DATA_PARALLEL_GROUP=group,
        _GLOO_GROUPS=[None, group],
        _PAIR=(group,),
        _BY_RANK={0: group},
        _EMPTY_LIST=[],
        _NUMBER=3,
        _NAME="tp",
        _lower_case_group=group,  # not one of Megatron's globals
        PUBLIC_GROUP=group,
    )
    _forget_leftover_groups(state, Group)
    assert vars(state) == {
        "_DATA_PARALLEL_GROUP": None,
        "_GLOO_GROUPS": None,
        "_PAIR": None,
        "_BY_RANK": None,
        "_EMPTY_LIST": [],
        "_NUMBER": 3,
        "_NAME": "tp",
        "_lower_case_group": group,
        "PUBLIC_GROUP": group,
    }


def test_the_export_is_lenient_unless_asked(
    tmp_path: Path, fake_bridge: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    step(tmp_path / "ck", 2)
    monkeypatch.setattr(
        bridge_export,
        "verify_export",
        lambda out, patterns, reference: ExportReport(str(out), "lenient", "X", 1, 1),
    )
    export_latest(
        tmp_path / "ck", model(tmp_path / "m"), tmp_path / "out", device="cpu"
    )
    assert (
        fake_bridge[1][4] is False
    )  # Megatron-Bridge's strict=False: what matches is written, the rest reported
