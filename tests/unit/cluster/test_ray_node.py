"""recipe.cluster.ray_node: the `ray start` command line of a head and a worker."""

from __future__ import annotations

import pytest

from recipe.cluster import ray_node


def test_ray_start_argv_head() -> None:
    options = ray_node.NodeOptions(num_cpus=2, resources={"NPU": 16}, node_ip_address="10.0.0.1",
                                  temp_dir="/tmp/r", extra_args=("--include-dashboard=false",))
    argv = ray_node.ray_start_argv(node_rank=0, options=options, head_port=6379, ray="ray")
    assert argv == [
        "ray", "start", "--block", "--disable-usage-stats", "--labels=grpo-recipe/node-rank=0",
        "--head", "--port=6379", "--num-cpus=2", '--resources={"NPU": 16}',
        "--node-ip-address=10.0.0.1", "--temp-dir=/tmp/r", "--include-dashboard=false",
    ]


def test_ray_start_argv_worker_leaves_devices_to_ray() -> None:
    argv = ray_node.ray_start_argv(node_rank=3, options=ray_node.NodeOptions(), address="h:6379")
    assert argv == ["ray", "start", "--block", "--disable-usage-stats",
                    "--labels=grpo-recipe/node-rank=3", "--address=h:6379"]
    assert not any(a.startswith(("--num-gpus", "--resources")) for a in argv)


def test_ray_start_argv_needs_exactly_one_of_head_or_address() -> None:
    with pytest.raises(ValueError):
        ray_node.ray_start_argv(node_rank=0, options=ray_node.NodeOptions())
    with pytest.raises(ValueError):
        ray_node.ray_start_argv(node_rank=0, options=ray_node.NodeOptions(), head_port=1, address="h:1")
