"""Real Ray processes on loopback for tests, that neither load nor other Ray users can break.

- Ports: every port a node opens is a free one picked for it (GCS, Ray client server,
  dashboard agent); the dashboard is off. Ray's fixed defaults (6379, 10001, 8265, 52365)
  would clash with any other Ray on the machine and outlive a failed test.
- Load: Ray starts its workers at nice 15 (RAY_worker_niceness), so on a busy machine a
  worker that imports torch waits minutes for a CPU; here they run at the test's own priority.
- Waits are conditions with generous outer timeouts (RAY_TEST_TIMEOUT_S): a test never
  asserts how long something took, only that it happened.
- Token auth off (RAY_AUTH_MODE=disabled): Ray 2.60 would write ~/.ray/auth_token, shared
  with other Ray users; RAY_ADDRESS unset so nothing joins a cluster by accident.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pytest

from recipe.cluster import ray_node, readiness, rules
from tests.support.ports import free_port

HEAD_IP = "127.0.0.2"
WORKER_IP = "127.0.0.3"

#: Outer limit of every wait for Ray to come up: only reached when something is really broken.
RAY_TEST_TIMEOUT_S = 300.0


@contextmanager
def short_temp_dir() -> Iterator[Path]:
    """A short temp dir: Ray's unix socket paths under it must stay below 107 bytes (pytest's tmp_path is deeper)."""
    path = Path(tempfile.mkdtemp(prefix="rt-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """short_temp_dir, as a fixture."""
    with short_temp_dir() as path:
        yield path


def prepare_ray_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Set, through `monkeypatch`, the environment of our Ray processes and the in-process driver; return it."""
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    monkeypatch.setenv("RAY_worker_niceness", "0")
    # A raylet notices a lost head after this many seconds (default 60).
    monkeypatch.setenv("RAY_gcs_rpc_server_reconnect_timeout_s", "5")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    # Ray workers import recipe from the same tree as this test process.
    package_root = str(Path(rules.__file__).resolve().parents[2])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])))
    return dict(os.environ)


@pytest.fixture
def ray_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Environment for our Ray processes and the in-process driver (see the module docstring)."""
    return prepare_ray_env(monkeypatch)


def node_options(tmp: Path, name: str, ip: str, *, head: bool, devices: Mapping[str, float] | None = None,
                 num_gpus: int | None = None, num_cpus: int = 1) -> ray_node.NodeOptions:
    """A small node whose every port is free; `devices` stands in for NPUs (a custom resource)."""
    extra = [f"--dashboard-agent-listen-port={free_port(ip)}"]
    if head:
        extra += ["--include-dashboard=false", f"--ray-client-server-port={free_port(ip)}"]
    return ray_node.NodeOptions(
        num_cpus=num_cpus, num_gpus=num_gpus, resources=dict(devices or {}), node_ip_address=ip,
        temp_dir=str(tmp / name), object_store_memory=80 * 1024 * 1024, extra_args=tuple(extra),
    )


def head_role(port: int, nnodes: int = 2) -> rules.RayRole:
    """NODE_RANK 0 of `nnodes` at HEAD_IP:port."""
    return rules.plan_ray_role(nnodes, 0, HEAD_IP, port, None)


def worker_role(port: int, nnodes: int = 2, rank: int = 1) -> rules.RayRole:
    """NODE_RANK `rank` of `nnodes`, joining HEAD_IP:port."""
    return rules.plan_ray_role(nnodes, rank, HEAD_IP, port, None)


@contextmanager
def ray_nodes(tmp: Path, logs: Path, env: Mapping[str, str], *, head: Mapping[str, float] | None = None,
              worker: Mapping[str, float] | None = None, head_gpus: int | None = None,
              worker_gpus: int | None = None, with_worker: bool = True,
              worker_env: Mapping[str, str] | None = None) -> Iterator[str]:
    """A head (and a worker, unless with_worker=False) started by pid; yields the head's address.

    `worker_env`: the worker's own environment (default `env`), as another machine's would be.

    Both are up and registered when the body runs (a condition, not a sleep), and both are
    ended by pid on the way out, whatever happened.
    """
    port = free_port(HEAD_IP)
    address = f"{HEAD_IP}:{port}"
    nodes: list[ray_node.RayNode] = []
    try:
        nodes.append(ray_node.start_head(
            port, options=node_options(tmp, "h", HEAD_IP, head=True, devices=head, num_gpus=head_gpus),
            env=env, log_path=str(logs / "head.log")))
        if with_worker:
            nodes.append(ray_node.start_worker(
                address, 1, options=node_options(tmp, "w", WORKER_IP, head=False, devices=worker,
                                                 num_gpus=worker_gpus),
                env=env if worker_env is None else worker_env, log_path=str(logs / "worker.log")))
        # Every node registered, whatever devices it has: each has its one CPU.
        readiness.wait_for_nodes(address, len(nodes), "CPU", 1, timeout_s=RAY_TEST_TIMEOUT_S,  # type: ignore[arg-type]
                               poll_interval_s=0.5, head=nodes[0], node_ip_address=HEAD_IP)
        yield address
    finally:
        for node in reversed(nodes):
            node.stop()
