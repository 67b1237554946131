"""recipe.cluster.shared_storage on a fake Ray: the head's nonce read back on every node, and each failure named.

A fast stand-in for the real-Ray test (tests/unit/cluster/test_with_real_ray.py, kept: only real Ray shows that
a node's task sees that node's own `run` environment). Here a fake `ray` runs each pinned task in this process,
with the node's own checkpoint root in its environment, so each outcome is exact and instant: which node is
named, with which path, why, and that the check leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import threading
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from recipe.cluster import shared_storage
from recipe.cluster.readiness import NodeReport
from recipe.cluster.shared_storage import NONCE_FILE, ROOT_VARIABLE
from recipe.errors import RecipeConfigError

HEAD = NodeReport("id-head", "10.0.0.1", "head", 0, 8, True)
WORKER = NodeReport("id-worker", "10.0.0.2", "worker", 1, 8, True)
POD = NodeReport("id-pod", "10.0.0.3", "", None, 8, True)  # KubeRay: no rank, no ROOT_VARIABLE of its own


class GetTimeoutError(TimeoutError):
    """ray.exceptions.GetTimeoutError's stand-in: the task did not answer in time."""


@dataclass
class FakeRay:
    """The calls the check makes of `ray`; `roots` is each node's ROOT_VARIABLE (absent: unset there)."""

    roots: Mapping[str, str]
    broken: set[str] = field(default_factory=set)
    inits: list[dict[str, object]] = field(default_factory=list)
    tasks: list[dict[str, object]] = field(default_factory=list)
    seen_nonces: list[str] = field(default_factory=list)
    shutdowns: int = 0

    def module(self) -> types.ModuleType:
        ray = types.ModuleType("ray")
        ray.init = lambda **kwargs: self.inits.append(kwargs)  # type: ignore[attr-defined]
        ray.nodes = list  # type: ignore[attr-defined]
        ray.shutdown = self.shutdown  # type: ignore[attr-defined]
        ray.remote = self.remote  # type: ignore[attr-defined]
        ray.get = self.get  # type: ignore[attr-defined]
        return ray

    def shutdown(self) -> None:
        self.shutdowns += 1

    def remote(self, **task_options: object) -> Any:
        fake = self

        class Remote:
            def __init__(self, function: Any) -> None:
                self.function = function

            def options(self, *, scheduling_strategy: Any) -> Any:
                function = self.function

                class Bound:
                    def remote(self, *args: object) -> dict[str, object]:
                        task = {"options": task_options, "node": scheduling_strategy.node_id,
                                "soft": scheduling_strategy.soft, "function": function, "args": args}
                        fake.tasks.append(task)
                        return task

                return Bound()

        return Remote

    def get(self, ref: dict[str, Any], *, timeout: float) -> object:
        ref["timeout"] = timeout
        node = ref["node"]
        if node in self.broken:
            raise GetTimeoutError("Get timed out")
        saved = os.environ.pop(ROOT_VARIABLE, None)
        try:
            if node in self.roots:
                os.environ[ROOT_VARIABLE] = self.roots[node]
            written = Path(ref["args"][0]) / NONCE_FILE
            if written.exists():
                self.seen_nonces.append(written.read_text())
            return ref["function"](*ref["args"])
        finally:
            os.environ.pop(ROOT_VARIABLE, None)
            if saved is not None:
                os.environ[ROOT_VARIABLE] = saved


class Strategy:
    def __init__(self, node_id: str, soft: bool) -> None:
        self.node_id, self.soft = node_id, soft


@pytest.fixture
def head_root(tmp_path: Path) -> Path:
    root = tmp_path / "shared" / "project" / "experiment"
    root.mkdir(parents=True)
    return root


@pytest.fixture
def install(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    def put(fake: FakeRay) -> FakeRay:
        monkeypatch.setitem(sys.modules, "ray", fake.module())
        util = types.ModuleType("ray.util")
        strategies = types.ModuleType("ray.util.scheduling_strategies")
        strategies.NodeAffinitySchedulingStrategy = Strategy  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "ray.util", util)
        monkeypatch.setitem(sys.modules, "ray.util.scheduling_strategies", strategies)
        monkeypatch.delenv(ROOT_VARIABLE, raising=False)
        return fake

    yield put


def _line(where: str, path: Path, why: str) -> str:
    """The problem line, as the user reads it (written out, not built from the module's own text)."""
    return (f"{where}: cannot read {path} that NODE_RANK=0 just wrote under CHECKPOINT_DIR='/checkpoints' "
            f"({why}): every node must mount the same shared CHECKPOINT_DIR, or a resume finds only this "
            "node's shards")


def test_nodes_that_share_the_root_pass_and_nothing_is_left_behind(install: Any, head_root: Path) -> None:
    fake = install(FakeRay({"id-head": str(head_root), "id-worker": str(head_root)}))
    problems = shared_storage.shared_storage_problems("10.0.0.1:6390", [HEAD, WORKER, POD], head_root,
                                                      "/checkpoints", "10.0.0.1")
    assert problems == []
    assert not (head_root / NONCE_FILE).exists()
    assert sorted(head_root.iterdir()) == []  # no temporary file either
    # One read per node, pinned to that node (soft=False: never run elsewhere), taking no CPU from
    # training, never retried, each given READ_TIMEOUT_S.
    assert [(t["node"], t["soft"], t["options"], t["args"], t["timeout"]) for t in fake.tasks] == [
        (node, False, {"num_cpus": 0, "max_retries": 0}, (str(head_root),), 120.0)
        for node in ("id-head", "id-worker", "id-pod")]
    assert fake.inits == [{"address": "10.0.0.1:6390", "logging_level": logging.WARNING, "log_to_driver": False,
                           "_node_ip_address": "10.0.0.1"}]
    assert fake.shutdowns == 1
    # The nonce: 32 hex digits, fresh for each check.
    assert all(re.fullmatch(r"[0-9a-f]{32}", nonce) for nonce in fake.seen_nonces)
    assert len(set(fake.seen_nonces)) == 1
    shared_storage.shared_storage_problems("10.0.0.1:6390", [HEAD], head_root, "/checkpoints")
    assert len(set(fake.seen_nonces)) == 2


def test_a_node_on_its_own_disk_is_named_with_its_path(install: Any, head_root: Path, tmp_path: Path) -> None:
    local = tmp_path / "worker-disk"
    local.mkdir()
    install(FakeRay({"id-head": str(head_root), "id-worker": str(local)}))
    problems = shared_storage.shared_storage_problems("h:1", [HEAD, WORKER], head_root, "/checkpoints")
    assert problems == [_line("NODE_RANK=1 (10.0.0.2, worker)", local / NONCE_FILE, "No such file or directory")]


def test_a_node_holding_another_runs_nonce_is_named(install: Any, head_root: Path, tmp_path: Path) -> None:
    """A stale file (another run, another head) is not this check passing."""
    local = tmp_path / "worker-disk"
    local.mkdir()
    (local / NONCE_FILE).write_text("0123456789abcdef0123456789abcdef")
    install(FakeRay({"id-head": str(head_root), "id-worker": str(local)}))
    problems = shared_storage.shared_storage_problems("h:1", [HEAD, WORKER], head_root, "/checkpoints")
    assert problems == [_line("NODE_RANK=1 (10.0.0.2, worker)", local / NONCE_FILE, "it holds another run's nonce")]


def test_a_node_whose_read_never_ran_is_named_and_the_others_still_checked(install: Any, head_root: Path,
                                                                           tmp_path: Path) -> None:
    local = tmp_path / "pod-disk"
    local.mkdir()
    install(FakeRay({"id-pod": str(local)}, broken={"id-worker"}))
    problems = shared_storage.shared_storage_problems("h:1", [HEAD, WORKER, POD], head_root, "/checkpoints")
    assert problems == [
        _line("NODE_RANK=1 (10.0.0.2, worker)", head_root / NONCE_FILE, "the read did not run (GetTimeoutError)"),
        _line("10.0.0.3", local / NONCE_FILE, "No such file or directory"),
    ]


def test_a_root_the_head_cannot_write_is_named_without_connecting(install: Any, tmp_path: Path) -> None:
    fake = install(FakeRay({}))
    missing = tmp_path / "not-mounted"
    problems = shared_storage.shared_storage_problems("h:1", [HEAD], missing, "/checkpoints")
    assert problems == [f"CHECKPOINT_DIR='/checkpoints': cannot write {missing / NONCE_FILE} (No such file or directory)"]
    assert fake.inits == [] and fake.tasks == []


def test_a_write_error_without_an_os_reason_is_named_by_its_type(install: Any, head_root: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    class QuotaError(OSError):
        pass

    def fails(*args: object, **kwargs: object) -> None:
        raise QuotaError()

    install(FakeRay({}))
    monkeypatch.setattr(shared_storage, "atomic_write", fails)
    assert shared_storage.shared_storage_problems("h:1", [HEAD], head_root, "/ck") == [
        f"CHECKPOINT_DIR='/ck': cannot write {head_root / NONCE_FILE} (QuotaError)"]


def test_the_nonce_is_removed_even_when_connecting_fails(install: Any, head_root: Path) -> None:
    fake = install(FakeRay({}))

    def refused(**kwargs: object) -> None:
        raise ConnectionError("no head")

    sys.modules["ray"].init = refused  # type: ignore[attr-defined]
    with pytest.raises(ConnectionError):
        shared_storage.shared_storage_problems("h:1", [HEAD], head_root, "/checkpoints")
    assert not (head_root / NONCE_FILE).exists()
    assert fake.shutdowns == 1


def test_check_shared_storage_raises_the_problems_as_a_config_error(install: Any, head_root: Path,
                                                                    tmp_path: Path) -> None:
    """A config error (exit 2, before any step), every node that fails named, not only the first."""
    fake = install(FakeRay({"id-worker": str(tmp_path), "id-pod": str(tmp_path)}))
    with pytest.raises(RecipeConfigError) as caught:
        shared_storage.check_shared_storage("h:1", [HEAD, WORKER, POD], head_root, "/checkpoints", "10.0.0.1")
    assert caught.value.problems == [
        _line("NODE_RANK=1 (10.0.0.2, worker)", tmp_path / NONCE_FILE, "No such file or directory"),
        _line("10.0.0.3", tmp_path / NONCE_FILE, "No such file or directory"),
    ]
    assert shared_storage.check_shared_storage("h:2", [HEAD], head_root, "/checkpoints") is None
    assert [(i["address"], i.get("_node_ip_address")) for i in fake.inits] == [("h:1", "10.0.0.1"), ("h:2", None)]


def test_a_nonce_already_removed_is_no_error(install: Any, head_root: Path) -> None:
    """Another check on the same shared root (a second run started by mistake) may remove the file first: the
    nodes that read after it are named, and the cleanup does not crash on the file being gone."""
    fake = install(FakeRay({}))
    real_get = fake.get

    def get_then_remove(ref: dict[str, Any], *, timeout: float) -> object:
        answer = real_get(ref, timeout=timeout)
        (head_root / NONCE_FILE).unlink(missing_ok=True)
        return answer

    sys.modules["ray"].get = get_then_remove  # type: ignore[attr-defined]
    problems = shared_storage.shared_storage_problems("h:1", [HEAD, WORKER], head_root, "/checkpoints")
    assert problems == [_line("NODE_RANK=1 (10.0.0.2, worker)", head_root / NONCE_FILE, "No such file or directory")]


# --- the read itself, on one node ---------------------------------------------------------------------------


def test_a_node_reads_its_own_root_else_the_heads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    own, head = tmp_path / "own", tmp_path / "head"
    own.mkdir()
    head.mkdir()
    (own / NONCE_FILE).write_text("own")
    (head / NONCE_FILE).write_text("head")
    monkeypatch.setenv(ROOT_VARIABLE, str(own))
    assert shared_storage.read_nonce(str(head)) == (str(own), "own")
    monkeypatch.setenv(ROOT_VARIABLE, "")  # set but empty: as good as unset
    assert shared_storage.read_nonce(str(head)) == (str(head), "head")
    monkeypatch.delenv(ROOT_VARIABLE)
    assert shared_storage.read_nonce(str(head)) == (str(head), "head")


def test_a_planted_link_is_an_answer_not_a_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ROOT_VARIABLE, raising=False)
    (tmp_path / "elsewhere").write_text("0123456789abcdef0123456789abcdef")
    (tmp_path / NONCE_FILE).symlink_to(tmp_path / "elsewhere")
    assert shared_storage.read_nonce(str(tmp_path)) == (str(tmp_path), "error: Too many levels of symbolic links")


def test_a_planted_fifo_does_not_hang_the_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ROOT_VARIABLE, raising=False)
    fifo = tmp_path / NONCE_FILE
    os.mkfifo(fifo)
    answers: list[tuple[str, str]] = []
    # In a thread: a read that blocks on the FIFO is a failed test, not a hung suite.
    reader = threading.Thread(target=lambda: answers.append(shared_storage.read_nonce(str(tmp_path))), daemon=True)
    reader.start()
    reader.join(timeout=5)
    blocked = reader.is_alive()
    if blocked:
        with contextlib.suppress(OSError):  # a writer ends the blocked read
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(timeout=5)
    assert not blocked, "the read blocked on a FIFO"
    assert answers == [(str(tmp_path), "error: not a regular file")]  # the cause, not an empty nonce


def test_a_huge_file_is_refused_by_size_and_binary_bytes_never_raise(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A nonce is 32 hex digits: a file past 256 bytes is no nonce (said so); bytes that are no UTF-8 never raise."""
    monkeypatch.delenv(ROOT_VARIABLE, raising=False)
    (tmp_path / NONCE_FILE).write_bytes(b"\xff" + b"a" * 10_000)
    assert shared_storage.read_nonce(str(tmp_path)) == (str(tmp_path), "error: 9.8 KiB, above the 256 B bound")
    (tmp_path / NONCE_FILE).write_bytes(b"\xff" + b"a" * 200)
    assert shared_storage.read_nonce(str(tmp_path))[1] == "\ufffd" + "a" * 200


def test_the_read_keeps_no_descriptor_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """It runs in Ray's long-lived worker processes: a leaked descriptor per check would add up."""
    monkeypatch.delenv(ROOT_VARIABLE, raising=False)
    (tmp_path / NONCE_FILE).write_text("x")
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        shared_storage.read_nonce(str(tmp_path))
    assert len(os.listdir("/proc/self/fd")) == before
