"""The several-node bootstrap against real Ray processes on loopback.

Each test starts its own head (and worker) with `ray start --block` under a
temp dir and ports of its own, on 127.0.0.2 / 127.0.0.3, and ends them by pid.
Devices are stood in for by a custom resource ("NPU") or --num-gpus: the wait
only reads what Ray registered. The trainer is a small Python command that
checks it reached the cluster through RAY_ADDRESS.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="ray is not installed (the test extra pins ray==2.60.0)")

from recipe import cluster  # noqa: E402

HEAD_IP = "127.0.0.2"
WORKER_IP = "127.0.0.3"


def _free_port(host: str = HEAD_IP) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short temp dir: Ray's unix socket paths under it must stay below 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="rt-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def ray_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Environment for our Ray processes and the in-process driver."""
    # Token auth would write ~/.ray/auth_token shared with other Ray users.
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    # A raylet notices a lost head after this many seconds (default 60).
    monkeypatch.setenv("RAY_gcs_rpc_server_reconnect_timeout_s", "5")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return dict(os.environ)


def _options(tmp_path: Path, name: str, ip: str, *, head: bool, devices: dict[str, float],
             num_gpus: int | None = None) -> cluster.NodeOptions:
    """Small nodes with ports of their own so parallel Ray users never clash."""
    # Ray's fixed default ports (dashboard 8265, agent 52365) would clash with
    # any other Ray on the machine.
    extra = [f"--dashboard-agent-listen-port={_free_port(ip)}"]
    if head:
        extra += ["--include-dashboard=false", f"--dashboard-port={_free_port(ip)}"]
    return cluster.NodeOptions(
        num_cpus=1, num_gpus=num_gpus, resources=devices, node_ip_address=ip,
        temp_dir=str(tmp_path / name), object_store_memory=80 * 1024 * 1024,
        extra_args=tuple(extra),
    )


def _head_role(port: int, nnodes: int = 2) -> cluster.RayRole:
    return cluster.plan_ray_role(nnodes, 0, HEAD_IP, port, None)


def test_wait_succeeds_when_the_worker_joins(tmp_path: Path, short_tmp: Path, ray_env: dict[str, str]) -> None:
    port = _free_port()
    role = _head_role(port)
    head = cluster.start_head(port, options=_options(short_tmp, "h", HEAD_IP, head=True,
                                                     devices={"NPU": 2}),
                              env=ray_env, log_path=str(tmp_path / "head.log"))
    worker = None
    try:
        worker_role = cluster.plan_ray_role(2, 1, HEAD_IP, port, None)
        worker = cluster.start_worker(worker_role.address or "", 1,
                                      options=_options(short_tmp, "w", WORKER_IP, head=False,
                                                       devices={"NPU": 2}),
                                      env=ray_env, log_path=str(tmp_path / "worker.log"))
        started = time.monotonic()
        ready = cluster.wait_for_nodes(role.address or "", 2, "NPU", 2, timeout_s=90,
                                       poll_interval_s=0.5, head=head, node_ip_address=HEAD_IP)
        assert sorted(n.node_rank or 0 for n in ready) == [0, 1] and None not in [n.node_rank for n in ready]
        assert sorted(n.address for n in ready) == [HEAD_IP, WORKER_IP]
        assert all(n.devices == 2 for n in ready)
        assert time.monotonic() - started < 90
    finally:
        if worker is not None:
            worker.stop()
        head.stop()
    assert head.poll() is not None and (worker is None or worker.poll() is not None)


def test_wait_fails_naming_the_missing_rank(tmp_path: Path, short_tmp: Path, ray_env: dict[str, str]) -> None:
    port = _free_port()
    role = _head_role(port, nnodes=3)
    head = cluster.start_head(port, options=_options(short_tmp, "h", HEAD_IP, head=True,
                                                     devices={"NPU": 2}),
                              env=ray_env, log_path=str(tmp_path / "head.log"))
    try:
        started = time.monotonic()
        with pytest.raises(cluster.ClusterError) as caught:
            cluster.wait_for_nodes(role.address or "", 3, "NPU", 2, timeout_s=12,
                                   poll_interval_s=0.5, head=head, node_ip_address=HEAD_IP)
        waited = time.monotonic() - started
    finally:
        head.stop()
    problems = caught.value.problems
    assert problems[0].startswith("NNODES=3: 1 node(s) with 2 NPU registered with Ray after")
    assert problems[1].startswith("NODE_RANK=1, 2: never joined")
    assert 12 <= waited < 60


def test_wait_names_a_node_short_of_devices(tmp_path: Path, short_tmp: Path, ray_env: dict[str, str]) -> None:
    """A node that joined without its GPUs is named, with what it has."""
    port = _free_port()
    role = _head_role(port)
    head = cluster.start_head(port, options=_options(short_tmp, "h", HEAD_IP, head=True,
                                                     devices={}, num_gpus=4),
                              env=ray_env, log_path=str(tmp_path / "head.log"))
    worker = None
    try:
        worker = cluster.start_worker(role.address or "", 1,
                                      options=_options(short_tmp, "w", WORKER_IP, head=False,
                                                       devices={}, num_gpus=0),
                                      env=ray_env, log_path=str(tmp_path / "worker.log"))
        with pytest.raises(cluster.ClusterError) as caught:
            cluster.wait_for_nodes(role.address or "", 2, "GPU", 4, timeout_s=15,
                                   poll_interval_s=0.5, head=head, node_ip_address=HEAD_IP)
    finally:
        if worker is not None:
            worker.stop()
        head.stop()
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
    port = _free_port()
    head_role = _head_role(port)
    worker_role = cluster.plan_ray_role(2, 1, HEAD_IP, port, None)
    worker_result: dict[str, object] = {}

    def worker_main() -> None:
        try:
            worker_result["code"] = cluster.run_worker(
                worker_role, join_timeout_s=60, rejoin_grace_s=4, probe_interval_s=0.5,
                options=_options(short_tmp, "w", WORKER_IP, head=False, devices={"NPU": 2}),
                env=ray_env, log_path=str(tmp_path / "worker.log"))
        except BaseException as exc:  # reported by the main thread
            worker_result["error"] = exc

    # The worker starts first: it must wait for the head rather than fail.
    thread = threading.Thread(target=worker_main, daemon=True)
    thread.start()
    time.sleep(2)
    seen = tmp_path / "seen.txt"
    code = cluster.run_head(
        head_role, [sys.executable, "-c", _TRAINER, str(seen), "3"],
        resource_name="NPU", devices_per_node=2, timeout_s=90, poll_interval_s=0.5,
        options=_options(short_tmp, "h", HEAD_IP, head=True, devices={"NPU": 2}),
        env=ray_env, log_path=str(tmp_path / "head.log"))
    assert code == 3  # the trainer's own exit code comes back
    assert seen.read_text() == "2 4"
    # Head gone: the worker's raylet notices within ~5 s, then 4 s of grace.
    thread.join(timeout=90)
    assert not thread.is_alive(), "worker did not leave after the head stopped"
    assert "error" not in worker_result, worker_result.get("error")
    assert worker_result["code"] == 0


def test_run_head_never_runs_the_trainer_without_its_nodes(
        tmp_path: Path, short_tmp: Path, ray_env: dict[str, str]) -> None:
    port = _free_port()
    marker = tmp_path / "trainer-ran"
    with pytest.raises(cluster.ClusterError, match="NODE_RANK=1: never joined"):
        cluster.run_head(
            _head_role(port), [sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
            resource_name="NPU", devices_per_node=2, timeout_s=8, poll_interval_s=0.5,
            options=_options(short_tmp, "h", HEAD_IP, head=True, devices={"NPU": 2}),
            env=ray_env, log_path=str(tmp_path / "head.log"))
    assert not marker.exists()
    # The head was stopped on the way out: its port no longer answers.
    assert not cluster.head_reachable(f"{HEAD_IP}:{port}", timeout_s=1)


def test_worker_gives_up_when_no_head_answers(ray_env: dict[str, str]) -> None:
    role = cluster.plan_ray_role(2, 1, HEAD_IP, _free_port(), None)
    started = time.monotonic()
    with pytest.raises(cluster.ClusterError, match=r"no Ray head answered within 2s \(NODE_RANK=1\)"):
        cluster.run_worker(role, join_timeout_s=2, rejoin_grace_s=1, probe_interval_s=0.2,
                           env=ray_env)
    assert time.monotonic() - started < 10


_HEAD_MAIN = textwrap.dedent(
    """
    import json, sys
    from recipe import cluster
    spec = json.loads(sys.argv[1])
    role = cluster.RayRole("head", spec["address"], 0, 1, "one-node cluster for the test")
    options = cluster.NodeOptions(**spec["options"])
    sys.exit(cluster.run_head(role, spec["trainer"], resource_name="NPU", devices_per_node=2,
                              timeout_s=60, poll_interval_s=0.5, options=options,
                              log_path=spec["log"]))
    """
)


def test_sigterm_stops_trainer_and_head(tmp_path: Path, short_tmp: Path,
                                        ray_env: dict[str, str]) -> None:
    """`docker stop` on rank 0: the trainer and the Ray head both end, nothing is left."""
    import json
    import signal
    import subprocess

    port = _free_port()
    options = _options(short_tmp, "h", HEAD_IP, head=True, devices={"NPU": 2})
    started = tmp_path / "trainer-started"
    trainer_pid = tmp_path / "trainer-pid"
    trainer = [sys.executable, "-c",
               f"import os, time; open({str(trainer_pid)!r}, 'w').write(str(os.getpid())); "
               f"open({str(started)!r}, 'w'); time.sleep(120)"]
    spec = {"address": f"{HEAD_IP}:{port}", "trainer": trainer, "log": str(tmp_path / "head.log"),
            "options": {"num_cpus": 1, "resources": {"NPU": 2}, "node_ip_address": HEAD_IP,
                        "temp_dir": options.temp_dir,
                        "object_store_memory": options.object_store_memory,
                        "extra_args": list(options.extra_args)}}
    env = {**ray_env, "PYTHONPATH": str(Path(cluster.__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-c", _HEAD_MAIN, json.dumps(spec)], env=env,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while not started.exists():
            assert proc.poll() is None, f"run_head ended early with {proc.returncode}"
            assert time.monotonic() < deadline, "the trainer never started"
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert code == 128 + signal.SIGTERM
    assert not cluster.head_reachable(f"{HEAD_IP}:{port}", timeout_s=1)
    assert not Path(f"/proc/{trainer_pid.read_text()}").exists(), "the trainer outlived run_head"
