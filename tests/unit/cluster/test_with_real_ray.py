"""The several-node bootstrap against real Ray processes on loopback.

Each test starts its own head (and worker) with `ray start --block` under a temp dir
and free ports of its own, on 127.0.0.2 / 127.0.0.3, and ends them by pid (see
raytools). Devices are stood in for by a custom resource ("NPU") or --num-gpus: the
wait only reads what Ray registered. The trainer is a small Python command that checks
it reached the cluster through RAY_ADDRESS.

No assertion depends on how fast the machine is: a test that needs the nodes up waits
for exactly that (a condition with a generous outer timeout); a wait that must FAIL is
given a short time only once everything it may find is already there.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.needs import TEST_EXTRA, needs

needs("ray", install=f"{TEST_EXTRA} (it pins ray==2.60.0)")

import pytest  # noqa: E402

from recipe.cluster import readiness, rules, supervisors  # noqa: E402
from tests.support.ports import free_port  # noqa: E402
from tests.unit.raytools import (  # noqa: E402
    HEAD_IP,
    prepare_ray_env,
    short_temp_dir,
    RAY_TEST_TIMEOUT_S,
    WORKER_IP,
    head_role,
    node_options,
    ray_nodes,
    worker_role,
)


@dataclass(frozen=True)
class TwoNodes:
    """A head and a worker with 2 stand-in NPUs each, whose `run` put the checkpoint root on different disks."""

    address: str
    head_root: Path
    worker_root: Path


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoNodes]:
    """One cluster for the tests that only read it (starting one takes about 10 s)."""
    from recipe.cluster.shared_storage import ROOT_VARIABLE

    tmp = tmp_path_factory.mktemp("two-nodes")
    head_root, worker_root = tmp / "head-disk", tmp / "worker-disk"
    head_root.mkdir()
    worker_root.mkdir()
    with pytest.MonkeyPatch.context() as mp, short_temp_dir() as short:
        env = prepare_ray_env(mp)
        with ray_nodes(short, tmp, {**env, ROOT_VARIABLE: str(head_root)}, head={"NPU": 2}, worker={"NPU": 2},
                       worker_env={**env, ROOT_VARIABLE: str(worker_root)}) as address:  # fmt: skip
            yield TwoNodes(address, head_root, worker_root)


def test_wait_succeeds_when_the_worker_joins(two_nodes: TwoNodes) -> None:
    ready = readiness.wait_for_nodes(two_nodes.address, 2, "NPU", 2, timeout_s=RAY_TEST_TIMEOUT_S,
                                     poll_interval_s=0.5, node_ip_address=HEAD_IP)
    assert sorted(n.node_rank for n in ready) == [0, 1]  # type: ignore[type-var]
    assert sorted(n.address for n in ready) == [HEAD_IP, WORKER_IP]
    assert all(n.devices == 2 for n in ready)


def test_wait_fails_naming_the_missing_ranks(two_nodes: TwoNodes) -> None:
    started = time.monotonic()
    with pytest.raises(rules.ClusterError) as caught:
        readiness.wait_for_nodes(two_nodes.address, 4, "NPU", 2, timeout_s=2, poll_interval_s=0.5,
                                 node_ip_address=HEAD_IP)
    waited = time.monotonic() - started
    problems = caught.value.problems
    assert problems[0].startswith("NNODES=4: 2 node(s) with 2 NPU registered with Ray after")
    assert problems[1].startswith("NODE_RANK=2, 3: never joined")
    assert waited >= 2  # it waited its time out (no upper bound: that would measure the machine)


def test_wait_names_a_node_short_of_devices(tmp_path: Path, short_tmp: Path, ray_env: dict[str, str]) -> None:
    """A node that joined without its GPUs is named, with what it has."""
    with ray_nodes(short_tmp, tmp_path, ray_env, head_gpus=4, worker_gpus=0) as address:
        with pytest.raises(rules.ClusterError) as caught:
            readiness.wait_for_nodes(address, 2, "GPU", 4, timeout_s=2, poll_interval_s=0.5,
                                   node_ip_address=HEAD_IP)
    assert any(p.startswith(f"NODE_RANK=1 ({WORKER_IP}") and "has 0 GPU, NDEVICES_PER_NODE=4"
               in p for p in caught.value.problems), caught.value.problems


_TRAINER = textwrap.dedent(
    """
    import os, sys, ray
    ray.init(address=os.environ["RAY_ADDRESS"], _node_ip_address="{ip}", log_to_driver=False)
    alive = [n for n in ray.nodes() if n["Alive"]]
    total = sum(n["Resources"].get("NPU", 0) for n in alive)
    open(sys.argv[1], "w").write(f"{{len(alive)}} {{total:g}}")
    ray.shutdown()
    sys.exit(int(sys.argv[2]))
    """
).format(ip=HEAD_IP)


def test_run_head_and_worker_end_to_end(tmp_path: Path, short_tmp: Path, ray_env: dict[str, str]) -> None:
    """Head waits for the worker, the trainer sees both nodes, the worker leaves after."""
    port = free_port(HEAD_IP)
    worker_result: dict[str, object] = {}
    worker_started = threading.Event()

    def worker_main() -> None:
        worker_started.set()
        try:
            worker_result["code"] = supervisors.run_worker(
                worker_role(port), join_timeout_s=RAY_TEST_TIMEOUT_S, rejoin_grace_s=4, probe_interval_s=0.5,
                options=node_options(short_tmp, "w", WORKER_IP, head=False, devices={"NPU": 2}),
                env=ray_env, log_path=str(tmp_path / "worker.log"))
        except BaseException as exc:  # reported by the main thread
            worker_result["error"] = exc

    # The worker starts first: it must wait for the head rather than fail.
    thread = threading.Thread(target=worker_main, daemon=True)
    thread.start()
    worker_started.wait()
    seen = tmp_path / "seen.txt"
    code = supervisors.run_head(
        head_role(port), [sys.executable, "-c", _TRAINER, str(seen), "3"],
        resource_name="NPU", devices_per_node=2, timeout_s=RAY_TEST_TIMEOUT_S, poll_interval_s=0.5,
        options=node_options(short_tmp, "h", HEAD_IP, head=True, devices={"NPU": 2}),
        env=ray_env, log_path=str(tmp_path / "head.log"))
    assert code == 3  # the trainer's own exit code comes back
    assert seen.read_text() == "2 4"
    # Head gone: the worker's raylet notices within ~5 s, then 4 s of grace; the outer limit
    # only stops a hang.
    thread.join(timeout=RAY_TEST_TIMEOUT_S)
    assert not thread.is_alive(), "worker did not leave after the head stopped"
    assert "error" not in worker_result, worker_result.get("error")
    assert worker_result["code"] == 0


def test_run_head_never_runs_the_trainer_without_its_nodes(
        tmp_path: Path, short_tmp: Path, ray_env: dict[str, str]) -> None:
    port = free_port(HEAD_IP)
    marker = tmp_path / "trainer-ran"
    with pytest.raises(rules.ClusterError, match="NODE_RANK=1: never joined"):
        supervisors.run_head(
            head_role(port), [sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
            resource_name="NPU", devices_per_node=2, poll_interval_s=0.5,
            # However slow the head is to start, the nodes then get 2 s: too short for none.
            head_timeout_s=RAY_TEST_TIMEOUT_S, timeout_s=2,
            options=node_options(short_tmp, "h", HEAD_IP, head=True, devices={"NPU": 2}),
            env=ray_env, log_path=str(tmp_path / "head.log"))
    assert not marker.exists()
    # The head was stopped on the way out: its port no longer answers.
    assert not readiness.head_reachable(f"{HEAD_IP}:{port}", timeout_s=1)


def test_worker_gives_up_when_no_head_answers(ray_env: dict[str, str]) -> None:
    role = worker_role(free_port(HEAD_IP))
    with pytest.raises(rules.ClusterError, match=r"no Ray head answered within 2s \(NODE_RANK=1\)"):
        supervisors.run_worker(role, join_timeout_s=2, rejoin_grace_s=1, probe_interval_s=0.2, env=ray_env)


_HEAD_MAIN = textwrap.dedent(
    """
    import json, sys
    from recipe.cluster import ray_node, readiness, rules, supervisors
    spec = json.loads(sys.argv[1])
    role = rules.RayRole("head", spec["address"], 0, 1, "one-node cluster for the test")
    options = ray_node.NodeOptions(**spec["options"])
    sys.exit(supervisors.run_head(role, spec["trainer"], resource_name="NPU", devices_per_node=2,
                              timeout_s=spec["timeout"], poll_interval_s=0.5, options=options,
                              log_path=spec["log"]))
    """
)


def test_sigterm_stops_trainer_and_head(tmp_path: Path, short_tmp: Path,
                                        ray_env: dict[str, str]) -> None:
    """`docker stop` on rank 0: the trainer and the Ray head both end, nothing is left."""
    port = free_port(HEAD_IP)
    options = node_options(short_tmp, "h", HEAD_IP, head=True, devices={"NPU": 2})
    started = tmp_path / "trainer-started"
    trainer_pid = tmp_path / "trainer-pid"
    trainer = [sys.executable, "-c",
               f"import os, time; open({str(trainer_pid)!r}, 'w').write(str(os.getpid())); "
               f"open({str(started)!r}, 'w'); time.sleep(3600)"]
    spec = {"address": f"{HEAD_IP}:{port}", "trainer": trainer, "log": str(tmp_path / "head.log"),
            "timeout": RAY_TEST_TIMEOUT_S,
            "options": {"num_cpus": 1, "resources": {"NPU": 2}, "node_ip_address": HEAD_IP,
                        "temp_dir": options.temp_dir,
                        "object_store_memory": options.object_store_memory,
                        "extra_args": list(options.extra_args)}}
    proc = subprocess.Popen([sys.executable, "-c", _HEAD_MAIN, json.dumps(spec)], env=ray_env,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + RAY_TEST_TIMEOUT_S
        while not started.exists():
            assert proc.poll() is None, f"run_head ended early with {proc.returncode}"
            assert time.monotonic() < deadline, "the trainer never started"
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=RAY_TEST_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert code == 128 + signal.SIGTERM
    assert not readiness.head_reachable(f"{HEAD_IP}:{port}", timeout_s=1)
    assert not Path(f"/proc/{trainer_pid.read_text()}").exists(), "the trainer outlived run_head"


_TWO_NODE_HEAD_MAIN = textwrap.dedent(
    """
    import json, sys
    from recipe.cluster import ray_node, rules, supervisors
    spec = json.loads(sys.argv[1])
    role = rules.RayRole("head", spec["address"], 0, 2, "the head of two nodes")
    try:
        sys.exit(supervisors.run_head(role, spec["trainer"], resource_name="NPU", devices_per_node=2,
                                      timeout_s=spec["timeout"], poll_interval_s=0.5,
                                      options=ray_node.NodeOptions(**spec["options"]), log_path=spec["log"]))
    except rules.ClusterError as error:  # as the CLI prints it (exit 3)
        print("\\n".join(f"error: {problem}" for problem in error.problems), flush=True)
        sys.exit(3)
    """
)


def test_a_worker_lost_while_the_trainer_waits_ends_the_head_in_bounded_time_naming_it(
    tmp_path: Path, short_tmp: Path, ray_env: dict[str, str]
) -> None:
    """Issue 51: the worker node killed whole (its `ray start`, raylet and workers, as a preempted machine) while
    the trainer waits on it forever (a collective with no timeout): the head's run stops the trainer and ends with
    exit 3 and one line naming NODE_RANK=1 and saying a restart resumes, well within node_watch's bound."""
    import psutil

    from recipe.cluster import node_watch, ray_node

    port = free_port(HEAD_IP)
    head_options = node_options(short_tmp, "h", HEAD_IP, head=True, devices={"NPU": 2})
    trainer_pid = tmp_path / "trainer-pid"
    trainer = [sys.executable, "-c", f"import os, time; open({str(trainer_pid)!r}, 'w').write(str(os.getpid())); "
               "time.sleep(3600)"]  # fmt: skip
    spec = {"address": f"{HEAD_IP}:{port}", "trainer": trainer, "log": str(tmp_path / "head.log"),
            "timeout": RAY_TEST_TIMEOUT_S,
            "options": {"num_cpus": 1, "resources": {"NPU": 2}, "node_ip_address": HEAD_IP,
                        "temp_dir": head_options.temp_dir, "object_store_memory": head_options.object_store_memory,
                        "extra_args": list(head_options.extra_args)}}  # fmt: skip
    head = subprocess.Popen([sys.executable, "-c", _TWO_NODE_HEAD_MAIN, json.dumps(spec)], env=ray_env,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    worker = None
    try:
        readiness.wait_for_nodes(f"{HEAD_IP}:{port}", 1, "CPU", 1, timeout_s=RAY_TEST_TIMEOUT_S,  # type: ignore[arg-type]
                                 poll_interval_s=0.5, node_ip_address=HEAD_IP)  # fmt: skip
        worker = ray_node.start_worker(f"{HEAD_IP}:{port}", 1, env=ray_env, log_path=str(tmp_path / "worker.log"),
                                       options=node_options(short_tmp, "w", WORKER_IP, head=False, devices={"NPU": 2}))
        deadline = time.monotonic() + RAY_TEST_TIMEOUT_S
        while not trainer_pid.exists():
            assert head.poll() is None, f"run_head ended early with {head.returncode}: {head.stdout.read()}"  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the trainer never started"
            time.sleep(0.5)
        root = psutil.Process(worker.pid)
        for process in [root, *root.children(recursive=True)]:  # the whole machine at once
            process.kill()
        lost_at = time.monotonic()
        out, _ = head.communicate(timeout=RAY_TEST_TIMEOUT_S)
        took = time.monotonic() - lost_at
    finally:
        if head.poll() is None:
            os.killpg(head.pid, signal.SIGKILL)
        if worker is not None:
            worker.stop()
    bound = 30 + node_watch.CHECK_INTERVAL_S + node_watch.STOP_GRACE_S  # Ray's health checks, one read, the grace
    assert head.returncode == 3, out
    lines = [line for line in out.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and lines[0].startswith(f"error: NODE_RANK=1 ({WORKER_IP}"), out
    assert "left the Ray cluster while the trainer ran" in lines[0] and "resumes from its last save" in lines[0]
    assert took < bound, (took, bound)
    assert not Path(f"/proc/{trainer_pid.read_text()}").exists(), "the trainer outlived run_head"


def test_a_node_that_does_not_share_the_checkpoint_root_is_named(two_nodes: TwoNodes) -> None:
    """Two loopback nodes whose `run` resolved the checkpoint root to different directories (two local disks):
    the head's nonce is not found on NODE_RANK=1, which is named with its path and CHECKPOINT_DIR. Then the
    worker's root becomes a link to the head's (one shared volume) and the same cluster passes."""
    from recipe.cluster.shared_storage import NONCE_FILE, shared_storage_problems

    address, head_root, worker_root = two_nodes.address, two_nodes.head_root, two_nodes.worker_root
    nodes = readiness.wait_for_nodes(address, 2, "NPU", 2, timeout_s=RAY_TEST_TIMEOUT_S, poll_interval_s=0.5,
                                     node_ip_address=HEAD_IP)
    apart = shared_storage_problems(address, nodes, head_root, "/checkpoints", HEAD_IP)
    worker_root.rmdir()
    worker_root.symlink_to(head_root)
    shared = shared_storage_problems(address, nodes, head_root, "/checkpoints", HEAD_IP)
    (line,) = apart
    assert line.startswith(f"NODE_RANK=1 ({WORKER_IP}")
    assert f"cannot read {worker_root / NONCE_FILE}" in line and "CHECKPOINT_DIR='/checkpoints'" in line
    assert "No such file or directory" in line
    assert shared == []
    assert not (head_root / NONCE_FILE).exists()  # the check leaves nothing behind
