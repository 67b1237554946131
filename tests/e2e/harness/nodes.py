"""Two `entrypoint.py run` processes, started as two machines start them, each on its own loopback address.

Each node is the recipe's own command line, `entrypoint.py run -- <overrides>`, with the settings a user of
two machines gives: NNODES=2, its NODE_RANK, MASTER_ADDR (the head's address), RAY_PORT, RAY_AUTH_MODE=token
with one RAY_AUTH_TOKEN, one device per node (NDEVICES_PER_NODE=1), and RAY_START_ARGS with the node's own
address (--node-ip-address 127.0.0.2 or .3) and a dashboard agent port of its own (two raylets share one
host's ports here; two machines do not). What stands in for the machines, and nothing else:
- one accelerator per node: DRIVER runs recipe.cli.main after making the device detection report one device,
  and each node's raylet declares one GPU through Ray's own RAY_OVERRIDE_RESOURCES (what Ray's autoscaler
  sets): the CPU platform's stand-in device, as in the one-node e2e (`ray_init.num_gpus=1` there);
- the trainer's CPU mapping: RECIPE_TEST_TRAINER names tests/e2e/harness/cpu_trainer.py, which maps the
  argv `run` gives (tests/e2e/harness/plan.py) and execs it.

ActorObserver reads where every actor ran from Ray's own state (the GCS actor table, which needs no
dashboard) while the run goes on.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from tests.e2e.harness.plan import cpu_environment
from tests.support.ports import free_port

HEAD_IP, WORKER_IP = "127.0.0.2", "127.0.0.3"

#: `entrypoint.py` with a stand-in accelerator: the device detection still runs, and reports one device.
DRIVER = textwrap.dedent(
    """
    import dataclasses, os, sys
    sys.argv[0] = "entrypoint.py"
    from recipe import cli, plan

    detect = plan.detect_device

    def detect_with_devices(*args, **kwargs):
        return dataclasses.replace(detect(*args, **kwargs), visible_devices=1)

    plan.detect_device = detect_with_devices
    sys.exit(cli.main(sys.argv[1:]))
    """
)

#: Snapshots of the cluster's actors from the GCS, every 2 s, into argv[2] (JSON), until the cluster is gone.
OBSERVER = textwrap.dedent(
    """
    import json, os, socket, sys, time
    import ray
    from ray._private import state

    address, out, node_ip = sys.argv[1:4]
    host, port = address.rsplit(":", 1)
    while True:  # the head's GCS is not up yet when both nodes have only just been started
        try:
            socket.create_connection((host, int(port)), timeout=2).close()
            break
        except OSError:
            time.sleep(1)
    ray.init(address=address, _node_ip_address=node_ip, log_to_driver=False, namespace="e2e-observer")
    seen = {}
    while True:
        nodes = {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes()}
        for actor_id, info in state.actors().items():
            seen[actor_id] = {"class": info["ActorClassName"], "node_id": info["Address"]["NodeID"],
                              "node_ip": nodes.get(info["Address"]["NodeID"]), "state": info["State"],
                              "pid": info["Pid"]}
        with open(out + ".tmp", "w") as handle:
            json.dump({"nodes": nodes, "actors": seen}, handle)
        os.replace(out + ".tmp", out)
        time.sleep(2)
    """
)


@dataclass
class Node:
    """One machine's `entrypoint.py run`: its process (a session of its own) and its log."""

    rank: int
    ip: str
    process: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def processes(self) -> list[psutil.Process]:
        """The node's `run` and everything below it: its `ray start`, raylet, and the Ray workers on it."""
        try:
            root = psutil.Process(self.process.pid)
            return [root, *root.children(recursive=True)]
        except psutil.Error:
            return []


@dataclass(frozen=True)
class Cluster:
    """What both nodes share: the head's address, Ray's token, the settings both `run`s get."""

    port: int
    token: str
    settings: dict[str, str]

    @property
    def address(self) -> str:
        return f"{HEAD_IP}:{self.port}"

    def environment(self, rank: int) -> dict[str, str]:
        """The environment of NODE_RANK `rank`'s `run`: the machine's (CPU stand-ins) and the user's settings."""
        ip = HEAD_IP if rank == 0 else WORKER_IP
        # Each node's Ray files in a folder of its own, as on its own machine: a head in the default /tmp/ray would
        # leave /tmp/ray/ray_current_cluster behind if killed, and every later `ray.init()` on this host would try
        # to join it (the one-node e2e's trainer among them).
        temp_dir = tempfile.mkdtemp(prefix=f"e2e-ray{rank}-", dir="/tmp")
        flags = [f"--node-ip-address={ip}", f"--dashboard-agent-listen-port={free_port(ip)}", f"--temp-dir={temp_dir}"]
        if rank == 0:
            flags += ["--include-dashboard=false", f"--ray-client-server-port={free_port(ip)}"]
        return {
            **os.environ,
            **cpu_environment(),
            # The machine: one GPU on each node's raylet (Ray's own override), the CPU trainer behind `run`.
            "RAY_OVERRIDE_RESOURCES": json.dumps({"GPU": 1, "CPU": 16}),
            "RECIPE_TEST_TRAINER": shlex.join([sys.executable, "-m", "tests.e2e.harness.cpu_trainer"]),
            # The user's settings of two machines.
            **self.settings,
            "NNODES": "2",
            "NODE_RANK": str(rank),
            "MASTER_ADDR": HEAD_IP,
            "RAY_PORT": str(self.port),
            "NDEVICES_PER_NODE": "1",
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": self.token,
            "RAY_START_ARGS": shlex.join(flags),
        }


def new_cluster(settings: dict[str, str]) -> Cluster:
    """A free GCS port on the head's address and a fresh token."""
    return Cluster(free_port(HEAD_IP), secrets.token_hex(32), settings)


def start_node(cluster: Cluster, rank: int, overrides: list[str], log: Path) -> Node:
    """`entrypoint.py run -- <overrides>` as NODE_RANK `rank`, in a session of its own, logging to `log`."""
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", DRIVER, "run", "--", *overrides],
            # In the run's folder: Hydra writes its outputs/ where the trainer starts (the checkout stays clean).
            env=cluster.environment(rank), cwd=log.parent, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    return Node(rank, HEAD_IP if rank == 0 else WORKER_IP, process, log)


def kill_node(node: Node) -> None:
    """SIGKILL everything of the node at once, as a machine that is lost: its `run`, raylet and workers."""
    for process in node.processes():
        try:
            process.kill()
        except psutil.Error:
            pass


class ActorObserver:
    """A Ray driver beside the run that records every actor's node from the GCS (ray._private.state.actors)."""

    def __init__(self, cluster: Cluster, out: Path, log: Path) -> None:
        self.out = out
        env = {**cluster.environment(0), "RAY_ADDRESS": ""}
        with log.open("wb") as handle:
            self.process = subprocess.Popen([sys.executable, "-c", OBSERVER, cluster.address, str(out), HEAD_IP],
                                            env=env, cwd=log.parent, stdout=handle, stderr=subprocess.STDOUT,
                                            start_new_session=True)  # fmt: skip

    def stop(self) -> dict[str, Any]:
        """End the observer; the last snapshot ({"nodes": {id: ip}, "actors": {id: {...}}})."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()
        return json.loads(self.out.read_text()) if self.out.exists() else {"nodes": {}, "actors": {}}


def wait_until(condition: Any, timeout_s: float, interval_s: float = 1.0) -> bool:
    """Poll `condition()` until it is true (True) or `timeout_s` passed (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval_s)
    return bool(condition())
