"""Pure parts of the Ray bootstrap: role, `ray start` argv, node assessment."""

from __future__ import annotations

import json
import socket
import sys

import pytest

from recipe import cluster


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
    role = cluster.plan_ray_role(nnodes, rank, master, 6379, ray_address)
    assert (role.kind, role.address, role.nnodes) == (kind, address, nnodes)
    assert role.runs_trainer is (kind != "worker")
    assert role.starts_ray is (kind in ("head", "worker"))


def test_head_without_master_addr_is_refused_too() -> None:
    # A head that guessed its own address could not be joined by workers never told it.
    with pytest.raises(cluster.ClusterError) as caught:
        cluster.plan_ray_role(2, 0, None, 6380, None)
    assert caught.value.problems == [
        "MASTER_ADDR=: must name the NODE_RANK=0 host when NNODES=2 and NODE_RANK=0 (or RAY_ADDRESS a running cluster)"
    ]


def test_every_bad_variable_is_reported_at_once() -> None:
    with pytest.raises(cluster.ClusterError) as caught:
        cluster.plan_ray_role(2, 2, None, 70000, None)
    assert caught.value.problems == [
        "NODE_RANK=2: must be in [0, NNODES=2)",
        "RAY_PORT=70000: must be a TCP port in [1, 65535]",
        "MASTER_ADDR=: must name the NODE_RANK=0 host when NNODES=2 and NODE_RANK=2 (or RAY_ADDRESS a running cluster)",
    ]


def test_worker_needs_master_addr() -> None:
    assert cluster.cluster_problems(2, 1, None, 6379) == [
        "MASTER_ADDR=: must name the NODE_RANK=0 host when NNODES=2 and NODE_RANK=1 (or RAY_ADDRESS a running cluster)"
    ]
    assert cluster.cluster_problems(2, 1, "h", 6379) == []


def test_dashboard_address_is_not_a_gcs_address() -> None:
    problems = cluster.cluster_problems(2, 0, None, 6379, "http://head:8265")
    assert len(problems) == 1 and problems[0].startswith("RAY_ADDRESS=http://head:8265: must be a GCS")


def test_ray_start_argv_head() -> None:
    options = cluster.NodeOptions(num_cpus=2, resources={"NPU": 16}, node_ip_address="10.0.0.1",
                                  temp_dir="/tmp/r", extra_args=("--include-dashboard=false",))
    argv = cluster.ray_start_argv(node_rank=0, options=options, head_port=6379, ray="ray")
    assert argv == [
        "ray", "start", "--block", "--disable-usage-stats", "--labels=grpo-recipe/node-rank=0",
        "--head", "--port=6379", "--num-cpus=2", '--resources={"NPU": 16}',
        "--node-ip-address=10.0.0.1", "--temp-dir=/tmp/r", "--include-dashboard=false",
    ]


def test_ray_start_argv_worker_leaves_devices_to_ray() -> None:
    argv = cluster.ray_start_argv(node_rank=3, options=cluster.NodeOptions(), address="h:6379")
    assert argv == ["ray", "start", "--block", "--disable-usage-stats",
                    "--labels=grpo-recipe/node-rank=3", "--address=h:6379"]
    assert not any(a.startswith(("--num-gpus", "--resources")) for a in argv)


def test_ray_start_argv_needs_exactly_one_of_head_or_address() -> None:
    with pytest.raises(ValueError):
        cluster.ray_start_argv(node_rank=0, options=cluster.NodeOptions())
    with pytest.raises(ValueError):
        cluster.ray_start_argv(node_rank=0, options=cluster.NodeOptions(), head_port=1, address="h:1")


def _node(ip: str, rank: int | None, npus: float, alive: bool = True) -> dict[str, object]:
    labels = {"ray.io/node-id": ip} | ({cluster.NODE_RANK_LABEL: str(rank)} if rank is not None else {})
    return {"NodeID": f"id-{ip}", "Alive": alive, "NodeManagerAddress": ip,
            "NodeManagerHostname": f"host-{ip}", "Resources": {"CPU": 8.0, "NPU": npus},
            "Labels": labels}


def test_assess_ready() -> None:
    r = cluster.assess_nodes([_node("a", 0, 16), _node("b", 1, 16)], 2, "NPU", 16)
    assert r.is_ready and [n.node_rank for n in r.ready] == [0, 1] and not r.missing_ranks


def test_assess_names_missing_and_short_nodes() -> None:
    nodes = [_node("a", 0, 16), _node("b", 1, 8), _node("c", 2, 16, alive=False)]
    r = cluster.assess_nodes(nodes, 4, "NPU", 16)
    assert not r.is_ready
    assert r.missing_ranks == (2, 3)  # a dead entry does not count as joined
    assert r.problems(600.4) == [
        "NNODES=4: 1 node(s) with 16 NPU registered with Ray after 600s",
        "NODE_RANK=1 (b, host-b): has 8 NPU, NDEVICES_PER_NODE=16 expected",
        "NODE_RANK=2, 3: never joined (check MASTER_ADDR, RAY_PORT and that those nodes were started)",
    ]


def test_assess_counts_nodes_without_rank_labels() -> None:
    """Under KubeRay nodes carry no rank: the report counts them."""
    r = cluster.assess_nodes([_node("a", None, 8)], 3, "GPU", 8)
    # GPU count missing from Resources means 0 GPUs: present but short.
    assert r.problems(1)[1:] == ["a, host-a: has 0 GPU, NDEVICES_PER_NODE=8 expected",
                                 "2 node(s) never joined"]


def test_split_address() -> None:
    assert cluster.split_address("h:1") == ("h", 1)
    assert cluster.split_address("[::1]:6379") == ("::1", 6379)
    for bad in ("h", "h:", ":1", "h:x"):
        with pytest.raises(cluster.ClusterError):
            cluster.split_address(bad)


def test_head_reachable() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert cluster.head_reachable(f"127.0.0.1:{port}")
    assert not cluster.head_reachable(f"127.0.0.1:{port}", timeout_s=0.5)


def test_role_checks_in_runners() -> None:
    single = cluster.plan_ray_role(1, 0, None, 6379, None)
    with pytest.raises(ValueError):
        cluster.run_head(single, ["true"], resource_name="GPU", devices_per_node=8, timeout_s=1)
    with pytest.raises(ValueError):
        cluster.run_worker(single, join_timeout_s=1, rejoin_grace_s=1)


def test_importing_cluster_does_not_import_ray() -> None:
    import subprocess

    code = "import sys, recipe.cluster; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().lower()) is False


@pytest.mark.parametrize("nnodes", [1, 2, 3, 16])
def test_joining_an_existing_cluster_waits_for_every_node(monkeypatch: pytest.MonkeyPatch, nnodes: int) -> None:
    """KubeRay's RayJob: the trainer starts only once all NNODES nodes, with their devices, have joined."""
    waited: list[tuple[object, ...]] = []
    monkeypatch.setattr(cluster, "wait_for_nodes", lambda *args, **kwargs: waited.append(args))
    role = cluster.plan_ray_role(nnodes, 0, None, 6379, "10.0.0.9:6379")
    ran: list[list[str]] = []
    code = cluster.run_joined(role, ["trainer"], resource_name="NPU", devices_per_node=16, timeout_s=5,
                              env={}, run_trainer=lambda argv, env: ran.append(list(argv)) or 0)  # fmt: skip
    assert code == 0 and ran == [["trainer"]]
    assert waited == [("10.0.0.9:6379", nnodes, "NPU", 16, 5)]
