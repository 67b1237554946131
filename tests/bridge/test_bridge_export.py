"""export_latest: a verl-layout Megatron checkpoint -> HF safetensors with Megatron-Bridge -> check.

The checkpoint is written with verl 0.9.1's own `save_dist_checkpointing` and the
sharded state dict layout of its MegatronCheckpointManager (`{"model": ...}`), from
the tiny Qwen3-MoE whose final norm was changed first, so the test can tell that the
export came from the checkpoint and not from MODEL_PATH.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.needs import TRAINER_EXTRA, needs
from tests.support.threads import distributed_threads
from tests.unit.envtools import HANG_GUARD_S

torch = needs("torch", install=TRAINER_EXTRA)
# The checkpoint is written with verl's own dist_checkpointing helper.
needs("verl", install=TRAINER_EXTRA)

from recipe.export.bridge_export import ExportError, export_latest, latest_checkpoint  # noqa: E402
from tests.bridge.conftest import write_verl_checkpoint  # noqa: E402

FINAL_NORM = "model.norm.weight"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def verl_checkpoint(megatron_model: list[Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("verl") / "project" / "experiment"
    norm = dict(megatron_model[0].named_parameters())["decoder.final_layernorm.weight"]
    with torch.no_grad():
        norm.add_(1.0)
    try:
        write_verl_checkpoint(megatron_model, root, 7)
    finally:
        with torch.no_grad():
            norm.sub_(1.0)
    # An older, unfinished save must not be picked: no manifest.
    (root / "global_step_9" / "actor" / "model" / "dist_ckpt").mkdir(parents=True)
    return root


def test_latest_checkpoint_skips_unfinished(verl_checkpoint: Path) -> None:
    assert latest_checkpoint(verl_checkpoint.parent.parent) == verl_checkpoint / "global_step_7"


@pytest.mark.parametrize("strict", [True, False])
def test_export_latest_is_complete_and_carries_trained_weights(
    verl_checkpoint: Path, qwen3_moe_source: Path, tmp_path: Path, tensors_of, strict: bool
) -> None:
    out = tmp_path / "hf"
    report = export_latest(verl_checkpoint, qwen3_moe_source, out, strict=strict, device="cpu")

    assert report.status == "complete", report.summary()
    assert report.reference == str(qwen3_moe_source) and report.dropped == []
    assert (out / "config.json").is_file() and (out / "generation_config.json").is_file()
    exported, source = tensors_of(out), tensors_of(qwen3_moe_source)
    assert exported.keys() == source.keys()
    assert torch.equal(exported[FINAL_NORM], source[FINAL_NORM] + 1.0)
    for name in source:
        if name != FINAL_NORM:
            assert torch.equal(exported[name], source[name]), name


@pytest.mark.parametrize("empty_dist_ckpt", [False, True], ids=["no-dist_ckpt", "empty-dist_ckpt"])
def test_export_refuses_checkpoint_without_megatron_weights(
    tmp_path: Path, qwen3_moe_source: Path, empty_dist_ckpt: bool
) -> None:
    """verl 0.9.1 creates an empty model/dist_ckpt even with use_dist_checkpointing off (seen in the e2e run)."""
    actor = tmp_path / "global_step_3" / "actor"
    (actor / "model" / "huggingface").mkdir(parents=True)
    if empty_dist_ckpt:
        (actor / "model" / "dist_ckpt").mkdir()
    (actor / "ckpt_contents.json").write_text("{}")
    with pytest.raises(
        ExportError, match=r"no Megatron model weights .*`verify-export .*/global_step_3/actor/model/huggingface`"
    ):
        export_latest(tmp_path, qwen3_moe_source, tmp_path / "out")


def test_export_refuses_a_non_empty_target(verl_checkpoint: Path, qwen3_moe_source: Path, tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "old.safetensors").write_bytes(b"")
    with pytest.raises(ExportError, match="not empty"):
        export_latest(verl_checkpoint, qwen3_moe_source, tmp_path / "out")


# --- the `export` command's handler, as a user runs it: settings from the environment ---------


def _settings_env(monkeypatch: pytest.MonkeyPatch, **values: str) -> None:
    from tests.unit.envtools import clear_settings

    clear_settings(monkeypatch)
    for name, value in values.items():
        monkeypatch.setenv(name, value)


def test_the_export_command_exports_this_experiments_newest_checkpoint(
    verl_checkpoint: Path, qwen3_moe_source: Path, tmp_path: Path, tensors_of, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """CHECKPOINT_DIR/PROJECT_NAME/EXPERIMENT_NAME and MODEL_PATH decide what `export` reads."""
    from recipe.cli import main

    _settings_env(monkeypatch, CHECKPOINT_DIR=str(verl_checkpoint.parent.parent), PROJECT_NAME=verl_checkpoint.parent.name,
                  EXPERIMENT_NAME=verl_checkpoint.name, MODEL_PATH=str(qwen3_moe_source), EXPORT_STRICT="true")
    out = tmp_path / "hf"
    assert main(["export", "--out", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)  # stdout is the report alone: the bridge's prints go to stderr
    assert report["status"] == "complete" and report["reference"] == str(qwen3_moe_source)
    exported, source = tensors_of(out), tensors_of(qwen3_moe_source)
    assert torch.equal(exported[FINAL_NORM], source[FINAL_NORM] + 1.0)  # step 7's weights, not MODEL_PATH's


# `export` as its own process, as in the image; what threads it still runs when it is done.
_EXPORT_PROCESS = """
import json, sys
from tests.support.megatron_py311 import install_shims
from tests.support.threads import thread_names
install_shims()
from recipe.cli import main
code = main(["export", "--out", sys.argv[1]])
with open(sys.argv[2], "w") as out:
    json.dump({"code": code, "threads": thread_names()}, out)
"""


def test_the_export_command_tears_down_the_world_it_set_up(
    verl_checkpoint: Path, qwen3_moe_source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No gloo or TCP-store thread outlives the export: one left running at exit can crash the exit (139)."""
    _settings_env(monkeypatch, CHECKPOINT_DIR=str(verl_checkpoint.parent.parent), PROJECT_NAME=verl_checkpoint.parent.name,
                  EXPERIMENT_NAME=verl_checkpoint.name, MODEL_PATH=str(qwen3_moe_source))
    monkeypatch.delenv("MASTER_PORT")  # this process's gloo world holds that port: the export picks its own
    seen = tmp_path / "threads.json"
    result = subprocess.run(
        [sys.executable, "-c", _EXPORT_PROCESS, str(tmp_path / "hf"), str(seen)],
        cwd=REPO, capture_output=True, text=True, timeout=HANG_GUARD_S, check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    after = json.loads(seen.read_text())
    assert after["code"] == 0
    left = distributed_threads(after["threads"])
    assert left == [], f"{len(left)} torch.distributed threads still run after export: {sorted(set(left))}"


def test_the_export_command_without_a_checkpoint_exits_2_naming_where_it_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from recipe.cli import main

    _settings_env(monkeypatch, CHECKPOINT_DIR=str(tmp_path), PROJECT_NAME="p", EXPERIMENT_NAME="e",
                  MODEL_PATH=str(tmp_path / "model"))
    assert main(["export", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"error: {tmp_path / 'p' / 'e'}: no finished verl checkpoint (global_step_N/actor/ckpt_contents.json) found"]
    assert not (tmp_path / "out").exists()
