"""recipe.cluster.supervisors without real Ray: what each node's supervisor starts, waits for, runs and returns.

`ray start`, the wait and the storage check are replaced by recorders, and time by a fake clock, so each
test reads off exactly what a user's node would do: which node it starts, how many nodes it waits for (all
of them, never one short), what the trainer gets, when a worker rejoins, gives up or leaves quietly.
tests/unit/cluster/test_with_real_ray.py runs the same supervisors on real Ray.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import threading
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import pytest

from recipe.cluster import node_watch, readiness, rules, supervisors
from recipe.cluster.ray_node import NodeOptions
from recipe.cluster.shared_storage import ROOT_VARIABLE
from recipe.errors import RecipeConfigError

ADDRESS = "10.0.0.1:6390"


def test_role_checks_in_runners() -> None:
    single = rules.plan_ray_role(1, 0, None, 6379, None)
    with pytest.raises(ValueError, match="^run_head needs a head role, got single$"):
        supervisors.run_head(single, ["true"], resource_name="GPU", devices_per_node=8, timeout_s=1)
    with pytest.raises(ValueError, match="^run_worker needs a worker role, got single$"):
        supervisors.run_worker(single, join_timeout_s=1, rejoin_grace_s=1)
    with pytest.raises(ValueError, match="^run_joined needs a join-existing role, got single$"):
        supervisors.run_joined(single, ["true"], resource_name="GPU", devices_per_node=8, timeout_s=1)


@pytest.mark.parametrize("kind", ["head", "worker", "join-existing"])
def test_a_role_without_an_address_is_refused(kind: rules.RoleKind) -> None:
    role = rules.RayRole(kind, None, 1, 2, "hand-made")
    with pytest.raises(ValueError, match=f"got {kind}$"):
        if kind == "head":
            supervisors.run_head(role, ["true"], resource_name="GPU", devices_per_node=8, timeout_s=1)
        elif kind == "worker":
            supervisors.run_worker(role, join_timeout_s=1, rejoin_grace_s=1)
        else:
            supervisors.run_joined(role, ["true"], resource_name="GPU", devices_per_node=8, timeout_s=1)


def test_importing_every_room_of_cluster_does_not_import_ray() -> None:
    code = "import sys, recipe.cluster.supervisors; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().lower()) is False


def test_the_plain_trainer_runner_returns_the_trainer_exit_code() -> None:
    assert supervisors._run_plainly(["/bin/sh", "-c", 'exit "$CODE"'], {"CODE": "3"}) == 3


# --- recorders standing in for ray start, the wait and the storage check -----------------------------------


@dataclass
class Recorded:
    """Everything the supervisor asked for, in order."""

    events: list[tuple[object, ...]] = field(default_factory=list)
    nodes: list[readiness.NodeReport] = field(default_factory=lambda: [
        readiness.NodeReport("id-a", "10.0.0.1", "a", 0, 8, True),
        readiness.NodeReport("id-b", "10.0.0.2", "b", 1, 8, True)])

    def trainer(self, code: int = 0) -> supervisors.TrainerRunner:
        def run(argv: Sequence[str], env: dict[str, str]) -> int:
            self.events.append(("trainer", list(argv), env))
            return code
        return run


class FakeHead:
    #: No process: the node watch's spared pid (our `ray start`) is one no process has.
    pid = -1

    def __init__(self, recorded: Recorded) -> None:
        self.recorded = recorded

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.recorded.events.append(("head stopped",))


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> Recorded:
    rec = Recorded()

    def start_head(port: int, **kwargs: object) -> FakeHead:
        rec.events.append(("start head", port, kwargs))
        return FakeHead(rec)

    def wait_for_nodes(*args: object, **kwargs: object) -> list[readiness.NodeReport]:
        # The head is passed as itself: the wait must stop if our own ray start dies.
        kwargs = {k: ("our head" if isinstance(v, FakeHead) else v) for k, v in kwargs.items()}
        rec.events.append(("wait", args, kwargs))
        return rec.nodes

    def check_shared_storage(*args: object) -> None:
        rec.events.append(("storage", *args))

    @contextmanager
    def connected(address: str, node_ip_address: str | None) -> Iterator[Callable[[], list[dict[str, object]]]]:
        # Ray's node table while the trainer runs (recipe.cluster.node_watch): every node that joined, alive.
        yield lambda: [{"NodeID": node.node_id, "Alive": True} for node in rec.nodes]

    monkeypatch.setattr(supervisors, "start_head", start_head)
    monkeypatch.setattr(supervisors, "wait_for_nodes", wait_for_nodes)
    monkeypatch.setattr(supervisors, "check_shared_storage", check_shared_storage)
    monkeypatch.setattr(supervisors, "_connected", connected)
    # A failed trainer: no node is lost here, and Ray is not waited for (node_watch's own tests wait for it).
    monkeypatch.setattr(node_watch, "LOSS_SETTLE_S", 0.0)
    return rec


HEAD = rules.plan_ray_role(2, 0, "10.0.0.1", 6390, None)


def test_the_head_starts_ray_waits_for_every_node_then_runs_the_trainer(recorded: Recorded) -> None:
    options = NodeOptions(num_cpus=4, node_ip_address="10.0.0.1")
    code = supervisors.run_head(HEAD, ["python", "-m", "verl"], resource_name="GPU", devices_per_node=8,
                                timeout_s=600, options=options, env={"HOME": "/home/u"}, poll_interval_s=1.5,
                                log_path="/tmp/head.log", run_trainer=recorded.trainer(3), head_timeout_s=900)
    assert code == 3  # the trainer's own exit code is the node's
    assert recorded.events == [
        ("start head", 6390, {"options": options, "env": {"HOME": "/home/u"}, "log_path": "/tmp/head.log"}),
        ("wait", (ADDRESS, 2, "GPU", 8, 600), {"poll_interval_s": 1.5, "head": "our head",
                                               "node_ip_address": "10.0.0.1", "head_timeout_s": 900}),
        # verl's ray_init.address=auto finds this cluster through RAY_ADDRESS.
        ("trainer", ["python", "-m", "verl"], {"HOME": "/home/u", "RAY_ADDRESS": ADDRESS}),
        ("head stopped",),
    ]


def test_the_head_by_default(recorded: Recorded, monkeypatch: pytest.MonkeyPatch) -> None:
    """No env given: this process's environment; the wait polls every 2 s, one deadline, no storage check."""
    monkeypatch.setattr(supervisors.os, "environ", {"FROM": "this process"})
    supervisors.run_head(HEAD, ["t"], resource_name="NPU", devices_per_node=16, timeout_s=60,
                         run_trainer=recorded.trainer())
    assert recorded.events == [
        ("start head", 6390, {"options": NodeOptions(), "env": {"FROM": "this process"}, "log_path": None}),
        ("wait", (ADDRESS, 2, "NPU", 16, 60), {"poll_interval_s": 2.0, "head": "our head",
                                              "node_ip_address": None, "head_timeout_s": None}),
        ("trainer", ["t"], {"FROM": "this process", "RAY_ADDRESS": ADDRESS}),
        ("head stopped",),
    ]


@pytest.mark.parametrize("checkpoint_dir", ["/checkpoints", None])
def test_the_head_checks_the_checkpoint_root_is_shared_before_training(recorded: Recorded,
                                                                       checkpoint_dir: str | None) -> None:
    extra = {} if checkpoint_dir is None else {"checkpoint_dir": checkpoint_dir}
    supervisors.run_head(HEAD, ["t"], resource_name="NPU", devices_per_node=16, timeout_s=60,
                         options=NodeOptions(node_ip_address="10.0.0.1"), env={ROOT_VARIABLE: "/ck/p/e"},
                         run_trainer=recorded.trainer(), **extra)  # type: ignore[arg-type]
    assert [e[0] for e in recorded.events] == ["start head", "wait", "storage", "trainer", "head stopped"]
    assert recorded.events[2] == ("storage", ADDRESS, recorded.nodes, Path("/ck/p/e"), checkpoint_dir or "",
                                  "10.0.0.1")


def test_the_head_never_trains_on_nodes_that_do_not_share_the_root(recorded: Recorded,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    def not_shared(*args: object) -> None:
        raise RecipeConfigError(["NODE_RANK=1 (10.0.0.2, b): cannot read ..."])

    monkeypatch.setattr(supervisors, "check_shared_storage", not_shared)
    with pytest.raises(RecipeConfigError):
        supervisors.run_head(HEAD, ["t"], resource_name="NPU", devices_per_node=16, timeout_s=60,
                             env={ROOT_VARIABLE: "/ck"}, run_trainer=recorded.trainer())
    assert [e[0] for e in recorded.events] == ["start head", "wait", "head stopped"]


def test_a_sigterm_on_the_head_stops_its_ray_node(recorded: Recorded) -> None:
    """`docker stop`: SIGTERM becomes exit 143 through the `finally`s, which end our Ray head; after the
    supervisor returns, this process's own SIGTERM handler is back."""
    received: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    try:
        def stopped_while_training(argv: Sequence[str], env: dict[str, str]) -> int:
            signal.raise_signal(signal.SIGTERM)
            return 0

        with pytest.raises(SystemExit) as caught:
            supervisors.run_head(HEAD, ["t"], resource_name="NPU", devices_per_node=16, timeout_s=60, env={},
                                 run_trainer=stopped_while_training)
        assert caught.value.code == 143
        assert recorded.events[-1] == ("head stopped",)
        assert received == []
        signal.raise_signal(signal.SIGTERM)
        assert received == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_the_head_runs_outside_the_main_thread(recorded: Recorded) -> None:
    """Handlers can only be set in the main thread: elsewhere the supervisor runs without one."""
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(supervisors.run_head(
        HEAD, ["t"], resource_name="NPU", devices_per_node=16, timeout_s=60, env={},
        run_trainer=recorded.trainer(5))))
    thread.start()
    thread.join(timeout=30)
    assert codes == [5]


@pytest.mark.parametrize("nnodes", [1, 2, 3, 16])
def test_joining_an_existing_cluster_waits_for_every_node(monkeypatch: pytest.MonkeyPatch, nnodes: int) -> None:
    """KubeRay's RayJob: the trainer starts only once all NNODES nodes, with their devices, have joined."""
    waited: list[tuple[object, ...]] = []
    monkeypatch.setattr(supervisors, "wait_for_nodes", lambda *args, **kwargs: waited.append(args) or [])
    monkeypatch.setattr(supervisors, "_connected", contextmanager(lambda address, ip: iter([lambda: []])))
    role = rules.plan_ray_role(nnodes, 0, None, 6379, "10.0.0.9:6379")
    ran: list[list[str]] = []
    code = supervisors.run_joined(role, ["trainer"], resource_name="NPU", devices_per_node=16, timeout_s=5,
                              env={}, run_trainer=lambda argv, env: ran.append(list(argv)) or 0)  # fmt: skip
    assert code == 0 and ran == [["trainer"]]
    assert waited == [("10.0.0.9:6379", nnodes, "NPU", 16, 5)]


def _ray_with(nodes: list[dict[str, object]], monkeypatch: pytest.MonkeyPatch) -> None:
    """A `ray` module whose cluster holds `nodes`, a head that answers, and a clock that only moves on sleep."""
    module = types.ModuleType("ray")
    module.init = lambda **kwargs: None  # type: ignore[attr-defined]
    module.nodes = lambda: nodes  # type: ignore[attr-defined]
    module.shutdown = lambda: None  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ray", module)
    monkeypatch.setattr(readiness, "head_reachable", lambda address: True)
    clock = types.SimpleNamespace(now=0.0)
    monkeypatch.setattr(readiness, "time", types.SimpleNamespace(
        monotonic=lambda: clock.now, sleep=lambda s: setattr(clock, "now", clock.now + s)))


def _ray_node(rank: int) -> dict[str, object]:
    return {"NodeID": f"id-{rank}", "Alive": True, "NodeManagerAddress": f"10.0.0.{rank + 1}",
            "NodeManagerHostname": f"pod-{rank}", "Resources": {"NPU": 16.0}, "Labels": {}}


@pytest.mark.parametrize("nnodes", [2, 3, 8])
def test_joining_an_existing_cluster_one_node_short_never_trains(monkeypatch: pytest.MonkeyPatch,
                                                                 nnodes: int) -> None:
    """The RayJob's submitter pod counts as no node: with NNODES-1 nodes up the run fails, naming the one that
    never joined, and the trainer does not start; with all NNODES it starts."""
    ran: list[list[str]] = []

    def trainer(argv: Sequence[str], env: dict[str, str]) -> int:
        ran.append(list(argv))
        return 0

    role = rules.plan_ray_role(nnodes, 0, None, 6379, "10.0.0.9:6379")
    _ray_with([_ray_node(r) for r in range(nnodes - 1)], monkeypatch)
    with pytest.raises(rules.ClusterError) as caught:
        supervisors.run_joined(role, ["trainer"], resource_name="NPU", devices_per_node=16, timeout_s=10,
                               env={}, run_trainer=trainer)
    assert caught.value.problems[-1].startswith("1 node(s) never joined (under KubeRay: NNODES must be 1 + the RayJob")
    assert ran == []
    _ray_with([_ray_node(r) for r in range(nnodes)], monkeypatch)
    assert supervisors.run_joined(role, ["trainer"], resource_name="NPU", devices_per_node=16, timeout_s=10,
                                  env={}, run_trainer=trainer) == 0
    assert ran == [["trainer"]]


def test_joining_passes_its_settings_to_the_wait_and_the_storage_check(recorded: Recorded,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    role = rules.plan_ray_role(2, 0, None, 6379, "10.0.0.9:6379")
    env = {ROOT_VARIABLE: "/ck/p/e", "RAY_ADDRESS": "10.0.0.9:6379"}
    code = supervisors.run_joined(role, ["t"], resource_name="GPU", devices_per_node=8, timeout_s=30, env=env,
                                  poll_interval_s=0.5, node_ip_address="10.0.0.5", run_trainer=recorded.trainer(4),
                                  checkpoint_dir="/ck")
    assert code == 4
    assert recorded.events == [
        ("wait", ("10.0.0.9:6379", 2, "GPU", 8, 30), {"poll_interval_s": 0.5, "node_ip_address": "10.0.0.5"}),
        ("storage", "10.0.0.9:6379", recorded.nodes, Path("/ck/p/e"), "/ck", "10.0.0.5"),
        ("trainer", ["t"], env),  # the cluster's own environment, RAY_ADDRESS as the user set it
    ]


def test_joining_by_default(recorded: Recorded, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervisors.os, "environ", {"FROM": "this process", ROOT_VARIABLE: "/ck"})
    role = rules.plan_ray_role(2, 0, None, 6379, "10.0.0.9:6379")
    supervisors.run_joined(role, ["t"], resource_name="GPU", devices_per_node=8, timeout_s=30,
                           run_trainer=recorded.trainer())
    assert recorded.events == [
        ("wait", ("10.0.0.9:6379", 2, "GPU", 8, 30), {"poll_interval_s": 2.0, "node_ip_address": None}),
        ("storage", "10.0.0.9:6379", recorded.nodes, Path("/ck"), "", None),
        ("trainer", ["t"], {"FROM": "this process", ROOT_VARIABLE: "/ck"}),
    ]


# --- the worker: join, stay, rejoin, leave ----------------------------------------------------------------


@dataclass
class WorkerWorld:
    """A fake clock, a head that answers per `head_up(now)`, and `ray start`s that each last `uptimes[i]`."""

    uptimes: list[float]
    head_up: object = lambda now: True
    now: float = 0.0
    sleeps: list[float] = field(default_factory=list)
    probes: list[tuple[str, float]] = field(default_factory=list)
    starts: list[tuple[object, ...]] = field(default_factory=list)
    stops: int = 0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class FakeWorkerNode:
    def __init__(self, world: WorkerWorld, uptime: float, code: int) -> None:
        self.world, self.uptime, self.code = world, uptime, code

    def wait(self) -> int:
        self.world.now += self.uptime
        return self.code

    def stop(self) -> int:
        self.world.stops += 1
        return self.code


@pytest.fixture
def worker_world(monkeypatch: pytest.MonkeyPatch) -> Iterator[WorkerWorld]:
    world = WorkerWorld(uptimes=[])

    def head_reachable(address: str, timeout_s: float) -> bool:
        world.probes.append((address, timeout_s))
        return world.head_up(world.now)  # type: ignore[operator]

    def start_worker(address: str, node_rank: int, *, options: NodeOptions, env: Mapping[str, str],
                     log_path: str | None) -> FakeWorkerNode:
        world.starts.append((address, node_rank, options, env, log_path))
        uptime = world.uptimes.pop(0)
        return FakeWorkerNode(world, uptime, 1 if uptime < 30 else 0)

    monkeypatch.setattr(supervisors, "time", world)
    monkeypatch.setattr(supervisors, "head_reachable", head_reachable)
    monkeypatch.setattr(supervisors, "start_worker", start_worker)
    yield world


WORKER = rules.plan_ray_role(3, 2, "10.0.0.1", 6390, None)


def test_a_worker_joins_and_leaves_quietly_when_the_head_is_gone(worker_world: WorkerWorld,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """The run ended on rank 0: the worker's ray start returns, the head stays gone, the worker exits 0 (a
    restart policy of on-failure then leaves it stopped)."""
    worker_world.uptimes = [3600]
    worker_world.head_up = lambda now: now < 3600
    options = NodeOptions(num_cpus=2)
    with caplog.at_level(logging.INFO, logger=supervisors.__name__):
        code = supervisors.run_worker(WORKER, join_timeout_s=60, rejoin_grace_s=10, options=options,
                                      env={"E": "1"}, probe_interval_s=2, log_path="/tmp/w.log")
    assert code == 0
    assert worker_world.starts == [(ADDRESS, 2, options, {"E": "1"}, "/tmp/w.log")]
    assert worker_world.stops == 1
    assert worker_world.now == 3610  # it gave the head exactly its grace to come back
    assert caplog.messages == [
        "ray start on NODE_RANK=2 ended with code 0 after 3600s",
        f"The Ray head at {ADDRESS} has been gone for 10s: the run is over",
    ]


def test_a_worker_says_how_the_run_ended_once_the_head_is_gone(worker_world: WorkerWorld,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """The head's evidence of a finished run is asked for after the grace, and named in the last line."""
    worker_world.uptimes = [3600]
    worker_world.head_up = lambda now: now < 3600
    asked: list[float] = []

    def run_ended() -> str:
        asked.append(worker_world.now)
        return "its report says exit 0"

    with caplog.at_level(logging.INFO, logger=supervisors.__name__):
        assert supervisors.run_worker(WORKER, join_timeout_s=60, rejoin_grace_s=10, env={}, run_ended=run_ended) == 0
    assert asked == [3610]
    assert caplog.messages[-1] == f"The Ray head at {ADDRESS} has been gone for 10s: the run is over (its report says exit 0)"


def test_a_head_lost_before_the_run_finished_ends_the_worker_with_a_cluster_error(worker_world: WorkerWorld) -> None:
    """No evidence of a finished run: exit 3 (ClusterError), one line naming the head and the way back, so that the
    restart policy brings this node back to wait for a restarted head."""
    worker_world.uptimes = [120]
    worker_world.head_up = lambda now: now < 120
    with pytest.raises(rules.ClusterError) as raised:
        supervisors.run_worker(WORKER, join_timeout_s=60, rejoin_grace_s=10, env={}, run_ended=lambda: None)
    assert raised.value.problems == [
        f"NODE_RANK=2: the Ray head at {ADDRESS} left before the run finished and has been gone for 10s (killed, "
        "preempted or cut off). Restart every node (the restart policy does): the run resumes from its last save"
    ]
    assert worker_world.now == 130 and worker_world.stops == 1


def test_a_worker_rejoins_a_head_that_comes_back(worker_world: WorkerWorld,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    """The head crashed and its restart policy brought it back within the grace: the worker joins again."""
    worker_world.uptimes = [100, 200]
    worker_world.head_up = lambda now: not 100 <= now < 104 and now < 300  # down 4 s, then gone for good
    with caplog.at_level(logging.INFO, logger=supervisors.__name__):
        assert supervisors.run_worker(WORKER, join_timeout_s=60, rejoin_grace_s=10, env={}) == 0
    assert len(worker_world.starts) == 2 and worker_world.stops == 2
    # Probed once a second by default, always at the head's address: down 4 s, then its 10 s of grace.
    assert worker_world.sleeps == [1.0] * 14
    assert {address for address, _ in worker_world.probes} == {ADDRESS}
    assert f"The Ray head at {ADDRESS} answers again: rejoining" in caplog.messages


def test_a_worker_waits_for_a_head_that_is_still_starting(worker_world: WorkerWorld) -> None:
    worker_world.uptimes = [100]
    worker_world.head_up = lambda now: 5 <= now < 100
    assert supervisors.run_worker(WORKER, join_timeout_s=60, rejoin_grace_s=3, probe_interval_s=1, env={}) == 0
    assert worker_world.starts[0][0] == ADDRESS
    assert worker_world.sleeps[:5] == [1, 1, 1, 1, 1]


@pytest.mark.parametrize(("join_timeout_s", "probes"), [(5, 6), (0, 1)])
def test_a_worker_gives_up_when_no_head_answers(worker_world: WorkerWorld, join_timeout_s: float,
                                                probes: int) -> None:
    worker_world.head_up = lambda now: False
    with pytest.raises(rules.ClusterError) as caught:
        supervisors.run_worker(WORKER, join_timeout_s=join_timeout_s, rejoin_grace_s=10, probe_interval_s=1)
    assert caught.value.problems == [
        f"MASTER_ADDR:RAY_PORT={ADDRESS}: no Ray head answered within {join_timeout_s}s (NODE_RANK=2)"]
    assert worker_world.starts == []
    assert len(worker_world.probes) == probes  # one probe a second, the last at the deadline itself


@pytest.mark.parametrize(("probe_interval_s", "probe_timeout_s"), [(1.0, 1.0), (5.0, 2.0), (0.01, 0.1)])
def test_each_probe_waits_about_one_interval(worker_world: WorkerWorld, probe_interval_s: float,
                                             probe_timeout_s: float) -> None:
    """A probe waits as long as the interval, but at least 0.1 s (a connect needs a moment) and at most 2 s."""
    worker_world.head_up = lambda now: False
    with pytest.raises(rules.ClusterError):
        supervisors.run_worker(WORKER, join_timeout_s=0, rejoin_grace_s=10, probe_interval_s=probe_interval_s)
    assert worker_world.probes == [(ADDRESS, probe_timeout_s)]


def test_a_worker_whose_ray_start_keeps_failing_gives_up(worker_world: WorkerWorld) -> None:
    """Bad flags or a taken port: ray start dies at once while the head answers. Three in a row is an error,
    not an endless loop of rejoins."""
    worker_world.uptimes = [1, 2, 29.5]
    with pytest.raises(rules.ClusterError) as caught:
        supervisors.run_worker(WORKER, join_timeout_s=60, rejoin_grace_s=10, env={})
    assert caught.value.problems == [
        f"NODE_RANK=2: ray start --address={ADDRESS} failed 3 times in a row (last exit code 1)"]
    assert worker_world.stops == 3


def test_a_long_run_between_failed_starts_resets_the_count(worker_world: WorkerWorld) -> None:
    """Only failures in a row count: a node that ran for MIN_WORKER_UPTIME_S or more was a real join."""
    worker_world.uptimes = [1, 1, supervisors.MIN_WORKER_UPTIME_S, 1, 1, 1000]
    worker_world.head_up = lambda now: now < 1000
    assert supervisors.run_worker(WORKER, join_timeout_s=60, rejoin_grace_s=10, env={}) == 0
    assert len(worker_world.starts) == 6


def test_a_worker_uses_this_process_environment_by_default(worker_world: WorkerWorld,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervisors.os, "environ", {"FROM": "this process"})
    worker_world.uptimes = [100]
    worker_world.head_up = lambda now: now < 100
    supervisors.run_worker(WORKER, join_timeout_s=60, rejoin_grace_s=10, min_uptime_s=200)
    assert worker_world.starts == [(ADDRESS, 2, NodeOptions(), {"FROM": "this process"}, None)]


def test_min_uptime_decides_what_counts_as_a_failed_start(worker_world: WorkerWorld) -> None:
    worker_world.uptimes = [100, 100, 100]
    with pytest.raises(rules.ClusterError, match="failed 3 times in a row"):
        supervisors.run_worker(WORKER, join_timeout_s=60, rejoin_grace_s=10, env={}, min_uptime_s=101)
