"""The recipe's export check through its CLI, and the weights of an HF directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.e2e.harness.plan import ROOT, cpu_environment


def verify_export(directory: Path, *args: str) -> tuple[int, dict[str, Any]]:
    """`entrypoint.py verify-export DIR --json ARGS`: (exit code, report); exit 2 (uncheckable) fails."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "entrypoint.py"), "verify-export", str(directory), "--json", *args],
        cwd=ROOT,
        # transformers imports torchvision with the model class the check builds: the e2e site makes it importable.
        env={**os.environ, "PYTHONPATH": cpu_environment()["PYTHONPATH"]},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode in (0, 1), f"verify-export exited {result.returncode}: {result.stderr}"
    report: dict[str, Any] = json.loads(result.stdout)
    return result.returncode, report


def hf_weights(directory: Path) -> dict[str, Any]:
    """The state dict transformers loads from `directory`, with the class its config.json names (the whole VLM)."""
    import transformers

    architecture = json.loads((directory / "config.json").read_text())["architectures"][0]
    return dict(getattr(transformers, architecture).from_pretrained(directory).state_dict())


def changed_tensors(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Names whose values differ (both must hold the same names)."""
    assert set(before) == set(after), f"tensor names differ: {sorted(set(before) ^ set(after))[:5]}"
    return [name for name in before if not before[name].equal(after[name])]
