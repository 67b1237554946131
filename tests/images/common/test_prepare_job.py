"""k8s/prepare's two steps are commands this image has: each parses its arguments here (with --help, nothing fetched)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

JOB = Path(__file__).resolve().parents[3] / "k8s" / "prepare" / "job.yaml"


def _pod() -> dict[str, Any]:
    return yaml.safe_load(JOB.read_text())["spec"]["template"]["spec"]


@pytest.mark.framework  # huggingface_hub's `hf` comes with the framework
def test_the_model_step_runs_the_images_hf_download(host: Any) -> None:
    (model,) = _pod()["initContainers"]
    tini, separator, shell, flag, script = model["command"]
    assert (tini, separator, shell, flag) == ("tini", "--", "sh", "-c")
    # The Job's own script, MODEL_PATH unset as the shipped settings leave it, asked for its help (tini is PID 1 here).
    done = host.run_expect([0], shlex.join(["env", "-u", "MODEL_PATH", shell, flag, f"{script} --help"]))
    assert "Usage: hf download" in done.stdout


def test_the_data_step_is_the_entrypoints_prepare_data(host: Any) -> None:
    (data,) = _pod()["containers"]
    done = host.run_expect([0], " ".join(["python3", "/opt/recipe/entrypoint.py", *data["args"], "--help"]))
    assert "prepare-data" in done.stdout and "geo3k" in done.stdout
