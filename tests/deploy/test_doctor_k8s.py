"""k8s/: every pod of a run starts with `entrypoint.py doctor` as an init container.

A bad node or image then fails before the trainer or Ray starts, with the report in the
pod's log. The doctor must see what the main container will: the same image, settings,
volumes and devices (the NPU driver mounts included), or its checks prove nothing.
"""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import REPO
from .test_k8s import K8S, OVERLAYS, _device, _one, pod_specs, render


@pytest.fixture(scope="module")
def rendered(kubectl_bin: str) -> dict[str, list[dict[str, Any]]]:
    return {name: render(kubectl_bin, K8S / "overlays" / name) for name in OVERLAYS}


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_every_pod_runs_doctor_first_as_its_main_container_would_run(
        rendered: dict[str, list[dict[str, Any]]], overlay: str) -> None:
    specs = list(pod_specs(rendered[overlay]))
    assert specs
    for spec in specs:
        (main,) = spec["containers"]
        doctor = spec["initContainers"][0]
        assert doctor["name"] == "doctor" and doctor["args"] == ["doctor"]
        assert doctor["image"] == main["image"] == f"grpo-recipe:{_device(overlay)}"
        assert doctor["resources"]["limits"] == main["resources"]["limits"]  # the devices it checks
        assert doctor["envFrom"] == main["envFrom"]
        assert doctor["volumeMounts"] == main["volumeMounts"]
        assert "command" not in doctor  # the image's entrypoint (tini, python3 entrypoint.py)


@pytest.mark.parametrize("overlay", ["gpu", "npu"])
def test_a_doctor_that_cannot_run_fails_the_job_at_once(rendered: dict[str, list[dict[str, Any]]],
                                                        overlay: str) -> None:
    rules = _one(rendered[overlay], "Job")["spec"]["podFailurePolicy"]["rules"]
    assert {"action": "FailJob", "onExitCodes": {"containerName": "doctor", "operator": "In",
                                                 "values": [2]}} in rules


def test_the_doctor_subcommand_exists_in_the_cli() -> None:
    # The init containers' args name a subcommand of this repository's entrypoint.
    from recipe.cli import _parser

    assert _parser().parse_args(["doctor"]).command == "doctor"
    assert (REPO / "entrypoint.py").is_file()
