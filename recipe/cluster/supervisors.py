"""The head, worker and joined supervisors: each node's part of a run across several nodes, start to exit."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from recipe.cluster.ray_node import NodeOptions, start_head, start_worker
from recipe.cluster.node_watch import lost_line, watching
from recipe.cluster.readiness import NodeReport, _connected, head_reachable, wait_for_nodes
from recipe.cluster.rules import ClusterError, RayRole, ResourceName, split_address
from recipe.cluster.shared_storage import ROOT_VARIABLE, check_shared_storage

logger = logging.getLogger(__name__)

#: A worker whose ``ray start`` dies sooner than this after starting counts as a
#: failed start (bad flags, port taken), not as the head going away.
MIN_WORKER_UPTIME_S = 30.0

#: Failed starts in a row after which a worker gives up with ClusterError.
MAX_FAILED_WORKER_STARTS = 3



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
    checkpoint_dir: str = "",
) -> int:
    """NODE_RANK 0: start the head, wait for every node, check they share the checkpoint root, run the trainer.

    The trainer gets RAY_ADDRESS so verl's ``ray_init.address=auto`` finds this
    cluster. Returns the trainer's exit code; ClusterError if the nodes never came,
    RecipeConfigError if a node cannot read the checkpoint root (``env``'s ROOT_VARIABLE,
    when set; CHECKPOINT_DIR named as ``checkpoint_dir``). ``head_timeout_s``: see :func:`wait_for_nodes`.
    """
    if role.kind != "head" or role.address is None:
        raise ValueError(f"run_head needs a head role, got {role.kind}")
    base_env = dict(os.environ if env is None else env)
    _, port = split_address(role.address)
    with _stop_on_sigterm(), start_head(port, options=options, env=base_env,
                                        log_path=log_path) as node:
        nodes = wait_for_nodes(role.address, role.nnodes, resource_name, devices_per_node, timeout_s,
                               poll_interval_s=poll_interval_s, head=node,
                               node_ip_address=options.node_ip_address, head_timeout_s=head_timeout_s)
        if base_env.get(ROOT_VARIABLE):
            check_shared_storage(role.address, nodes, Path(base_env[ROOT_VARIABLE]), checkpoint_dir,
                                 options.node_ip_address)
        trainer_env = {**base_env, "RAY_ADDRESS": role.address}
        return _train_watched(role.address, nodes, options.node_ip_address, run_trainer, trainer_argv, trainer_env,
                              spare=(node.pid,))


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
    checkpoint_dir: str = "",
) -> int:
    """RAY_ADDRESS set (KubeRay): wait for the nodes of that cluster, check they share the checkpoint root, train."""
    if role.kind != "join-existing" or role.address is None:
        raise ValueError(f"run_joined needs a join-existing role, got {role.kind}")
    base_env = dict(os.environ if env is None else env)
    nodes = wait_for_nodes(role.address, role.nnodes, resource_name, devices_per_node, timeout_s,
                           poll_interval_s=poll_interval_s, node_ip_address=node_ip_address)
    if base_env.get(ROOT_VARIABLE):
        check_shared_storage(role.address, nodes, Path(base_env[ROOT_VARIABLE]), checkpoint_dir, node_ip_address)
    return _train_watched(role.address, nodes, node_ip_address, run_trainer, trainer_argv, base_env)


def _train_watched(address: str, nodes: Sequence[NodeReport], node_ip_address: str | None, run_trainer: TrainerRunner,
                   argv: Sequence[str], env: dict[str, str], spare: Sequence[int] = ()) -> int:  # fmt: skip
    """Run the trainer while Ray's node table is watched (recipe.cluster.node_watch): its exit code, or ClusterError
    naming the nodes lost during the run. `spare`: child processes that are not the trainer (our `ray start`)."""
    with _connected(address, node_ip_address) as table, watching(table, nodes, spare=spare) as watch:
        code = run_trainer(argv, env)
        lost = watch.settle(code)
    if lost:
        raise ClusterError([lost_line(lost, None if watch.lost else code)])
    return code


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
    run_ended: Callable[[], str | None] = lambda: "",
) -> int:
    """NODE_RANK > 0: join the head and stay joined while it lives.

    ``ray start --address --block`` returns when the head goes away (its raylet
    loses the GCS). If the head answers again within ``rejoin_grace_s`` (it
    crashed and its restart policy brought it back to resume), this node
    rejoins. If not, ``run_ended()`` says how the run finished (returns 0, so a
    restart policy of ``on-failure`` leaves it stopped), or None: the head was lost
    before the run finished, ClusterError (exit 3, so the restart policy brings this
    node back to wait for a restarted head). Raises ClusterError too if the head never
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
                ended = run_ended()
                if ended is None:
                    raise ClusterError([f"NODE_RANK={role.node_rank}: the Ray head at {address} left before the run "
                                        f"finished and has been gone for {rejoin_grace_s:.0f}s (killed, preempted or "
                                        "cut off). Restart every node (the restart policy does): the run resumes "
                                        "from its last save"])  # fmt: skip
                logger.info("The Ray head at %s has been gone for %.0fs: the run is over%s",
                            address, rejoin_grace_s, f" ({ended})" if ended else "")
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
