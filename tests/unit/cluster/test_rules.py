"""recipe.cluster.rules: the roles and the rules plan checks (hosts, GCS addresses, several nodes)."""

from __future__ import annotations

import pytest

from recipe.cluster import rules


@pytest.mark.parametrize(
    ("nnodes", "rank", "master", "ray_address", "kind", "address"),
    [
        (1, 0, None, None, "single", None),
        (2, 0, "head.local", None, "head", "head.local:6379"),
        (4, 3, "10.0.0.1", None, "worker", "10.0.0.1:6379"),
        # KubeRay: the cluster exists; NODE_RANK/MASTER_ADDR do not matter.
        (4, 0, None, "10.0.0.9:6379", "join-existing", "10.0.0.9:6379"),
        (1, 0, None, "10.0.0.9:6379", "join-existing", "10.0.0.9:6379"),
    ],
)
def test_plan_ray_role(nnodes: int, rank: int, master: str | None, ray_address: str | None,
                       kind: str, address: str | None) -> None:
    role = rules.plan_ray_role(nnodes, rank, master, 6379, ray_address)
    assert (role.kind, role.address, role.nnodes) == (kind, address, nnodes)
    assert role.runs_trainer is (kind != "worker")
    assert role.starts_ray is (kind in ("head", "worker"))


def test_head_without_master_addr_is_refused_too() -> None:
    # A head that guessed its own address could not be joined by workers never told it.
    with pytest.raises(rules.ClusterError) as caught:
        rules.plan_ray_role(2, 0, None, 6380, None)
    assert caught.value.problems == [
        "MASTER_ADDR=: must name the NODE_RANK=0 host when NNODES=2 and NODE_RANK=0 (or RAY_ADDRESS a running cluster)"
    ]


def test_every_bad_variable_is_reported_at_once() -> None:
    with pytest.raises(rules.ClusterError) as caught:
        rules.plan_ray_role(2, 2, None, 70000, None)
    assert caught.value.problems == [
        "NODE_RANK=2: must be in [0, NNODES=2)",
        "RAY_PORT=70000: must be a TCP port in [1, 65535]",
        "MASTER_ADDR=: must name the NODE_RANK=0 host when NNODES=2 and NODE_RANK=2 (or RAY_ADDRESS a running cluster)",
    ]


def test_worker_needs_master_addr() -> None:
    assert rules.cluster_problems(2, 1, None, 6379) == [
        "MASTER_ADDR=: must name the NODE_RANK=0 host when NNODES=2 and NODE_RANK=1 (or RAY_ADDRESS a running cluster)"
    ]
    assert rules.cluster_problems(2, 1, "h", 6379) == []


def test_dashboard_address_is_not_a_gcs_address() -> None:
    problems = rules.cluster_problems(2, 0, None, 6379, "http://head:8265")
    assert len(problems) == 1 and problems[0].startswith("RAY_ADDRESS=http://head:8265: must be a GCS")


def test_split_address() -> None:
    assert rules.split_address("h:1") == ("h", 1)
    assert rules.split_address("[::1]:6379") == ("::1", 6379)
    for bad in ("h", "h:", ":1", "h:x"):
        with pytest.raises(rules.ClusterError):
            rules.split_address(bad)
