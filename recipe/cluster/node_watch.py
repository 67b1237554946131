"""A node lost while the trainer runs: noticed in Ray's node table, and the run ended in bounded time.

On real clusters this is the common failure: a worker is preempted, OOM-killed or cut off. verl's driver then
fails at once (its TaskRunner was on the lost node: Ray's ActorUnavailableError, seconds) or waits in a
collective for the peer that will never answer (30 minutes by default, the hang users report upstream). The
head's `run` does not wait for either: while the trainer runs it reads Ray's node table every
CHECK_INTERVAL_S; once a node that joined at the start is dead, it asks the trainer to stop (SIGTERM to its process group), gives
it STOP_GRACE_S, then kills it (SIGKILL), and `run` ends with one line naming
the node (ClusterError, exit 3). Compose's on-failure policy or the Job's backoffLimit then restarts every node,
and the run resumes from its last save. Ray itself marks a node dead once its health checks fail (about 15 s
with Ray 2.60's defaults for a killed node, a check every 3 s, 5 failures; about 65 s for one cut off), so the bound is
recipe.cluster.rules.lost_node_bound_s() after the loss. A trainer that failed on its own first is asked about too: its status is
the run's, and the line says which node was lost (Ray may need LOSS_SETTLE_S to notice).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from recipe.cluster.readiness import NodeReport
from recipe.cluster.rules import NODE_CHECK_INTERVAL_S, TRAINER_STOP_GRACE_S

logger = logging.getLogger(__name__)

#: How often the node table is read while the trainer runs, and the trainer's grace to stop (recipe.cluster.rules,
#: where `plan` states the bound they make).
CHECK_INTERVAL_S, STOP_GRACE_S = NODE_CHECK_INTERVAL_S, TRAINER_STOP_GRACE_S
#: After a trainer that failed on its own: how long Ray may take to mark the lost node dead (its health checks).
LOSS_SETTLE_S = 30.0

NodeTable = Callable[[], Sequence[Mapping[str, object]]]


def lost_nodes(started: Sequence[NodeReport], table: Sequence[Mapping[str, object]]) -> list[NodeReport]:
    """The nodes of `started` that Ray's node table (ray.nodes()) no longer lists as alive. Pure."""
    alive = {str(node.get("NodeID", "")) for node in table if node.get("Alive")}
    return [node for node in started if node.node_id not in alive]


def lost_line(lost: Sequence[NodeReport], code: int | None) -> str:
    """The one line `run` ends with when nodes were lost during the run."""
    nodes = ", ".join(node.describe() for node in lost)
    ended = "it was stopped" if code is None else f"the trainer ended with exit {code}"
    return (f"{nodes}: left the Ray cluster while the trainer ran (preempted, out of memory or cut off); {ended}. "
            "Restart every node (the restart policy does): the run resumes from its last save")


def _children(pid: int) -> list[int]:
    """The pids whose parent is `pid` (Linux /proc), the trainer's among them."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # The field after the command (which may hold blanks and parentheses) is the state, then the parent.
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 1 and fields[1] == str(pid):
            found.append(int(entry.name))
    return found


class NodeWatch:
    """Reads the node table in a thread; on a loss, stops the trainer started by this process (see the module)."""

    def __init__(self, table: NodeTable, started: Sequence[NodeReport], *, spare: Sequence[int] = (),
                 interval_s: float = CHECK_INTERVAL_S, grace_s: float = STOP_GRACE_S) -> None:  # fmt: skip
        self.table, self.started, self.spare = table, list(started), set(spare)
        self.interval_s, self.grace_s = interval_s, grace_s
        self.lost: list[NodeReport] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="node-watch", daemon=True)

    def _read(self) -> list[NodeReport] | None:
        try:
            return lost_nodes(self.started, self.table())
        except Exception as error:  # noqa: BLE001 - a failed read is no loss; the next one may answer
            logger.debug("reading Ray's node table failed: %s", error)
            return None

    def _watch(self) -> None:
        while not self._done.wait(self.interval_s):
            lost = self._read()
            if lost:
                self.lost = lost
                logger.error("%s; stopping the trainer", lost_line(lost, None))
                self._stop_trainer()
                return

    def _stop_trainer(self) -> None:
        # The trainer is this process's child; our own `ray start` (`spare`) is one too, and stays until we end it.
        trainers = [pid for pid in _children(os.getpid()) if pid not in self.spare]
        for pid in trainers:
            _signal(pid, signal.SIGTERM)
        if self._done.wait(self.grace_s):
            return
        for pid in trainers:
            _signal(pid, signal.SIGKILL)

    def settle(self, code: int) -> list[NodeReport]:
        """After the trainer ended with `code`: the nodes lost (a failed trainer waits up to LOSS_SETTLE_S for Ray)."""
        self._done.set()
        if self.lost or code == 0:
            return self.lost
        deadline = time.monotonic() + LOSS_SETTLE_S
        while time.monotonic() < deadline:
            lost = self._read()
            if lost:
                return lost
            time.sleep(min(self.interval_s, 2.0))
        return []


def _signal(pid: int, signum: int) -> None:
    """`signum` to the trainer's process group where it leads one (recipe.run.trainer.execute), else to it alone."""
    try:
        if os.getpgid(pid) == pid and pid != os.getpgid(0):
            os.killpg(pid, signum)
        else:
            os.kill(pid, signum)
    except OSError:
        pass  # it ended meanwhile


@contextmanager
def watching(table: NodeTable, started: Sequence[NodeReport], *, spare: Sequence[int] = (),
             **options: float) -> Iterator[NodeWatch]:  # fmt: skip
    """A NodeWatch running while inside."""
    watch = NodeWatch(table, started, spare=spare, **options)
    watch._thread.start()
    try:
        yield watch
    finally:
        watch._done.set()
