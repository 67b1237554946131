"""A node lost while the trainer runs (recipe.cluster.node_watch), by direct calls on real child processes.

The watch reads a node table (here a list the test changes, standing in for `ray.nodes()`; test_with_real_ray.py
kills a real Ray node) and stops the trainer, this process's child, sparing the children it is told to spare.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from recipe.cluster import node_watch
from recipe.cluster.readiness import NodeReport

HEAD = NodeReport(node_id="head", address="10.0.0.1", hostname="a", node_rank=0, devices=8.0, alive=True)
WORKER = NodeReport(node_id="worker", address="10.0.0.2", hostname="b", node_rank=1, devices=8.0, alive=True)


def _entry(node: NodeReport, alive: bool = True) -> dict[str, object]:
    return {"NodeID": node.node_id, "Alive": alive, "NodeManagerAddress": node.address}


@pytest.mark.parametrize(
    ("table", "lost"),
    [
        ([_entry(HEAD), _entry(WORKER)], []),
        ([_entry(HEAD), _entry(WORKER, alive=False)], [WORKER]),  # Ray keeps a dead node in its table
        ([_entry(HEAD)], [WORKER]),  # or no longer lists it
        ([], [HEAD, WORKER]),
        ([_entry(HEAD), _entry(WORKER), {"NodeID": "new", "Alive": True}], []),  # a node that joined later: no loss
    ],
)
def test_a_node_that_joined_and_is_not_alive_now_is_lost(table: list[dict[str, object]], lost: list[NodeReport]) -> None:
    assert node_watch.lost_nodes([HEAD, WORKER], table) == lost


def test_the_line_names_the_node_the_trainers_end_and_the_way_back() -> None:
    assert node_watch.lost_line([WORKER], 1) == (
        "NODE_RANK=1 (10.0.0.2, b): left the Ray cluster while the trainer ran (preempted, out of memory or cut off); "
        "the trainer ended with exit 1. Restart every node (the restart policy does): the run resumes from its last save"
    )
    assert "; it was stopped. " in node_watch.lost_line([WORKER], None)


def test_a_loss_stops_the_trainer_and_spares_our_ray_start() -> None:
    """The trainer (a child) gets SIGTERM at the first read that finds the worker dead; the spared child does not."""
    trainer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    ours = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    table = [_entry(HEAD), _entry(WORKER)]
    try:
        with node_watch.watching(lambda: table, [HEAD, WORKER], spare=(ours.pid,), interval_s=0.1,
                                 grace_s=5.0) as watch:  # fmt: skip
            time.sleep(0.5)
            assert trainer.poll() is None and watch.lost == []  # all alive: nothing happens
            table[1] = _entry(WORKER, alive=False)
            assert trainer.wait(timeout=10) == -signal.SIGTERM
            assert watch.settle(-signal.SIGTERM) == [WORKER]
        assert ours.poll() is None  # spared
    finally:
        for process in (trainer, ours):
            process.kill()
            process.wait()


def test_a_trainer_that_ignores_sigterm_is_killed_after_the_grace() -> None:
    trainer = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                                "signal.SIG_IGN); time.sleep(60)"], start_new_session=True)  # fmt: skip
    try:
        time.sleep(0.5)  # its handler in place
        with node_watch.watching(lambda: [_entry(HEAD)], [HEAD, WORKER], interval_s=0.1, grace_s=0.5):
            assert trainer.wait(timeout=10) == -signal.SIGKILL
    finally:
        trainer.kill()
        trainer.wait()


def test_after_a_failed_trainer_ray_is_given_time_to_notice_the_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainer failed on its own first (its TaskRunner was on the lost node): the loss shows a little later."""
    reads = iter([[_entry(HEAD), _entry(WORKER)]] + [[_entry(HEAD), _entry(WORKER, alive=False)]] * 10)
    monkeypatch.setattr(node_watch, "LOSS_SETTLE_S", 5.0)
    with node_watch.watching(lambda: next(reads), [HEAD, WORKER], interval_s=60) as watch:
        assert watch.settle(1) == [WORKER]
    with node_watch.watching(lambda: [_entry(HEAD), _entry(WORKER)], [HEAD, WORKER], interval_s=60) as watch:
        assert watch.settle(0) == []  # a finished run asks nothing
