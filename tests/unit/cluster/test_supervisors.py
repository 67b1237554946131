"""recipe.cluster.supervisors without real Ray: role checks, the joined wait, no Ray import (tests/unit/cluster/test_with_real_ray.py runs real Ray)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from recipe.cluster import rules, supervisors


def test_role_checks_in_runners() -> None:
    single = rules.plan_ray_role(1, 0, None, 6379, None)
    with pytest.raises(ValueError):
        supervisors.run_head(single, ["true"], resource_name="GPU", devices_per_node=8, timeout_s=1)
    with pytest.raises(ValueError):
        supervisors.run_worker(single, join_timeout_s=1, rejoin_grace_s=1)


def test_importing_every_room_of_cluster_does_not_import_ray() -> None:
    code = "import sys, recipe.cluster.supervisors; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().lower()) is False


@pytest.mark.parametrize("nnodes", [1, 2, 3, 16])
def test_joining_an_existing_cluster_waits_for_every_node(monkeypatch: pytest.MonkeyPatch, nnodes: int) -> None:
    """KubeRay's RayJob: the trainer starts only once all NNODES nodes, with their devices, have joined."""
    waited: list[tuple[object, ...]] = []
    monkeypatch.setattr(supervisors, "wait_for_nodes", lambda *args, **kwargs: waited.append(args))
    role = rules.plan_ray_role(nnodes, 0, None, 6379, "10.0.0.9:6379")
    ran: list[list[str]] = []
    code = supervisors.run_joined(role, ["trainer"], resource_name="NPU", devices_per_node=16, timeout_s=5,
                              env={}, run_trainer=lambda argv, env: ran.append(list(argv)) or 0)  # fmt: skip
    assert code == 0 and ran == [["trainer"]]
    assert waited == [("10.0.0.9:6379", nnodes, "NPU", 16, 5)]
