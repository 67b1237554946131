"""recipe.cluster.readiness: assessing Ray's view of the nodes, reaching the head, and waiting for every node.

The wait is driven here by a fake `ray` module (init / nodes / shutdown, the three calls it makes) and a fake
clock, so each outcome is exact and instant: which nodes come back, which lines a failed wait prints, how
long it waited before giving up. tests/unit/cluster/test_with_real_ray.py runs the same wait on real Ray.
"""

from __future__ import annotations

import logging
import signal
import socket
import sys
import threading
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import pytest

from recipe.cluster import readiness, rules
from recipe.cluster.readiness import NodeReport


SIZES_AGREE = ("NNODES must be 1 + the RayJob's worker replicas; the -ray overlay sets both, and its NNODES replaces "
               "any in k8s/base/settings.env")


def _node(ip: str, rank: int | None, npus: float, alive: bool = True) -> dict[str, object]:
    labels = {"ray.io/node-id": ip} | ({rules.NODE_RANK_LABEL: str(rank)} if rank is not None else {})
    return {"NodeID": f"id-{ip}", "Alive": alive, "NodeManagerAddress": ip,
            "NodeManagerHostname": f"host-{ip}", "Resources": {"CPU": 8.0, "NPU": npus},
            "Labels": labels}


def _report(ip: str, rank: int | None, npus: float) -> NodeReport:
    return NodeReport(f"id-{ip}", ip, f"host-{ip}", rank, npus, True)


def test_assess_ready() -> None:
    r = readiness.assess_nodes([_node("a", 0, 16), _node("b", 1, 16)], 2, "NPU", 16)
    assert r.is_ready and not r.missing_ranks and not r.short
    # Each node as the rest of the run needs it: its id (tasks are pinned to it), where it is, its rank.
    assert r.ready == (_report("a", 0, 16), _report("b", 1, 16))


def test_assess_names_missing_and_short_nodes() -> None:
    nodes = [_node("a", 0, 16), _node("b", 1, 8), _node("c", 2, 16, alive=False)]
    r = readiness.assess_nodes(nodes, 4, "NPU", 16)
    assert not r.is_ready
    assert r.missing_ranks == (2, 3)  # a dead entry does not count as joined
    assert r.problems(600.4) == [
        "NNODES=4: 1 node(s) with 16 NPU registered with Ray after 600s",
        "NODE_RANK=1 (b, host-b): has 8 NPU, NDEVICES_PER_NODE=16 expected",
        "NODE_RANK=2, 3: never joined (check MASTER_ADDR, RAY_PORT and that those nodes were started)",
    ]


def test_assess_counts_nodes_without_rank_labels() -> None:
    """Under KubeRay nodes carry no rank: the report counts them."""
    r = readiness.assess_nodes([_node("a", None, 8)], 3, "GPU", 8)
    # GPU count missing from Resources means 0 GPUs: present but short.
    assert r.problems(1)[1:] == ["a, host-a: has 0 GPU, NDEVICES_PER_NODE=8 expected",
                                 f"2 node(s) never joined (under KubeRay: {SIZES_AGREE})"]


@pytest.mark.parametrize(("nodes", "expected", "last_line"), [
    # Unlabelled (KubeRay): the count of nodes never seen; ready and short ones both count as there.
    ([_node("a", None, 16), _node("b", None, 4)], 3, f"1 node(s) never joined (under KubeRay: {SIZES_AGREE})"),
    ([_node("a", None, 16), _node("b", None, 4)], 2, None),  # all there, one short: no "never joined" line
    ([_node("a", None, 16)], 4, f"3 node(s) never joined (under KubeRay: {SIZES_AGREE})"),
])
def test_a_failed_wait_counts_the_nodes_never_seen(nodes: list[dict[str, object]], expected: int,
                                                   last_line: str | None) -> None:
    problems = readiness.assess_nodes(nodes, expected, "NPU", 16).problems(0)
    short = [line for line in problems if "NDEVICES_PER_NODE" in line]
    assert problems == [problems[0], *short, *([last_line] if last_line else [])]


@pytest.mark.parametrize(("nodes", "expected", "ready"), [
    ([_node("a", 0, 16)], 1, True),                         # exactly the devices asked for is enough
    ([_node("a", 0, 15.5)], 1, False),                      # a fraction short is short
    ([_node("a", 0, 16), _node("b", 1, 16)], 1, True),      # more nodes than NNODES: still ready
    ([_node("a", 0, 16, alive=False), _node("b", 0, 16)], 1, True),  # the dead entry of a restarted node
    ([_node("a", 0, 16), _node("b", 1, 16, alive=False)], 2, False),
])
def test_is_ready_when_enough_alive_nodes_have_their_devices(nodes: list[dict[str, object]], expected: int,
                                                             ready: bool) -> None:
    assert readiness.assess_nodes(nodes, expected, "NPU", 16).is_ready is ready


@pytest.mark.parametrize(("nodes", "expected", "line"), [
    ([_node("a", None, 16), _node("b", None, 16)], 2, None),  # exactly NNODES: nothing to say
    ([_node("a", None, 16), _node("b", None, 16), _node("c", None, 4)], 2,  # a short node counts as joined too
     f"the Ray cluster has 3 nodes and NNODES=2: 1 node(s) stay idle (under KubeRay: {SIZES_AGREE})"),
    ([_node("a", 0, 16), _node("b", 1, 16), _node("c", 2, 16, alive=False)], 2, None),  # a dead entry is gone
    ([_node("a", 0, 16), _node("b", 1, 16)], 1,
     "the Ray cluster has 2 nodes and NNODES=1: 1 node(s) stay idle (check each node's NNODES)"),
])
def test_more_nodes_than_nnodes_are_named_with_the_rule_that_sizes_the_run(
        nodes: list[dict[str, object]], expected: int, line: str | None) -> None:
    """Issue 54: a RayJob whose worker replicas outgrew NNODES (or a base NNODES the overlay replaced) trains on
    NNODES nodes while the rest idle: one line says so, with the rule."""
    assert readiness.assess_nodes(nodes, expected, "NPU", 16).surplus() == line


def test_a_dead_entry_first_does_not_hide_the_live_nodes_after_it() -> None:
    nodes = [_node("old", 1, 16, alive=False), _node("a", 0, 16), _node("b", 1, 16)]
    assert readiness.assess_nodes(nodes, 2, "NPU", 16).ready == (_report("a", 0, 16), _report("b", 1, 16))


def test_an_entry_without_alive_is_not_counted() -> None:
    entry = _node("a", 0, 16)
    del entry["Alive"]
    r = readiness.assess_nodes([entry, _node("b", 1, 16)], 2, "NPU", 16)
    assert (r.ready, r.short, r.missing_ranks) == ((_report("b", 1, 16),), (), (0,))


def test_an_odd_entry_is_a_node_without_rank_or_devices() -> None:
    """Fields of the wrong type or missing (another Ray version, a hand-made entry) never raise: the node is
    reported as there, without a rank, with 0 devices, so the failure names it instead of a traceback."""
    odd = {"Alive": True, "Labels": [rules.NODE_RANK_LABEL], "Resources": "NPU=16"}
    not_a_rank = {"Alive": True, "Labels": {rules.NODE_RANK_LABEL: "one"}, "Resources": None}
    r = readiness.assess_nodes([odd, not_a_rank], 1, "NPU", 16)
    assert r.short == (NodeReport("", "", "", None, 0.0, True),) * 2
    assert r.missing_ranks == ()  # nothing labelled: counted, not named by rank
    assert r.problems(0)[1:] == [": has 0 NPU, NDEVICES_PER_NODE=16 expected"] * 2


@pytest.mark.parametrize(("report", "described"), [
    (NodeReport("id", "10.0.0.2", "host-b", 1, 16, True), "NODE_RANK=1 (10.0.0.2, host-b)"),
    (NodeReport("id", "10.0.0.2", "", 1, 16, True), "NODE_RANK=1 (10.0.0.2)"),
    (NodeReport("id", "10.0.0.2", "host-b", None, 16, True), "10.0.0.2, host-b"),
    (NodeReport("id", "10.0.0.2", "", None, 16, True), "10.0.0.2"),
    (NodeReport("id", "10.0.0.2", "", 0, 16, True), "NODE_RANK=0 (10.0.0.2)"),  # rank 0 is a rank
])
def test_a_node_is_described_by_rank_address_and_host(report: NodeReport, described: str) -> None:
    assert report.describe() == described


def test_head_reachable() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert readiness.head_reachable(f"127.0.0.1:{port}")
    assert not readiness.head_reachable(f"127.0.0.1:{port}", timeout_s=0.5)


def test_head_reachable_never_waits_longer_than_its_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """A head behind a firewall that drops packets: the probe gives up after its timeout (2 s unless told),
    not after the system's connect timeout of minutes."""
    calls: list[tuple[object, object]] = []

    def silent(address: object, timeout: object = None) -> socket.socket:
        calls.append((address, timeout))
        raise TimeoutError("timed out")

    monkeypatch.setattr(readiness.socket, "create_connection", silent)
    assert not readiness.head_reachable("[fd00::1]:6379")
    assert not readiness.head_reachable("10.0.0.9:6380", timeout_s=0.25)
    assert calls == [(("fd00::1", 6379), 2.0), (("10.0.0.9", 6380), 0.25)]


# --- the wait, on a fake Ray and a fake clock -------------------------------------------------------------


@dataclass
class Clock:
    """time.monotonic and time.sleep: sleeping moves the clock, nothing really waits."""

    now: float = 1000.0
    sleeps: list[float] = field(default_factory=list)

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@dataclass
class FakeRay:
    """What the wait calls of `ray`; `views` are what ray.nodes() answers, one per call, the last repeated."""

    views: Sequence[list[dict[str, object]]]
    inits: list[dict[str, object]] = field(default_factory=list)
    calls: int = 0
    shutdowns: int = 0

    def init(self, **kwargs: object) -> None:
        self.inits.append(kwargs)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as ray.init does: a handler of its own
            signal.signal(signal.SIGINT, signal.SIG_IGN)

    def nodes(self) -> list[dict[str, object]]:
        view = self.views[min(self.calls, len(self.views) - 1)]
        self.calls += 1
        return list(view)

    def shutdown(self) -> None:
        self.shutdowns += 1


@dataclass
class World:
    """The fake Ray, the clock, the addresses probed, and the head's answers to come (then it answers)."""

    ray: FakeRay
    clock: Clock
    probes: list[str] = field(default_factory=list)
    answers: list[bool] = field(default_factory=list)


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    """A fake Ray whose head answers at once; tests set ray.views and, for a slow head, `answers`."""
    fake = FakeRay([[]])
    module = types.ModuleType("ray")
    for name in ("init", "nodes", "shutdown"):
        setattr(module, name, getattr(fake, name))
    monkeypatch.setitem(sys.modules, "ray", module)
    clock = Clock()
    monkeypatch.setattr(readiness, "time", clock)
    world = World(fake, clock)

    def reachable(address: str) -> bool:
        world.probes.append(address)
        return world.answers.pop(0) if world.answers else True

    monkeypatch.setattr(readiness, "head_reachable", reachable)
    yield world


@dataclass
class Head:
    """Our own `ray start --head`: poll() answers from `codes`, the last repeated."""

    codes: list[int | None]
    pid: int = 4242

    def poll(self) -> int | None:
        return self.codes.pop(0) if len(self.codes) > 1 else self.codes[0]


TWO = [_node("a", 0, 16), _node("b", 1, 16)]


def test_the_wait_returns_the_ready_nodes_once_all_joined(world: World, caplog: pytest.LogCaptureFixture) -> None:
    world.ray.views = [[], [_node("a", 0, 16)], [_node("a", 0, 16), _node("b", 1, 8)], TWO]
    with caplog.at_level(logging.INFO, logger=readiness.__name__):
        ready = readiness.wait_for_nodes("10.0.0.1:6379", 2, "NPU", 16, timeout_s=60, poll_interval_s=3)
    assert ready == [_report("a", 0, 16), _report("b", 1, 16)]
    assert world.clock.sleeps == [3, 3, 3]  # one poll per interval until the last node had its devices
    assert world.probes == ["10.0.0.1:6379"]
    # Connected as a driver that stays quiet: the nodes' logs are not this process's output.
    assert world.ray.inits == [{"address": "10.0.0.1:6379", "logging_level": logging.WARNING,
                                "log_to_driver": False}]
    assert world.ray.shutdowns == 1
    assert caplog.messages == ["Ray cluster ready: NODE_RANK=0 (a, host-a), NODE_RANK=1 (b, host-b)"]


def test_the_wait_warns_once_when_more_nodes_joined_than_nnodes(world: World, caplog: pytest.LogCaptureFixture) -> None:
    world.ray.views = [[_node("a", None, 16), _node("b", None, 16), _node("c", None, 16)]]
    with caplog.at_level(logging.INFO, logger=readiness.__name__):
        readiness.wait_for_nodes("10.0.0.1:6379", 2, "NPU", 16, timeout_s=60)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned == [f"the Ray cluster has 3 nodes and NNODES=2: 1 node(s) stay idle (under KubeRay: {SIZES_AGREE})"]


def test_the_wait_attaches_to_the_named_local_address(world: World) -> None:
    """On a host with several addresses, ray.init attaches to the raylet on the one given."""
    world.ray.views = [TWO]
    readiness.wait_for_nodes("10.0.0.1:6379", 2, "NPU", 16, timeout_s=60, node_ip_address="10.0.0.1")
    assert world.ray.inits == [{"address": "10.0.0.1:6379", "logging_level": logging.WARNING,
                                "log_to_driver": False, "_node_ip_address": "10.0.0.1"}]


@pytest.mark.parametrize(("resource", "per_node", "ready"), [("NPU", 16, 2), ("NPU", 17, 0), ("GPU", 1, 0)])
def test_the_wait_counts_the_devices_named(world: World, resource: rules.ResourceName, per_node: int,
                                           ready: int) -> None:
    world.ray.views = [TWO]
    if ready:
        assert len(readiness.wait_for_nodes("h:1", 2, resource, per_node, timeout_s=1)) == ready
    else:
        with pytest.raises(rules.ClusterError, match=f"NNODES=2: 0 node\\(s\\) with {per_node} {resource}"):
            readiness.wait_for_nodes("h:1", 2, resource, per_node, timeout_s=1)


@pytest.mark.parametrize(("timeout_s", "waited"), [(4, 4), (5, 6), (0, 0)])
def test_a_wait_that_times_out_names_what_is_missing(world: World, timeout_s: float, waited: int) -> None:
    """Polls every 2 s; gives up at the first poll at or past the timeout, and says how long it waited."""
    world.ray.views = [[_node("a", 0, 16), _node("b", 1, 8)]]
    with pytest.raises(rules.ClusterError) as caught:
        readiness.wait_for_nodes("h:1", 3, "NPU", 16, timeout_s=timeout_s, poll_interval_s=2)
    assert caught.value.problems == [
        f"NNODES=3: 1 node(s) with 16 NPU registered with Ray after {waited}s",
        "NODE_RANK=1 (b, host-b): has 8 NPU, NDEVICES_PER_NODE=16 expected",
        "NODE_RANK=2: never joined (check MASTER_ADDR, RAY_PORT and that those nodes were started)",
    ]
    assert world.clock.sleeps == [2] * (waited // 2)
    assert world.ray.shutdowns == 1  # disconnected on the way out too


@pytest.mark.parametrize(("poll_interval_s", "probe_every"), [(2.0, 0.5), (0.2, 0.2)])
def test_the_wait_probes_a_starting_head_often(world: World, poll_interval_s: float, probe_every: float) -> None:
    """ray.init against a head still starting is slow and leaves state: connect only once its port answers."""
    world.answers.extend([False, False, False])
    world.ray.views = [TWO]
    readiness.wait_for_nodes("h:1", 2, "NPU", 16, timeout_s=60, poll_interval_s=poll_interval_s)
    assert world.clock.sleeps == [probe_every] * 3
    assert world.probes == ["h:1"] * 4
    assert len(world.ray.inits) == 1


def test_the_wait_polls_every_2s_unless_told(world: World) -> None:
    """Often enough that the trainer starts soon after the last node, rarely enough to leave the GCS alone."""
    world.ray.views = [[], [], TWO]
    readiness.wait_for_nodes("h:1", 2, "NPU", 16, timeout_s=60)
    assert world.clock.sleeps == [2.0, 2.0]


@pytest.mark.parametrize(("timeout_s", "head_timeout_s", "said"), [(3, None, 3), (3, 10, 10)])
def test_a_head_that_never_answers_is_named(world: World, timeout_s: float, head_timeout_s: float | None,
                                            said: int) -> None:
    world.answers.extend([False] * 1000)
    with pytest.raises(rules.ClusterError) as caught:
        readiness.wait_for_nodes("10.0.0.1:6379", 2, "NPU", 16, timeout_s=timeout_s, head_timeout_s=head_timeout_s)
    assert caught.value.problems == [f"address 10.0.0.1:6379: no Ray head answered within {said}s"]
    assert world.clock.sleeps == [0.5] * (said * 2)  # it waited exactly that long, probing every 0.5 s
    assert world.ray.inits == []  # never connected to nothing


@pytest.mark.parametrize(("head_timeout_s", "waited"), [
    (None, 6),   # one deadline from the call: the 4 s the head took count against the nodes' 6 s
    (60, 10),    # the nodes get their 6 s once the head answered after 4 s
])
def test_the_nodes_time_starts_once_the_head_answers_when_told(world: World, head_timeout_s: float | None,
                                                               waited: int) -> None:
    world.answers.extend([False] * 8)  # 8 probes 0.5 s apart: 4 s
    world.ray.views = [[_node("a", 0, 16)]]
    with pytest.raises(rules.ClusterError) as caught:
        readiness.wait_for_nodes("h:1", 2, "NPU", 16, timeout_s=6, poll_interval_s=1, head_timeout_s=head_timeout_s)
    assert caught.value.problems[0] == f"NNODES=2: 1 node(s) with 16 NPU registered with Ray after {waited}s"


def test_the_wait_stops_at_once_when_our_head_exits(world: World) -> None:
    world.ray.views = [[_node("a", 0, 16)]]
    head = Head([None, None, 3])
    with pytest.raises(rules.ClusterError) as caught:
        readiness.wait_for_nodes("h:1", 2, "NPU", 16, timeout_s=600, poll_interval_s=2, head=head)  # type: ignore[arg-type]
    assert caught.value.problems == ["ray start --head (pid 4242): exited with code 3 before NNODES=2 nodes joined"]
    assert world.clock.now < 1010  # not its 600 s


def test_the_wait_stops_when_our_head_exits_before_it_answered(world: World) -> None:
    world.answers.extend([False] * 1000)
    with pytest.raises(rules.ClusterError, match=r"^ray start --head \(pid 4242\): exited with code 1 "):
        readiness.wait_for_nodes("h:1", 2, "NPU", 16, timeout_s=600, head=Head([None, 1]))  # type: ignore[arg-type]
    assert world.clock.sleeps == [0.5]


def test_a_live_head_does_not_stop_the_wait(world: World) -> None:
    world.ray.views = [[], TWO]
    ready = readiness.wait_for_nodes("h:1", 2, "NPU", 16, timeout_s=60, head=Head([None]))  # type: ignore[arg-type]
    assert [n.node_rank for n in ready] == [0, 1]


def test_the_wait_puts_back_this_process_signal_handlers(world: World) -> None:
    """ray.init installs its own SIGTERM/SIGINT handlers: after the wait a stop must still reach ours."""
    def ours(signum: int, frame: object) -> None:  # never called: only its identity matters
        pass

    previous = {sig: signal.signal(sig, ours) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        world.ray.views = [TWO]
        readiness.wait_for_nodes("h:1", 2, "NPU", 16, timeout_s=60)
        assert signal.getsignal(signal.SIGTERM) is ours and signal.getsignal(signal.SIGINT) is ours
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def test_the_wait_runs_outside_the_main_thread(world: World) -> None:
    """Signal handlers can only be set in the main thread: elsewhere there is nothing to put back."""
    world.ray.views = [TWO]
    result: list[object] = []
    thread = threading.Thread(
        target=lambda: result.append(readiness.wait_for_nodes("h:1", 2, "NPU", 16, timeout_s=60)))
    thread.start()
    thread.join(timeout=30)
    assert result and len(result[0]) == 2  # type: ignore[arg-type]
