"""recipe.cluster.readiness, its pure part: assessing Ray's view of the nodes; reaching the head."""

from __future__ import annotations

import socket

from recipe.cluster import readiness, rules


def _node(ip: str, rank: int | None, npus: float, alive: bool = True) -> dict[str, object]:
    labels = {"ray.io/node-id": ip} | ({rules.NODE_RANK_LABEL: str(rank)} if rank is not None else {})
    return {"NodeID": f"id-{ip}", "Alive": alive, "NodeManagerAddress": ip,
            "NodeManagerHostname": f"host-{ip}", "Resources": {"CPU": 8.0, "NPU": npus},
            "Labels": labels}


def test_assess_ready() -> None:
    r = readiness.assess_nodes([_node("a", 0, 16), _node("b", 1, 16)], 2, "NPU", 16)
    assert r.is_ready and [n.node_rank for n in r.ready] == [0, 1] and not r.missing_ranks


def test_assess_names_missing_and_short_nodes() -> None:
    nodes = [_node("a", 0, 16), _node("b", 1, 8), _node("c", 2, 16, alive=False)]
    r = readiness.assess_nodes(nodes, 4, "NPU", 16)
    assert not r.is_ready
    assert r.missing_ranks == (2, 3)  # a dead entry does not count as joined
    assert r.problems(600.4) == [
        "NNODES=4: 1 node(s) with 16 NPU registered with Ray after 600s",
        "NODE_RANK=1 (b, host-b): has 8 NPU, NDEVICES_PER_NODE=16 expected",
        "NODE_RANK=2, 3: never joined (check MASTER_ADDR, RAY_PORT and that those nodes were started)",
    ]


def test_assess_counts_nodes_without_rank_labels() -> None:
    """Under KubeRay nodes carry no rank: the report counts them."""
    r = readiness.assess_nodes([_node("a", None, 8)], 3, "GPU", 8)
    # GPU count missing from Resources means 0 GPUs: present but short.
    assert r.problems(1)[1:] == ["a, host-a: has 0 GPU, NDEVICES_PER_NODE=8 expected",
                                 "2 node(s) never joined"]


def test_head_reachable() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert readiness.head_reachable(f"127.0.0.1:{port}")
    assert not readiness.head_reachable(f"127.0.0.1:{port}", timeout_s=0.5)
