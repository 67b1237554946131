"""The `ray start` command line of a head or a worker, and the RayNode process that runs it."""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from recipe.cluster.rules import (
    GCS_RECONNECT_TIMEOUT_S,
    GCS_RECONNECT_VARIABLE,
    NODE_RANK_LABEL,
    ClusterError,
    node_ip_address,
)

logger = logging.getLogger(__name__)

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


def node_options(ray_start_args: str | None) -> NodeOptions:
    """This node's options from RAY_START_ARGS (validated by recipe.settings): its `--node-ip-address`, which the
    recipe's own Ray clients on this node need too, and every flag as given."""
    words = shlex.split(ray_start_args) if ray_start_args else []
    address = node_ip_address(words)
    rest, skip = [], False
    for word in words:  # the address goes to its own field (ray_start_argv writes it once)
        if skip or word.startswith("--node-ip-address="):
            skip = False
            continue
        if word == "--node-ip-address":
            skip = True
            continue
        rest.append(word)
    return NodeOptions(node_ip_address=address, extra_args=tuple(rest))


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
    node_env = dict(os.environ if env is None else env)
    node_env.setdefault(GCS_RECONNECT_VARIABLE, str(GCS_RECONNECT_TIMEOUT_S))
    return RayNode(argv, env=node_env, log_path=log_path)
