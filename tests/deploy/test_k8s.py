"""k8s/: every overlay rendered with `kubectl kustomize` and validated offline.

Core kinds: kubernetes-validate --strict (Kubernetes 1.37 schemas). RayJob:
KubeRay v1.7.0's CRD openAPIV3Schema read from ../shared/schemas (never copied
into the project), made strict the way the API server prunes: an object with
declared properties takes no other field unless it says
x-kubernetes-preserve-unknown-fields. CEL rules (x-kubernetes-validations) are
not evaluated.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.needs import needs
import yaml

from .conftest import REPO, run

K8S = REPO / "k8s"
OVERLAYS = {"gpu": "Job", "npu": "Job", "gpu-ray": "RayJob", "npu-ray": "RayJob"}
KUBERNETES_VERSION = "1.37.0"
CRD_NAME = "kuberay-v1.7.0-ray.io_rayjobs.yaml"
RESOURCE = {"gpu": ("nvidia.com/gpu", 8), "npu": ("huawei.com/Ascend910", 16)}


def _crd_path() -> Path:
    """KubeRay's RayJob CRD: KUBERAY_RAYJOB_CRD, else shared/schemas beside the repository."""
    override = os.environ.get("KUBERAY_RAYJOB_CRD")
    return Path(override) if override else REPO.parent / "shared" / "schemas" / CRD_NAME


def render(kubectl: str, directory: Path) -> list[dict[str, Any]]:
    out = run([kubectl, "kustomize", str(directory)])
    assert out.returncode == 0, out.stderr
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


#: Kubernetes quantity suffixes (the ones these manifests may use).
SUFFIXES = {"m": 1e-3, "": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def quantity(text: str | int) -> float:
    """A Kubernetes resource quantity as a number ("500m" -> 0.5, "1Gi" -> 2**30)."""
    found = re.fullmatch(r"(\d+(?:\.\d+)?)(m|k|M|G|T|Ki|Mi|Gi|Ti)?", str(text))
    assert found, f"not a quantity these tests know: {text!r}"
    return float(found.group(1)) * SUFFIXES[found.group(2) or ""]


def _device(overlay: str) -> str:
    return overlay.split("-")[0]


def _one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind}"
    return found[0]


def pod_specs(docs: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every pod template's spec in the rendered output (Job, RayJob head and workers)."""
    for doc in docs:
        if doc["kind"] == "Job":
            yield doc["spec"]["template"]["spec"]
        elif doc["kind"] == "RayJob":
            cluster = doc["spec"]["rayClusterSpec"]
            yield cluster["headGroupSpec"]["template"]["spec"]
            for group in cluster["workerGroupSpecs"]:
                yield group["template"]["spec"]


@pytest.fixture(scope="module")
def rendered(kubectl_bin: str) -> dict[str, list[dict[str, Any]]]:
    return {name: render(kubectl_bin, K8S / "overlays" / name) for name in OVERLAYS}


# --- schemas -----------------------------------------------------------------------------


def _strict(schema: Any) -> Any:
    """Close every object schema that lists its properties, as the API server prunes."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@pytest.fixture(scope="module")
def rayjob_validator() -> Any:
    jsonschema = needs("jsonschema", install="pip install -e '.[test]'")
    path = _crd_path()
    if not path.is_file():
        pytest.skip(f"KubeRay's RayJob CRD is not at {path} (shared/schemas/{CRD_NAME}); "
                    "set KUBERAY_RAYJOB_CRD to its path")
    crd = yaml.safe_load(path.read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    schema = _strict(version["schema"]["openAPIV3Schema"])
    # OpenAPI 3.0 keywords are those of draft 4 (boolean exclusiveMinimum, ...).
    return jsonschema.Draft4Validator(schema)


def _core_problems(doc: dict[str, Any]) -> str | None:
    import kubernetes_validate

    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as error:
        return str(error)
    return None


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_core_kinds_validate_strictly(rendered: dict[str, list[dict[str, Any]]], overlay: str) -> None:
    needs("kubernetes_validate", install="pip install kubernetes-validate==1.37.0")
    docs = rendered[overlay]
    core = [d for d in docs if d["apiVersion"] in ("v1", "batch/v1")]
    assert {d["kind"] for d in docs} - {d["kind"] for d in core} <= {"RayJob"}
    for doc in core:
        assert _core_problems(doc) is None, (doc["kind"], _core_problems(doc))


@pytest.mark.parametrize("overlay", ["gpu-ray", "npu-ray"])
def test_rayjob_matches_kuberay_crd(rendered: dict[str, list[dict[str, Any]]], rayjob_validator: Any,
                                    overlay: str) -> None:
    rayjob = _one(rendered[overlay], "RayJob")
    assert rayjob["apiVersion"] == "ray.io/v1"
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in rayjob_validator.iter_errors(rayjob)]
    assert errors == []


def test_broken_core_manifest_fails(rendered: dict[str, list[dict[str, Any]]]) -> None:
    needs("kubernetes_validate", install="pip install kubernetes-validate==1.37.0")
    job = copy.deepcopy(_one(rendered["gpu"], "Job"))
    job["spec"]["template"]["spec"]["containers"][0]["resources"]["limitz"] = {"cpu": 1}
    assert _core_problems(job) is not None, "an unknown field passed --strict"
    job = copy.deepcopy(_one(rendered["gpu"], "Job"))
    job["spec"]["backoffLimit"] = "five"
    assert _core_problems(job) is not None, "a string where an integer belongs passed"


@pytest.mark.parametrize("mutation", ["unknown field", "wrong type", "missing required"])
def test_broken_rayjob_fails(rendered: dict[str, list[dict[str, Any]]], rayjob_validator: Any,
                             mutation: str) -> None:
    rayjob = copy.deepcopy(_one(rendered["npu-ray"], "RayJob"))
    cluster = rayjob["spec"]["rayClusterSpec"]
    if mutation == "unknown field":
        cluster["workerGroupSpecs"][0]["replcas"] = 3
    elif mutation == "wrong type":
        cluster["workerGroupSpecs"][0]["replicas"] = "one"
    else:
        del cluster["headGroupSpec"]
    assert list(rayjob_validator.iter_errors(rayjob)), f"{mutation} passed the CRD schema"


def test_broken_kustomization_fails(kubectl_bin: str, tmp_path: Path) -> None:
    copy_root = tmp_path / "k8s"
    shutil.copytree(K8S, copy_root)
    job = copy_root / "job" / "kustomization.yaml"
    job.write_text(job.read_text().replace("- job.yaml", "- jobs.yaml"))
    out = run([kubectl_bin, "kustomize", str(copy_root / "overlays" / "gpu")])
    assert out.returncode != 0 and "jobs.yaml" in out.stderr


# --- what the manifests promise ----------------------------------------------------------


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_every_node_gets_its_devices_image_and_settings(
        rendered: dict[str, list[dict[str, Any]]], overlay: str) -> None:
    docs = rendered[overlay]
    device = _device(overlay)
    name, count = RESOURCE[device]
    settings = _one(docs, "ConfigMap")
    assert settings["metadata"]["name"] == "grpo-recipe-settings"
    assert settings["data"]["DEVICE"] == device
    specs = list(pod_specs(docs))
    assert len(specs) == (1 if OVERLAYS[overlay] == "Job" else 2)
    for spec in specs:
        (container,) = spec["containers"]
        resources = container["resources"]
        assert {k: v for k, v in resources["limits"].items() if "/" in k} == {name: count}
        for resource in ("cpu", "memory"):  # sized for the model, requested and bounded
            assert 0 < quantity(resources["requests"][resource]) <= quantity(resources["limits"][resource])
        for init in spec.get("initContainers", []):  # doctor checks the devices the trainer gets
            assert init["resources"] == resources
        assert container["image"] == f"grpo-recipe:{device}"
        assert {"configMapRef": {"name": "grpo-recipe-settings"}} in container["envFrom"]
        assert not container.get("securityContext", {}).get("privileged", False)
        assert spec["securityContext"]["runAsUser"] == 1000 and spec["securityContext"]["runAsNonRoot"]
        secrets = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"]}
        for key in ("HF_TOKEN", "WANDB_API_KEY"):
            assert secrets[key] == {"name": "grpo-recipe-secrets", "key": key, "optional": True}


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_volumes_shm_and_checkpoints(rendered: dict[str, list[dict[str, Any]]], overlay: str) -> None:
    docs = rendered[overlay]
    claims = {d["metadata"]["name"]: d for d in docs if d["kind"] == "PersistentVolumeClaim"}
    assert claims["grpo-recipe-checkpoints"]["spec"]["accessModes"] == ["ReadWriteMany"]
    for spec in pod_specs(docs):
        volumes = {v["name"]: v for v in spec["volumes"]}
        mounts = {m["mountPath"]: m for m in spec["containers"][0]["volumeMounts"]}
        assert volumes[mounts["/dev/shm"]["name"]]["emptyDir"]["medium"] == "Memory"
        assert volumes[mounts["/checkpoints"]["name"]]["persistentVolumeClaim"]["claimName"] \
            == "grpo-recipe-checkpoints"
        assert mounts["/models"]["readOnly"] is True
        assert {"/data", "/cache/huggingface"} <= set(mounts)
        # Every claim a pod names is rendered beside it.
        for volume in volumes.values():
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims
        if _device(overlay) == "npu":
            for path in ("/usr/local/Ascend/driver", "/usr/local/dcmi", "/usr/local/bin/npu-smi",
                         "/etc/ascend_install.info"):
                assert mounts[path]["readOnly"] is True
                assert volumes[mounts[path]["name"]]["hostPath"]["path"] == path


@pytest.mark.parametrize("overlay", ["gpu", "npu"])
def test_job_retries_resume_but_not_config_errors(rendered: dict[str, list[dict[str, Any]]],
                                                  overlay: str) -> None:
    job = _one(rendered[overlay], "Job")
    assert job["spec"]["backoffLimit"] >= 1
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    rules = job["spec"]["podFailurePolicy"]["rules"]
    assert {"action": "FailJob", "onExitCodes": {"containerName": "trainer", "operator": "In",
                                                 "values": [2]}} in rules
    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == ["run"]


@pytest.mark.parametrize("overlay", ["gpu-ray", "npu-ray"])
def test_rayjob_shape(rendered: dict[str, list[dict[str, Any]]], overlay: str) -> None:
    docs = rendered[overlay]
    rayjob = _one(docs, "RayJob")
    spec = rayjob["spec"]
    assert spec["entrypoint"] == "python3 /opt/recipe/entrypoint.py run"
    assert spec["shutdownAfterJobFinishes"] is True and spec["backoffLimit"] >= 1
    assert spec["rayClusterSpec"]["authOptions"] == {"mode": "token"}
    workers = spec["rayClusterSpec"]["workerGroupSpecs"]
    nnodes = int(_one(docs, "ConfigMap")["data"]["NNODES"])
    assert nnodes == 1 + sum(g["replicas"] for g in workers)
    for group in workers:
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
    # The image's Ray, so KubeRay's feature checks match what runs.
    locks = list((REPO / "docker").glob("*/requirements.lock"))
    pins = {m for lock in locks for m in re.findall(r"^ray==([\d.]+)", lock.read_text(), re.MULTILINE)}
    if pins:
        assert pins == {spec["rayClusterSpec"]["rayVersion"]}


def test_npu_resource_name_lives_in_one_place(kubectl_bin: str, tmp_path: Path) -> None:
    """Changing accelerator.yaml alone moves every NPU pod to another resource name."""
    holders = [p.relative_to(K8S).as_posix() for p in K8S.rglob("*")
               if p.is_file() and "huawei.com/" in p.read_text()]
    assert holders == ["components/npu/accelerator.yaml"]
    copy_root = tmp_path / "k8s"
    shutil.copytree(K8S, copy_root)
    accelerator = copy_root / "components" / "npu" / "accelerator.yaml"
    accelerator.write_text(accelerator.read_text().replace("huawei.com/Ascend910: 16",
                                                           "huawei.com/ascend-1980: 16"))
    for overlay in ("npu", "npu-ray"):
        docs = render(kubectl_bin, copy_root / "overlays" / overlay)
        for spec in pod_specs(docs):
            limits = spec["containers"][0]["resources"]["limits"]
            assert {k: v for k, v in limits.items() if "/" in k} == {"huawei.com/ascend-1980": 16}
        assert all(d["kind"] != "AcceleratorLimits" for d in docs)  # local-config: never applied


def test_settings_env_names_real_settings() -> None:
    """A misspelt name in k8s/base/settings.env would be ignored silently by the recipe."""
    from recipe import settings
    known = {n.upper() for n in settings.Settings.model_fields} | {"HF_ENDPOINT", "HF_HUB_OFFLINE"}
    text = (K8S / "base" / "settings.env").read_text()
    names = re.findall(r"^#?([A-Z][A-Z0-9_]*)=", text, flags=re.MULTILINE)
    assert names and set(names) <= known, sorted(set(names) - known)
    # Secrets never live in a ConfigMap.
    assert not {"HF_TOKEN", "WANDB_API_KEY"} & set(names)
    # The run's size lives in the -ray overlays beside the worker replicas, whose configMapGenerator merge would
    # replace a base NNODES without a word (issue 54): the base never sets it.
    assert "NNODES" not in names


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_each_overlays_rendered_settings_are_valid_values_and_its_size_agrees(
    rendered: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    """Issue 52: the values, not only the names: every ConfigMap the pods read their settings from, as kustomize
    renders it for the overlay, validates as the recipe's settings; a RayJob's NNODES is its head plus its workers."""
    from recipe.settings import Settings

    docs = rendered[overlay]
    read = {ref["configMapRef"]["name"] for spec in pod_specs(docs) for container in spec["containers"]
            for ref in container.get("envFrom", []) if "configMapRef" in ref}  # fmt: skip
    maps = [doc for doc in docs if doc["kind"] == "ConfigMap" and doc["metadata"]["name"] in read]
    assert maps, (overlay, read)
    values = {name: value for doc in maps for name, value in doc.get("data", {}).items()}
    known = {name.upper() for name in Settings.model_fields}
    settings = Settings.model_validate({name.lower(): value for name, value in values.items() if name in known})
    assert settings.checkpoint_dir.is_absolute() and settings.model_path.is_absolute()
    jobs = [doc for doc in docs if doc["kind"] == "RayJob"]
    if jobs:
        workers = sum(group["replicas"] for group in jobs[0]["spec"]["rayClusterSpec"]["workerGroupSpecs"])
        assert settings.nnodes == 1 + workers, (overlay, settings.nnodes, workers)
    else:
        assert settings.nnodes == 1  # a Job is one pod on one node
