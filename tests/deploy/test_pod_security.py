"""Which Pod Security level each overlay meets, and that the hardening is on every container.

- gpu, gpu-ray: `restricted`, every pod (the RayJob's submitter too).
- npu, npu-ray: `privileged` only (the RayJob's submitter, which mounts nothing: `restricted`). The host's Ascend driver, dcmi, npu-smi and
  ascend_install.info are hostPath mounts, which `baseline` forbids; nothing else in them
  breaks `baseline` or `restricted` (docs/deploy.md says so to users).
The evaluator (pod_security.py) is checked too: each breakage, alone or combined with others
(hypothesis), lowers the level it must.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from .pod_security import containers, level_met, violations
from .test_k8s import OVERLAYS, rendered  # noqa: F401 - the rendered overlays fixture

EXPECTED_LEVEL = {"gpu": "restricted", "gpu-ray": "restricted", "npu": "privileged", "npu-ray": "privileged"}


def all_pod_specs(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(which pod, its spec) for every pod the overlay makes, the RayJob's submitter included."""
    for doc in docs:
        if doc["kind"] == "Job":
            yield "job", doc["spec"]["template"]["spec"]
        elif doc["kind"] == "RayJob":
            cluster = doc["spec"]["rayClusterSpec"]
            yield "ray-head", cluster["headGroupSpec"]["template"]["spec"]
            for group in cluster["workerGroupSpecs"]:
                yield f"ray-{group['groupName']}", group["template"]["spec"]
            yield "submitter", doc["spec"]["submitterPodTemplate"]["spec"]


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_overlay_meets_its_pod_security_level(rendered: dict[str, list[dict[str, Any]]], overlay: str) -> None:  # noqa: F811
    pods = dict(all_pod_specs(rendered[overlay]))
    assert pods
    expected = {name: "restricted" if name == "submitter" else EXPECTED_LEVEL[overlay] for name in pods}
    assert {name: level_met(spec) for name, spec in pods.items()} == expected


@pytest.mark.parametrize("overlay", ["npu", "npu-ray"])
def test_npu_misses_baseline_only_by_its_driver_host_paths(rendered: dict[str, list[dict[str, Any]]], overlay: str) -> None:  # noqa: F811
    for name, spec in all_pod_specs(rendered[overlay]):
        if name == "submitter":
            continue  # runs no NPU work: no driver mounts, restricted
        found = violations(spec, "baseline")
        assert found and all(v.endswith(": hostPath") for v in found), (name, found)
        without_host_paths = {**spec, "volumes": [v for v in spec["volumes"] if "hostPath" not in v]}
        # Only hostPath stands between these pods and `restricted`.
        assert violations(without_host_paths, "restricted") == [], name


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_every_container_is_hardened_and_no_pod_holds_a_token(rendered: dict[str, list[dict[str, Any]]], overlay: str) -> None:  # noqa: F811
    for name, spec in all_pod_specs(rendered[overlay]):
        assert spec["automountServiceAccountToken"] is False, name
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for container in containers(spec):
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False, (name, container["name"])
            assert context["capabilities"] == {"drop": ["ALL"]}, (name, container["name"])


# --- the evaluator can fail ------------------------------------------------------------------

Breakage = Callable[[dict[str, Any]], None]


def _first(spec: dict[str, Any]) -> dict[str, Any]:
    return spec["containers"][0].setdefault("securityContext", {})


BREAKAGES: dict[str, tuple[str, Breakage]] = {
    # name: (the level the pod falls to, what is done)
    "host network": ("privileged", lambda s: s.update(hostNetwork=True)),
    "privileged container": ("privileged", lambda s: _first(s).update(privileged=True)),
    "SYS_ADMIN added": ("privileged", lambda s: _first(s)["capabilities"].setdefault("add", []).append("SYS_ADMIN")),
    "hostPath volume": ("privileged", lambda s: s["volumes"].append({"name": "h", "hostPath": {"path": "/"}})),
    "host port": ("privileged", lambda s: s["containers"][0].setdefault("ports", []).append({"containerPort": 1, "hostPort": 1})),
    "seccomp unconfined": ("privileged", lambda s: _first(s).update(seccompProfile={"type": "Unconfined"})),
    "unsafe sysctl": ("privileged", lambda s: s["securityContext"].update(sysctls=[{"name": "kernel.msgmax", "value": "1"}])),
    "unmasked /proc": ("privileged", lambda s: _first(s).update(procMount="Unmasked")),
    "escalation allowed": ("baseline", lambda s: _first(s).update(allowPrivilegeEscalation=True)),
    "capabilities kept": ("baseline", lambda s: _first(s)["capabilities"].update(drop=[])),
    "CHOWN added": ("baseline", lambda s: _first(s)["capabilities"].setdefault("add", []).append("CHOWN")),
    "may run as root": ("baseline", lambda s: s["securityContext"].pop("runAsNonRoot")),
    "root user": ("baseline", lambda s: _first(s).update(runAsUser=0)),
    "no seccomp profile": ("baseline", lambda s: s["securityContext"].pop("seccompProfile")),
    "hostPath-free but nfs": ("baseline", lambda s: s["volumes"].append({"name": "n", "nfs": {"server": "x", "path": "/"}})),
}
ORDER = {"restricted": 0, "baseline": 1, "privileged": 2}


@pytest.fixture(scope="module")
def gpu_job(rendered: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:  # noqa: F811
    return dict(all_pod_specs(rendered["gpu"]))["job"]


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_each_breakage_lowers_the_level(gpu_job: dict[str, Any], breakage: str) -> None:
    expected, apply = BREAKAGES[breakage]
    spec = copy.deepcopy(gpu_job)
    apply(spec)
    assert level_met(spec) == expected


@settings(max_examples=60, deadline=None)
@given(chosen=st.sets(st.sampled_from(sorted(BREAKAGES)), min_size=1))
def test_combined_breakages_fall_to_the_lowest_level(gpu_job: dict[str, Any], chosen: set[str]) -> None:
    spec = copy.deepcopy(gpu_job)
    for name in sorted(chosen):
        BREAKAGES[name][1](spec)
    assert level_met(spec) == max((BREAKAGES[name][0] for name in chosen), key=ORDER.__getitem__)
