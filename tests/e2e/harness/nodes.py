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
import shutil
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
    temp_dir: str

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

    def user_settings(self, rank: int, temp_dir: str | None = None) -> dict[str, str]:
        """What the user of two machines writes into NODE_RANK `rank`'s `.env`: the run's settings and the node's
        own; `temp_dir`: the node's own folder for Ray's files (start_node's). The Compose test renders exactly
        these (tests/deploy/test_launch_environment.py)."""
        ip = HEAD_IP if rank == 0 else WORKER_IP
        flags = [f"--node-ip-address={ip}", f"--dashboard-agent-listen-port={free_port(ip)}"]
        flags += [f"--temp-dir={temp_dir}"] if temp_dir else []
        if rank == 0:
            flags += ["--include-dashboard=false", f"--ray-client-server-port={free_port(ip)}"]
        return {
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

    def environment(self, rank: int, temp_dir: str | None = None) -> dict[str, str]:
        """The environment of NODE_RANK `rank`'s `run`: the machine's (CPU stand-ins) and the user's settings."""
        return {
            **os.environ,
            **cpu_environment(),
            # The machine: one GPU on each node's raylet (Ray's own override), the CPU trainer behind `run`.
            "RAY_OVERRIDE_RESOURCES": json.dumps({"GPU": 1, "CPU": 16}),
            "RECIPE_TEST_TRAINER": shlex.join([sys.executable, "-m", "tests.e2e.harness.cpu_trainer"]),
            **self.user_settings(rank, temp_dir),
        }


def new_cluster(settings: dict[str, str]) -> Cluster:
    """A free GCS port on the head's address and a fresh token."""
    return Cluster(free_port(HEAD_IP), secrets.token_hex(32), settings)


def start_node(cluster: Cluster, rank: int, overrides: list[str], log: Path) -> Node:
    """`entrypoint.py run -- <overrides>` as NODE_RANK `rank`, in a session of its own, logging to `log`."""
    # Each node's Ray files in a folder of its own, as on its own machine: a head in the default /tmp/ray would
    # leave /tmp/ray/ray_current_cluster behind if killed, and every later `ray.init()` on this host would try
    # to join it (the one-node e2e's trainer among them). kill_node removes it.
    temp_dir = tempfile.mkdtemp(prefix=f"e2e-ray{rank}-", dir="/tmp")
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", DRIVER, "run", "--", *overrides],
            # In the run's folder: Hydra writes its outputs/ where the trainer starts (the checkout stays clean).
            env=cluster.environment(rank, temp_dir), cwd=log.parent, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    return Node(rank, HEAD_IP if rank == 0 else WORKER_IP, process, log, temp_dir)


def freeze_node(node: Node) -> None:
    """SIGSTOP everything of the node at once, as a machine cut off or frozen: its sockets stay open, so no peer
    hears of it (a killed process's sockets are reset, and gloo's peers fail at once); only timeouts tell."""
    for process in node.processes():
        try:
            process.suspend()
        except psutil.Error:
            pass


def kill_node(node: Node, *, clean: bool = True) -> None:
    """SIGKILL everything of the node at once, as a machine that is lost: its `run`, raylet and workers; with
    `clean`, its Ray folder goes too (the machine is gone)."""
    for process in node.processes():
        try:
            process.kill()
        except psutil.Error:
            pass
    if clean:
        try:
            node.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        shutil.rmtree(node.temp_dir, ignore_errors=True)


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


#: A torch.distributed collective in a py-spy stack, or Megatron's wait for an asynchronous one (its gradient
#: buffers'): where a rank waits for its peers.
COLLECTIVE_FRAMES = ("torch/distributed/distributed_c10d.py", "megatron/core/distributed/param_and_grad_buffer.py")


def inside_collective(dump: str) -> bool:
    """A py-spy dump of a rank waiting in the actor update for its peers."""
    return "update_actor" in dump and any(frame in dump for frame in COLLECTIVE_FRAMES)


def _title(process: psutil.Process | None) -> str:
    """The process title Ray gives its worker (`ray::Class.method` while a task runs), or "" when gone."""
    try:
        return " ".join(process.cmdline()) if process else ""
    except psutil.Error:
        return ""


def training_rank(node: Node) -> psutil.Process | None:
    """The node's Megatron rank: the Ray worker of verl's fused WorkerDict actor (its process title says so)."""
    return next((process for process in node.processes() if _title(process).startswith("ray::WorkerDict")), None)


def _py_spy(pid: int) -> str:
    """py-spy's dump of every thread of `pid`: its Python frames, innermost first."""
    py_spy = str(Path(sys.executable).parent / "py-spy")
    return subprocess.run([py_spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60,
                          check=False).stdout  # fmt: skip


def hold_inside_update(head: Node, worker: Node, timeout_s: float) -> str | None:
    """Catch both Megatron ranks inside the actor update's collectives: once the worker's rank runs the update
    (Ray's process title names the task running), it is stopped where it is (SIGSTOP), so the head's rank waits
    for it in the update's next collective; that wait, shown by py-spy's dump of the head's rank, is returned
    (None: the update never came, or the head's rank never waited in a collective). The worker is then the
    caller's to kill: a machine lost while its peer waits on it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and head.process.poll() is None:
        rank = training_rank(worker)
        if "update_actor" in _title(rank):
            assert rank is not None
            rank.suspend()
            waiting = training_rank(head)
            for _ in range(30):
                dump = _py_spy(waiting.pid) if waiting else ""
                if inside_collective(dump):
                    return dump
                time.sleep(1.0)
            return None
        time.sleep(0.1)
    return None
