"""Ray bootstrap for runs across several nodes.

Three ways a node of a run can meet Ray:

- ``single``: one node and no cluster given; verl's trainer starts its own local Ray.
- ``head`` / ``worker``: NNODES > 1 without KubeRay (``docker compose`` on each
  machine, or an indexed Kubernetes Job). NODE_RANK 0 starts a Ray head with
  ``ray start --head``; the others join it with ``ray start --address
  MASTER_ADDR:RAY_PORT``. The head waits until every node's devices are
  registered, then runs the trainer against that cluster; workers block while
  the head runs and leave once the head has been gone for a grace period.
- ``join-existing``: RAY_ADDRESS is set (KubeRay's RayJob runs the entrypoint as a
  Ray job on the head, where Ray sets RAY_ADDRESS): no node is started, the wait
  for the devices still runs, then the trainer joins that cluster.

Everything goes through Ray's own CLI (``ray start``) and API (``ray.init`` +
``ray.nodes()``). Functions take explicit arguments, not the settings object,
so they are tested with real Ray processes on loopback. Ray is imported
lazily: importing this module costs nothing.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal

logger = logging.getLogger(__name__)

RoleKind = Literal["single", "head", "worker", "join-existing"]
ResourceName = Literal["GPU", "NPU"]

#: Node label that carries NODE_RANK, so a failed wait can name the ranks missing.
NODE_RANK_LABEL = "grpo-recipe/node-rank"

#: A worker whose ``ray start`` dies sooner than this after starting counts as a
#: failed start (bad flags, port taken), not as the head going away.
MIN_WORKER_UPTIME_S = 30.0

#: Failed starts in a row after which a worker gives up with ClusterError.
MAX_FAILED_WORKER_STARTS = 3


class ClusterError(RuntimeError):
    """The Ray cluster could not be formed or joined.

    ``problems`` holds one line per problem, in the house form
    ``NAME=value: rule``, so the CLI can print them like config errors.
    """

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems: list[str] = list(problems)
        super().__init__("; ".join(self.problems))


@dataclass(frozen=True)
class RayRole:
    """What this node does with Ray, decided from the environment once."""

    kind: RoleKind
    #: GCS address ``host:port``: the one the head serves and workers join
    #: (MASTER_ADDR:RAY_PORT), or RAY_ADDRESS for ``join-existing``; None for ``single``.
    address: str | None
    node_rank: int
    nnodes: int
    reason: str

    @property
    def starts_ray(self) -> bool:
        """True when this node starts a Ray process of its own (head or worker)."""
        return self.kind in ("head", "worker")

    @property
    def runs_trainer(self) -> bool:
        """True when the trainer runs on this node (every role but ``worker``)."""
        return self.kind != "worker"


#: One label of a host name (RFC 1123): letters, digits and hyphens, 1 to 63, no hyphen at either end.
_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


def host_problem(host: str) -> str | None:
    """Why `host` is not an IP address or an RFC 1123 host name (None when it is one).

    An IPv6 address may come in brackets. A port does not belong here (RAY_PORT has it).
    """
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ipaddress.ip_address(bare)
        return None
    except ValueError:
        pass
    if bare != host:
        return "must be an IPv6 address inside the brackets"
    if re.fullmatch(r"[^:]+:\d*", host):
        return "must be a host name or IP address without a port (the port is RAY_PORT)"
    name = host[:-1] if host.endswith(".") else host
    labels = name.split(".")
    if len(name) > 253 or not all(_LABEL.match(label) for label in labels):
        return ("must be an IP address or a host name (RFC 1123: dot-separated labels of 1-63 letters, "
                "digits or hyphens, not starting or ending with a hyphen)")
    if labels[-1].isdigit():
        return "must be a valid IPv4 address (a host name cannot end in an all-numeric label)"
    return None


def gcs_address_problem(address: str) -> str | None:
    """Why `address` is not a Ray GCS address this module can join (None when it is).

    The join-existing path probes the head over TCP and counts its nodes before the
    trainer starts (split_address, head_reachable, wait_for_nodes), so it needs an
    explicit ``host:port``. Ray's own ``auto`` (look for a cluster started on this
    machine) and ``ray://`` (Ray Client) name nothing to probe; KubeRay sets host:port.
    """
    if "://" in address:
        return ("must be a GCS address host:port (a dashboard http:// or a Ray Client ray:// address "
                "is not one the trainer can join)")
    if address == "auto":
        return ("must be a GCS address host:port: `auto` names no head the recipe can probe and count "
                "nodes on (KubeRay sets host:port)")
    host, sep, port = address.rpartition(":")
    if not sep or not host:
        return "must be a GCS address host:port"
    if not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
        return "must be a GCS address host:port with a TCP port in [1, 65535]"
    if ":" in host and not host.startswith("["):
        return "must be a GCS address host:port, with an IPv6 host in brackets ([::1]:6379)"
    problem = host_problem(host)
    return None if problem is None else f"must be a GCS address host:port; its host {problem}"


def cluster_problems(
    nnodes: int,
    node_rank: int,
    master_addr: str | None,
    ray_port: int,
    ray_address_env: str | None = None,
) -> list[str]:
    """Every problem with the cluster variables, one line each (empty when fine).

    Pure; meant for the settings validator so these join the other config errors.
    """
    problems: list[str] = []
    if nnodes < 1:
        problems.append(f"NNODES={nnodes}: must be at least 1")
    if node_rank < 0 or (nnodes >= 1 and node_rank >= nnodes):
        problems.append(f"NODE_RANK={node_rank}: must be in [0, NNODES={nnodes})")
    if not 1 <= ray_port <= 65535:
        problems.append(f"RAY_PORT={ray_port}: must be a TCP port in [1, 65535]")
    if master_addr and host_problem(master_addr):
        problems.append(f"MASTER_ADDR={master_addr}: {host_problem(master_addr)}")
    if ray_address_env:
        if "://" in ray_address_env:
            problems.append(
                f"RAY_ADDRESS={ray_address_env}: must be a GCS address host:port "
                "(a dashboard http:// address is for `ray job submit`, not for the trainer)"
            )
        elif gcs_address_problem(ray_address_env):
            problems.append(f"RAY_ADDRESS={ray_address_env}: {gcs_address_problem(ray_address_env)}")
    elif nnodes > 1 and not master_addr:
        # Rank 0 too: its head advertises this address, and a head that guessed its own
        # (the host name) could not be joined by workers that were never told it.
        problems.append(
            f"MASTER_ADDR=: must name the NODE_RANK=0 host when NNODES={nnodes} and NODE_RANK={node_rank}"
            " (or RAY_ADDRESS a running cluster)"
        )
    return problems


def ray_auth_problems(
    nnodes: int, ray_address_env: str | None, ray_auth_mode: str | None, ray_auth_token_set: bool
) -> list[str]:
    """Problems with Ray's authentication for the cluster this node would form (empty when fine).

    Ray on the host network runs any job from anyone who reaches its ports. A cluster this
    recipe starts across machines (not KubeRay's, which makes its own token: RAY_ADDRESS set)
    therefore needs Ray's token authentication unless the user turned it off by name. Only
    whether the token is set reaches this function, never its value.
    """
    if ray_address_env:
        return []
    problems = []
    if nnodes > 1 and ray_auth_mode is None:
        problems.append(
            f"RAY_AUTH_MODE=: must be token when NNODES={nnodes} starts Ray across machines, with the same "
            "RAY_AUTH_TOKEN on every node (e.g. `openssl rand -hex 32`); RAY_AUTH_MODE=disabled only on an "
            "isolated network"
        )
    if ray_auth_mode == "token" and not ray_auth_token_set:
        problems.append("RAY_AUTH_TOKEN=: must be set (the same on every node) when RAY_AUTH_MODE=token")
    return problems


def plan_ray_role(
    nnodes: int,
    node_rank: int,
    master_addr: str | None,
    ray_port: int,
    ray_address_env: str | None,
) -> RayRole:
    """Decide this node's Ray role; raise ClusterError listing every bad variable.

    RAY_ADDRESS wins over NNODES/NODE_RANK: under KubeRay the cluster exists already.
    """
    problems = cluster_problems(nnodes, node_rank, master_addr, ray_port, ray_address_env)
    if problems:
        raise ClusterError(problems)
    if ray_address_env:
        return RayRole("join-existing", ray_address_env, node_rank, nnodes,
                       f"RAY_ADDRESS={ray_address_env} is set: join that cluster")
    if nnodes == 1:
        return RayRole("single", None, 0, 1, "NNODES=1: the trainer starts its own local Ray")
    if not master_addr:  # cluster_problems refused it above; kept for the type checker
        raise ClusterError([f"MASTER_ADDR=: must name the NODE_RANK=0 host when NNODES={nnodes}"])
    head_host = master_addr
    if ":" in head_host and not head_host.startswith("["):
        head_host = f"[{head_host}]"  # an IPv6 address: host:port would be ambiguous
    address = f"{head_host}:{ray_port}"
    if node_rank == 0:
        return RayRole("head", address, 0, nnodes,
                       f"NNODES={nnodes}, NODE_RANK=0: start the Ray head on port {ray_port}")
    return RayRole("worker", address, node_rank, nnodes,
                   f"NNODES={nnodes}, NODE_RANK={node_rank}: join the head at {address}")


def ray_executable() -> str:
    """The ``ray`` CLI next to this interpreter, else the one on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "ray")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("ray")
    if found is None:
        raise ClusterError(["ray: the `ray` command is not installed in this image"])
    return found


@dataclass(frozen=True)
class NodeOptions:
    """How to start the local Ray node; every field maps to a `ray start` flag.

    Leave ``num_gpus`` and ``resources`` unset in real runs: Ray detects GPUs and
    NPUs itself, so a node without its devices shows up as such in the wait.
    Tests set them to stand in for devices.
    """

    num_cpus: int | None = None
    num_gpus: int | None = None
    resources: Mapping[str, float] = field(default_factory=dict)
    node_ip_address: str | None = None
    temp_dir: str | None = None
    object_store_memory: int | None = None
    extra_args: tuple[str, ...] = ()


def ray_start_argv(
    *,
    node_rank: int,
    options: NodeOptions,
    head_port: int | None = None,
    address: str | None = None,
    ray: str = "ray",
) -> list[str]:
    """The ``ray start ... --block`` command for a head (head_port) or a worker (address).

    Pure. ``--block`` keeps the process in the foreground, so this process owns
    it: it ends it by pid, and it sees it end when the head goes away.
    """
    if (head_port is None) == (address is None):
        raise ValueError("give exactly one of head_port (head) or address (worker)")
    argv = [ray, "start", "--block", "--disable-usage-stats",
            f"--labels={NODE_RANK_LABEL}={node_rank}"]
    if head_port is not None:
        argv += ["--head", f"--port={head_port}"]
    else:
        argv += [f"--address={address}"]
    if options.num_cpus is not None:
        argv.append(f"--num-cpus={options.num_cpus}")
    if options.num_gpus is not None:
        argv.append(f"--num-gpus={options.num_gpus}")
    if options.resources:
        argv.append(f"--resources={json.dumps(dict(options.resources), sort_keys=True)}")
    if options.node_ip_address:
        argv.append(f"--node-ip-address={options.node_ip_address}")
    if options.temp_dir:
        argv.append(f"--temp-dir={options.temp_dir}")
    if options.object_store_memory is not None:
        argv.append(f"--object-store-memory={options.object_store_memory}")
    argv += list(options.extra_args)
    return argv


class RayNode:
    """A ``ray start --block`` process started and owned by this process."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str] | None = None,
                 log_path: str | None = None) -> None:
        self.argv: list[str] = list(argv)
        self._log = open(log_path, "ab") if log_path else None  # noqa: SIM115 - closed in stop()
        # A session of its own: stop() can end the whole group by its id without
        # touching any other Ray on the machine (`ray stop` would end them all).
        self.process = subprocess.Popen(
            self.argv, env=dict(env) if env is not None else None,
            stdout=self._log, stderr=subprocess.STDOUT if self._log else None,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        """Process id of the ``ray start`` command (also its process group id)."""
        return self.process.pid

    def poll(self) -> int | None:
        """Exit code once ended, else None."""
        return self.process.poll()

    def wait(self, timeout_s: float | None = None) -> int:
        """Block until ``ray start`` ends (a worker's ends when its head goes away)."""
        return self.process.wait(timeout_s)

    def stop(self, timeout_s: float = 30.0) -> int:
        """End the node: SIGTERM (Ray drains and ends its processes), then SIGKILL its group."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                logger.warning("ray start (pid %d) ignored SIGTERM for %.0fs; killing its group",
                               self.pid, timeout_s)
        # Children that outlived their parent (gcs_server ignores SIGTERM for a
        # while) are still in the group: end them too.
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        code = self.process.wait()
        if self._log:
            self._log.close()
        return code

    def __enter__(self) -> RayNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_head(port: int, *, options: NodeOptions = NodeOptions(),
               env: Mapping[str, str] | None = None, log_path: str | None = None) -> RayNode:
    """Start this node as the Ray head (``ray start --head --port``); returns at once.

    Readiness is checked by :func:`wait_for_nodes`, which counts the head too.
    """
    argv = ray_start_argv(node_rank=0, options=options, head_port=port, ray=ray_executable())
    logger.info("Starting the Ray head: %s", " ".join(argv))
    return RayNode(argv, env=env, log_path=log_path)


def start_worker(address: str, node_rank: int, *, options: NodeOptions = NodeOptions(),
                 env: Mapping[str, str] | None = None, log_path: str | None = None) -> RayNode:
    """Start this node as a Ray worker joining ``address`` (``ray start --address``)."""
    argv = ray_start_argv(node_rank=node_rank, options=options, address=address,
                          ray=ray_executable())
    logger.info("Joining the Ray head at %s: %s", address, " ".join(argv))
    return RayNode(argv, env=env, log_path=log_path)


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
                lines.append(f"{absent} node(s) never joined")
        return lines


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


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` -> (host, port); brackets around an IPv6 host are removed."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ClusterError([f"address {address!r}: must be host:port"])
    return host.strip("[]"), int(port)


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
    import ray

    # ray.init installs its own SIGTERM/SIGINT handlers and ray.shutdown leaves
    # them behind: put ours back so a stop still ends our Ray node cleanly.
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield list_ray_nodes(address, node_ip_address)
    finally:
        ray.shutdown()
        for sig, handler in saved.items():
            if handler is None:  # installed outside Python: nothing to put back
                continue
            try:
                signal.signal(sig, handler)
            except ValueError:  # not the main thread: ray.init did not touch them either
                pass


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
                logger.info("Ray cluster ready: %s",
                            ", ".join(n.describe() for n in readiness.ready))
                return list(readiness.ready)
            if time.monotonic() >= deadline:
                raise ClusterError(readiness.problems(time.monotonic() - start))
            time.sleep(poll_interval_s)


TrainerRunner = Callable[[Sequence[str], dict[str, str]], int]


def _run_plainly(argv: Sequence[str], env: dict[str, str]) -> int:
    """Default trainer runner: run it, return its exit code (the CLI passes its own)."""
    return subprocess.run(list(argv), env=env, check=False).returncode


@contextmanager
def _stop_on_sigterm() -> Iterator[None]:
    """Turn SIGTERM into SystemExit so ``finally`` blocks end our Ray node.

    Only possible in the main thread; elsewhere the handler stays as it is.
    """
    try:
        previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_head(
    role: RayRole,
    trainer_argv: Sequence[str],
    *,
    resource_name: ResourceName,
    devices_per_node: int,
    timeout_s: float,
    options: NodeOptions = NodeOptions(),
    env: Mapping[str, str] | None = None,
    poll_interval_s: float = 2.0,
    log_path: str | None = None,
    run_trainer: TrainerRunner = _run_plainly,
    head_timeout_s: float | None = None,
) -> int:
    """NODE_RANK 0: start the head, wait for every node, run the trainer, stop the head.

    The trainer gets RAY_ADDRESS so verl's ``ray_init.address=auto`` finds this
    cluster. Returns the trainer's exit code; ClusterError if the nodes never came.
    ``head_timeout_s``: see :func:`wait_for_nodes`.
    """
    if role.kind != "head" or role.address is None:
        raise ValueError(f"run_head needs a head role, got {role.kind}")
    base_env = dict(os.environ if env is None else env)
    _, port = split_address(role.address)
    with _stop_on_sigterm(), start_head(port, options=options, env=base_env,
                                        log_path=log_path) as node:
        wait_for_nodes(role.address, role.nnodes, resource_name, devices_per_node, timeout_s,
                       poll_interval_s=poll_interval_s, head=node,
                       node_ip_address=options.node_ip_address, head_timeout_s=head_timeout_s)
        trainer_env = {**base_env, "RAY_ADDRESS": role.address}
        return run_trainer(trainer_argv, trainer_env)


def run_joined(
    role: RayRole,
    trainer_argv: Sequence[str],
    *,
    resource_name: ResourceName,
    devices_per_node: int,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    poll_interval_s: float = 2.0,
    node_ip_address: str | None = None,
    run_trainer: TrainerRunner = _run_plainly,
) -> int:
    """RAY_ADDRESS set (KubeRay): wait for the nodes of that cluster, then run the trainer."""
    if role.kind != "join-existing" or role.address is None:
        raise ValueError(f"run_joined needs a join-existing role, got {role.kind}")
    wait_for_nodes(role.address, role.nnodes, resource_name, devices_per_node, timeout_s,
                   poll_interval_s=poll_interval_s, node_ip_address=node_ip_address)
    return run_trainer(trainer_argv, dict(os.environ if env is None else env))


def run_worker(
    role: RayRole,
    *,
    join_timeout_s: float,
    rejoin_grace_s: float,
    options: NodeOptions = NodeOptions(),
    env: Mapping[str, str] | None = None,
    probe_interval_s: float = 1.0,
    log_path: str | None = None,
    min_uptime_s: float = MIN_WORKER_UPTIME_S,
) -> int:
    """NODE_RANK > 0: join the head and stay joined while it lives.

    ``ray start --address --block`` returns when the head goes away (its raylet
    loses the GCS). If the head answers again within ``rejoin_grace_s`` (it
    crashed and its restart policy brought it back to resume), this node
    rejoins; if not, the run is over and this returns 0, so a restart policy of
    ``on-failure`` leaves it stopped. Raises ClusterError if the head never
    answers within ``join_timeout_s`` or ``ray start`` keeps failing at once.
    """
    if role.kind != "worker" or role.address is None:
        raise ValueError(f"run_worker needs a worker role, got {role.kind}")
    address = role.address
    if not _wait_reachable(address, join_timeout_s, probe_interval_s):
        raise ClusterError([f"MASTER_ADDR:RAY_PORT={address}: no Ray head answered within "
                            f"{join_timeout_s:.0f}s (NODE_RANK={role.node_rank})"])
    failed_starts = 0
    with _stop_on_sigterm():
        while True:
            started = time.monotonic()
            node = start_worker(address, role.node_rank, options=options,
                                env=dict(os.environ if env is None else env), log_path=log_path)
            try:
                code = node.wait()
            finally:
                node.stop()
            uptime = time.monotonic() - started
            failed_starts = failed_starts + 1 if uptime < min_uptime_s else 0
            logger.info("ray start on NODE_RANK=%d ended with code %d after %.0fs",
                        role.node_rank, code, uptime)
            if not _wait_reachable(address, rejoin_grace_s, probe_interval_s):
                logger.info("The Ray head at %s has been gone for %.0fs: the run is over",
                            address, rejoin_grace_s)
                return 0
            if failed_starts >= MAX_FAILED_WORKER_STARTS:
                raise ClusterError([f"NODE_RANK={role.node_rank}: ray start --address={address} "
                                    f"failed {failed_starts} times in a row (last exit code {code})"])
            logger.info("The Ray head at %s answers again: rejoining", address)


def _wait_reachable(address: str, timeout_s: float, interval_s: float) -> bool:
    """Probe the head until it answers or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        if head_reachable(address, timeout_s=min(2.0, max(interval_s, 0.1))):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)
