"""Whether every node of the run has joined with its devices: Ray's view of the nodes, assessed and waited for."""

from __future__ import annotations

import logging
import signal
import socket
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from recipe.cluster.ray_node import RayNode
from recipe.cluster.rules import (
    NODE_RANK_LABEL,
    ClusterError,
    ResourceName,
    split_address,
)

logger = logging.getLogger(__name__)

@dataclass(frozen=True)
class NodeReport:
    """One node as Ray's GCS sees it."""

    node_id: str
    address: str
    hostname: str
    node_rank: int | None
    devices: float
    alive: bool

    def describe(self) -> str:
        """E.g. ``NODE_RANK=1 (10.0.0.2, host-b)``; rank left out under KubeRay."""
        where = f"{self.address}, {self.hostname}" if self.hostname else self.address
        return f"NODE_RANK={self.node_rank} ({where})" if self.node_rank is not None else where


#: The one rule that keeps a RayJob's size whole, and where it is kept (k8s/overlays/*-ray/kustomization.yaml).
_SIZES_AGREE = ("NNODES must be 1 + the RayJob's worker replicas; the -ray overlay sets both, and its NNODES "
                "replaces any in k8s/base/settings.env")


@dataclass(frozen=True)
class Readiness:
    """Which nodes are ready and what is still missing."""

    expected_nodes: int
    resource_name: str
    devices_per_node: int
    ready: tuple[NodeReport, ...]
    short: tuple[NodeReport, ...]
    missing_ranks: tuple[int, ...]

    @property
    def is_ready(self) -> bool:
        """Enough nodes with all their devices."""
        return len(self.ready) >= self.expected_nodes

    def problems(self, waited_s: float) -> list[str]:
        """Lines for ClusterError, naming the nodes still missing or short of devices."""
        lines = [
            f"NNODES={self.expected_nodes}: {len(self.ready)} node(s) with "
            f"{self.devices_per_node} {self.resource_name} registered with Ray after {waited_s:.0f}s"
        ]
        for node in self.short:
            lines.append(f"{node.describe()}: has {node.devices:g} {self.resource_name}, "
                         f"NDEVICES_PER_NODE={self.devices_per_node} expected")
        if self.missing_ranks:
            ranks = ", ".join(str(r) for r in self.missing_ranks)
            lines.append(f"NODE_RANK={ranks}: never joined (check MASTER_ADDR, RAY_PORT "
                         "and that those nodes were started)")
        else:
            absent = self.expected_nodes - len(self.ready) - len(self.short)
            if absent > 0:
                lines.append(f"{absent} node(s) never joined (under KubeRay: {_SIZES_AGREE})")
        return lines

    def surplus(self) -> str | None:
        """One line when more nodes joined than NNODES counts: verl trains on NNODES of them, the others idle."""
        joined = len(self.ready) + len(self.short)
        if joined <= self.expected_nodes:
            return None
        why = "check each node's NNODES" if any(n.node_rank is not None for n in self.ready) else f"under KubeRay: {_SIZES_AGREE}"
        return (f"the Ray cluster has {joined} nodes and NNODES={self.expected_nodes}: {joined - self.expected_nodes} node(s) "
                f"stay idle ({why})")


def assess_nodes(nodes: Sequence[Mapping[str, object]], expected_nodes: int,
                 resource_name: ResourceName, devices_per_node: int) -> Readiness:
    """Sort ``ray.nodes()`` entries into ready, short of devices, and missing ranks. Pure."""
    ready: list[NodeReport] = []
    short: list[NodeReport] = []
    seen_ranks: set[int] = set()
    for raw in nodes:
        if not raw.get("Alive", False):
            continue  # a dead entry stays in the GCS table after a restart
        labels = raw.get("Labels") or {}
        rank_text = labels.get(NODE_RANK_LABEL) if isinstance(labels, Mapping) else None
        rank = int(rank_text) if isinstance(rank_text, str) and rank_text.isdigit() else None
        resources = raw.get("Resources") or {}
        devices = float(resources.get(resource_name, 0.0)) if isinstance(resources, Mapping) else 0.0
        report = NodeReport(
            node_id=str(raw.get("NodeID", "")), address=str(raw.get("NodeManagerAddress", "")),
            hostname=str(raw.get("NodeManagerHostname", "")), node_rank=rank,
            devices=devices, alive=True,
        )
        if rank is not None:
            seen_ranks.add(rank)
        (ready if devices >= devices_per_node else short).append(report)
    # Ranks are known only where our own bootstrap labelled the nodes; under
    # KubeRay nothing is labelled and the report counts nodes instead.
    labelled = bool(seen_ranks)
    missing = tuple(r for r in range(expected_nodes) if r not in seen_ranks) if labelled else ()
    return Readiness(expected_nodes, resource_name, devices_per_node,
                     tuple(ready), tuple(short), missing)



def head_reachable(address: str, timeout_s: float = 2.0) -> bool:
    """True if the head's GCS port accepts a TCP connection (a reachability probe only).

    Joining and node state go through Ray; this only answers "is the head up",
    quickly, where `ray health-check` waits about 30 s on a head that is down.
    """
    host, port = split_address(address)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def list_ray_nodes(address: str, node_ip_address: str | None = None) -> Callable[[], list[dict]]:
    """Connect to the cluster as a driver; return a function listing ``ray.nodes()``.

    Caller must call ``ray.shutdown()`` (see :func:`_connected`).
    """
    import ray  # lazy: heavy, and only runs with several nodes

    if node_ip_address:
        # Which local raylet to attach to, where the host has several addresses
        # (ray.init's documented private keyword).
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False,
                 _node_ip_address=node_ip_address)
    else:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    return lambda: list(ray.nodes())


@contextmanager
def _connected(address: str, node_ip_address: str | None) -> Iterator[Callable[[], list[dict]]]:
    import ray  # lazy: ray is heavy or absent where this module is imported; loaded only here

    # ray.init installs its own SIGTERM/SIGINT handlers and ray.shutdown leaves
    # them behind: put ours back so a stop still ends our Ray node cleanly.
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def put_back() -> None:
        for sig, handler in saved.items():
            if handler is None:  # installed outside Python: nothing to put back
                continue
            try:
                signal.signal(sig, handler)
            except ValueError:  # not the main thread: ray.init did not touch them either
                pass

    try:
        table = list_ray_nodes(address, node_ip_address)
        put_back()  # at once: a connection held while the trainer runs must not change what a `docker stop` does
        yield table
    finally:
        ray.shutdown()
        put_back()


def wait_for_nodes(
    address: str,
    expected_nodes: int,
    resource_name: ResourceName,
    devices_per_node: int,
    timeout_s: float,
    *,
    poll_interval_s: float = 2.0,
    head: RayNode | None = None,
    node_ip_address: str | None = None,
    head_timeout_s: float | None = None,
) -> list[NodeReport]:
    """Block until ``expected_nodes`` alive nodes each have ``devices_per_node`` devices.

    Raises ClusterError naming the nodes still missing (by NODE_RANK where the
    nodes were started by this module) or short of devices once ``timeout_s``
    has passed, or at once if ``head`` (our own ``ray start``) has ended.
    ``head_timeout_s`` given: the head may take that long to answer, and the
    ``timeout_s`` for the nodes starts once this process is connected to it (tests
    use it so that a slow machine cannot turn "no node joined" into "no head
    answered"); None: one deadline, ``timeout_s`` from the call, for both.
    """
    start = time.monotonic()
    deadline = start + (timeout_s if head_timeout_s is None else head_timeout_s)

    def check_head() -> None:
        if head is not None and head.poll() is not None:
            raise ClusterError([f"ray start --head (pid {head.pid}): exited with code "
                                f"{head.poll()} before NNODES={expected_nodes} nodes joined"])

    # Wait for the GCS port first: ray.init against a head still starting fails
    # slowly and leaves state behind.
    while not head_reachable(address):
        check_head()
        if time.monotonic() >= deadline:
            waited = timeout_s if head_timeout_s is None else head_timeout_s
            raise ClusterError([f"address {address}: no Ray head answered within {waited:.0f}s"])
        time.sleep(min(poll_interval_s, 0.5))

    readiness: Readiness | None = None
    with _connected(address, node_ip_address) as nodes:
        if head_timeout_s is not None:
            # Connected: the head and its own node are up; the nodes' time starts now.
            deadline = time.monotonic() + timeout_s
        while True:
            check_head()
            readiness = assess_nodes(nodes(), expected_nodes, resource_name, devices_per_node)
            if readiness.is_ready:
                if readiness.surplus():
                    logger.warning("%s", readiness.surplus())
                logger.info("Ray cluster ready: %s",
                            ", ".join(n.describe() for n in readiness.ready))
                return list(readiness.ready)
            if time.monotonic() >= deadline:
                raise ClusterError(readiness.problems(time.monotonic() - start))
            time.sleep(poll_interval_s)
