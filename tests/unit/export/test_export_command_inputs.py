"""`export` checks its inputs before it loads Megatron-Bridge, and fails in one line where it cannot load it.

Run as users run it: the real CLI in its own process. Where Megatron-Bridge cannot load, the
test puts a `megatron` package first on the path whose `bridge` raises what Python 3.11 gives
(`cannot import name 'override' from 'typing'`), so the case is the same on every machine.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.unit.envtools import ENTRYPOINT, REPO, entrypoint_env

BROKEN_BRIDGE = "from typing import override  # Python 3.12's; 3.11 raises ImportError here\n"


def _export(tmp_path: Path, *, shadow_bridge: bool, **settings: str) -> subprocess.CompletedProcess[str]:
    env = entrypoint_env(**settings)
    if shadow_bridge:
        fake = tmp_path / "shadow" / "megatron" / "bridge"
        fake.mkdir(parents=True)
        (fake.parent / "__init__.py").write_text("")
        (fake / "__init__.py").write_text("raise ImportError(\"cannot import name 'override' from 'typing'\")\n")
        env["PYTHONPATH"] = f"{fake.parent.parent}:{REPO}"
    return subprocess.run(
        [*ENTRYPOINT, "export", "--out", str(tmp_path / "out"), "--checkpoint-dir", str(tmp_path / "ck")], env=env, capture_output=True, text=True,
        timeout=300, check=False,
    )


def _checkpoint(root: Path) -> Path:
    """A finished verl step (its manifest) with a Megatron dist checkpoint (its metadata.json)."""
    step = root / "global_step_1"
    (step / "actor" / "model" / "dist_ckpt").mkdir(parents=True)
    (step / "actor" / "model" / "dist_ckpt" / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')
    (step / "actor" / "ckpt_contents.json").write_text(json.dumps(["model"]))
    return step


def test_no_checkpoint_is_one_line_before_any_import(tmp_path: Path) -> None:
    # The shadowed bridge would fail if it were imported: the missing checkpoint is said first.
    done = _export(tmp_path, shadow_bridge=True)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"error: {tmp_path / 'ck'}: no finished verl checkpoint (global_step_N/actor/ckpt_contents.json) found"]


def test_missing_model_is_one_line_before_any_import(tmp_path: Path) -> None:
    _checkpoint(tmp_path / "ck")
    done = _export(tmp_path, shadow_bridge=True, MODEL_PATH=str(tmp_path / "no-model"))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"error: MODEL_PATH='{tmp_path / 'no-model'}': no config.json there"]


def test_a_bridge_that_cannot_load_is_one_line_and_exit_2(tmp_path: Path) -> None:
    _checkpoint(tmp_path / "ck")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    done = _export(tmp_path, shadow_bridge=True, MODEL_PATH=str(model))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("error: Megatron-Bridge cannot be loaded here (ImportError: cannot import name 'override'")
    assert not (tmp_path / "out").exists()
