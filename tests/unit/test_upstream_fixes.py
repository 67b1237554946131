"""Upstream fixes the recipe relies on, pinned against the installed packages (a downgrade fails here, not on a node)."""

from __future__ import annotations

import ast
from importlib.util import find_spec
from pathlib import Path

from tests.support.needs import TRAINER_EXTRA, needs

needs("verl", install=f"{TRAINER_EXTRA}: verl's source is read")


def test_verls_hccl_weight_update_broadcasts_inline() -> None:
    """verl#7416: HCCL errors in weight updates on Ascend came from #7205, which ran the HCCL broadcast in
    a background thread (loop.run_in_executor); #7487/#7488 restored the plain call. verl 0.9.1 has the fix."""
    spec = find_spec("verl")
    assert spec is not None and spec.submodule_search_locations
    source = Path(spec.submodule_search_locations[0], "checkpoint_engine", "hccl_checkpoint_engine.py").read_text()
    tree = ast.parse(source)
    [operation] = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "BroadcastOperation"]
    [init] = [node for node in operation.body if isinstance(node, ast.FunctionDef) and node.name == "__init__"]
    calls = [ast.unparse(node.func) for node in ast.walk(init) if isinstance(node, ast.Call)]
    assert "self._run" in calls
    assert not any("run_in_executor" in call for call in calls)
