"""k8s/prepare: the Job that fills the model and data volumes, rendered and validated like the run overlays.

Rendered by `kubectl kustomize`, validated strictly (Kubernetes 1.37 schemas), Pod Security `restricted`;
it writes where the runs read (the same ConfigMap, the same claims); its commands are the image's real
ones (the data step parsed by the recipe's own CLI here; both run with --help in each image, tests/images).
"""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from .pod_security import level_met
from .test_k8s import K8S, _core_problems, _one, render

MODEL_REPO = "Qwen/Qwen3.5-35B-A3B"


@pytest.fixture(scope="module")
def prepare(kubectl_bin: str) -> list[dict[str, Any]]:
    return render(kubectl_bin, K8S / "prepare")


@pytest.fixture(scope="module")
def run_claims(kubectl_bin: str) -> dict[str, dict[str, Any]]:
    """The PersistentVolumeClaims of the one-node run, by name."""
    return {d["metadata"]["name"]: d for d in render(kubectl_bin, K8S / "overlays" / "gpu") if d["kind"] == "PersistentVolumeClaim"}


def test_every_document_validates_strictly(prepare: list[dict[str, Any]]) -> None:
    assert {doc["kind"] for doc in prepare} == {"ConfigMap", "PersistentVolumeClaim", "Job"}
    problems = {f"{doc['kind']}/{doc['metadata']['name']}": _core_problems(doc) for doc in prepare}
    assert {name: problem for name, problem in problems.items() if problem} == {}


def test_it_meets_pod_security_restricted(prepare: list[dict[str, Any]]) -> None:
    assert level_met(_one(prepare, "Job")["spec"]["template"]["spec"]) == "restricted"


def test_it_writes_the_volumes_the_runs_read(prepare: list[dict[str, Any]], run_claims: dict[str, dict[str, Any]]) -> None:
    spec = _one(prepare, "Job")["spec"]["template"]["spec"]
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"] if "persistentVolumeClaim" in v}
    assert claims == {"models": "grpo-recipe-models", "data": "grpo-recipe-data"}
    mine = {d["metadata"]["name"]: d["spec"] for d in prepare if d["kind"] == "PersistentVolumeClaim"}
    assert mine == {name: claim["spec"] for name, claim in run_claims.items()}  # one definition: k8s/base
    assert not any(v.get("persistentVolumeClaim", {}).get("readOnly") for v in spec["volumes"])
    (model,) = spec["initContainers"]
    (data,) = spec["containers"]
    mounts = {c["name"]: {m["mountPath"]: m.get("readOnly", False) for m in c["volumeMounts"]} for c in (model, data)}
    assert mounts["model"]["/models"] is False  # the download writes the weights
    assert mounts["data"] == {"/models": True, "/data": False, "/cache/huggingface": False}


def test_the_download_goes_to_model_path_with_the_token_from_the_secret(prepare: list[dict[str, Any]]) -> None:
    job = _one(prepare, "Job")
    config = _one(prepare, "ConfigMap")
    (model,) = job["spec"]["template"]["spec"]["initContainers"]
    from recipe.settings import Settings

    default = Settings.model_fields["model_path"].default
    assert model["command"] == ["tini", "--", "sh", "-c",
                                f'exec hf download {MODEL_REPO} --local-dir "${{MODEL_PATH:-{default}}}"']  # fmt: skip
    # MODEL_PATH comes from the container's own environment (the settings' ConfigMap) when set there; the
    # shipped settings leave it to the recipe's default, which the shell supplies: the same for both.
    assert model["envFrom"] == [{"configMapRef": {"name": config["metadata"]["name"]}}]
    assert "MODEL_PATH" not in config.get("data", {})
    for settings_path, expected in ((None, str(default)), ("/models/mine", "/models/mine")):
        env = {"PATH": "/usr/bin:/bin"} | ({"MODEL_PATH": settings_path} if settings_path else {})
        script = model["command"][4].replace("exec hf download", "echo")
        said = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, check=True).stdout
        assert said.split() == [MODEL_REPO, "--local-dir", expected]
    for container in (model, job["spec"]["template"]["spec"]["containers"][0]):
        (token,) = container["env"]
        assert token == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
            "name": "grpo-recipe-secrets", "key": "HF_TOKEN", "optional": True}}}  # fmt: skip


def test_the_data_step_is_the_recipes_prepare_data_and_a_config_error_is_not_retried(prepare: list[dict[str, Any]]) -> None:
    from recipe.cli import _parser

    job = _one(prepare, "Job")
    (data,) = job["spec"]["template"]["spec"]["containers"]
    assert "command" not in data  # the image's entrypoint: tini, then entrypoint.py
    parsed = _parser().parse_args(data["args"])
    assert (parsed.command, parsed.dataset) == ("prepare-data", "geo3k")
    (rule,) = job["spec"]["podFailurePolicy"]["rules"]
    assert rule == {"action": "FailJob", "onExitCodes": {"containerName": "data", "operator": "In", "values": [2]}}
