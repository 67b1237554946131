"""recipe.cluster.ray_node: the `ray start` command line of a head and a worker, and the process that runs it.

The command line is pure and pinned flag by flag. RayNode is tested on small `sh` scripts standing in for
`ray start --block` (no Ray here): what a user relies on is that the node's output lands in its log, that it
gets the environment it was given, and that stopping it ends every process it left behind, and only those.
"""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from recipe.cluster import ray_node
from recipe.cluster.rules import ClusterError

SH = "/bin/sh"


def test_ray_start_argv_head() -> None:
    options = ray_node.NodeOptions(num_cpus=2, resources={"NPU": 16}, node_ip_address="10.0.0.1",
                                  temp_dir="/tmp/r", extra_args=("--include-dashboard=false",))
    argv = ray_node.ray_start_argv(node_rank=0, options=options, head_port=6379, ray="ray")
    assert argv == [
        "ray", "start", "--block", "--disable-usage-stats", "--labels=grpo-recipe/node-rank=0",
        "--head", "--port=6379", "--num-cpus=2", '--resources={"NPU": 16}',
        "--node-ip-address=10.0.0.1", "--temp-dir=/tmp/r", "--include-dashboard=false",
    ]


def test_ray_start_argv_worker_leaves_devices_to_ray() -> None:
    argv = ray_node.ray_start_argv(node_rank=3, options=ray_node.NodeOptions(), address="h:6379")
    assert argv == ["ray", "start", "--block", "--disable-usage-stats",
                    "--labels=grpo-recipe/node-rank=3", "--address=h:6379"]
    assert not any(a.startswith(("--num-gpus", "--resources")) for a in argv)


def test_ray_start_argv_passes_zero_counts_and_sorted_resources() -> None:
    """0 GPUs is a real answer (a CPU-only node), not "unset"; resources are written in one stable order."""
    options = ray_node.NodeOptions(num_cpus=0, num_gpus=0, resources={"b": 1.0, "NPU": 2, "a": 0.5},
                                   object_store_memory=10**8)
    argv = ray_node.ray_start_argv(node_rank=1, options=options, address="10.0.0.1:6379", ray="/venv/bin/ray")
    assert argv[5:] == ["--address=10.0.0.1:6379", "--num-cpus=0", "--num-gpus=0",
                        '--resources={"NPU": 2, "a": 0.5, "b": 1.0}', "--object-store-memory=100000000"]


def test_ray_start_argv_needs_exactly_one_of_head_or_address() -> None:
    why = r"^give exactly one of head_port \(head\) or address \(worker\)$"
    with pytest.raises(ValueError, match=why):
        ray_node.ray_start_argv(node_rank=0, options=ray_node.NodeOptions())
    with pytest.raises(ValueError, match=why):
        ray_node.ray_start_argv(node_rank=0, options=ray_node.NodeOptions(), head_port=1, address="h:1")


def _executable(path: Path, body: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{SH}\n{body}")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_ray_executable_prefers_the_one_beside_the_interpreter(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The image's venv ray, even when another ray comes first on PATH (the venv may not be on PATH)."""
    beside = _executable(tmp_path / "venv" / "bin" / "ray")
    _executable(tmp_path / "elsewhere" / "ray")
    monkeypatch.setattr(sys, "executable", str(tmp_path / "venv" / "bin" / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "elsewhere"))
    assert ray_node.ray_executable() == str(beside)


def test_ray_executable_falls_back_to_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "ray").write_text("not executable")  # a leftover file is no command
    on_path = _executable(tmp_path / "elsewhere" / "ray")
    monkeypatch.setattr(sys, "executable", str(tmp_path / "venv" / "bin" / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "elsewhere"))
    assert ray_node.ray_executable() == str(on_path)


def test_ray_executable_missing_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ClusterError) as caught:
        ray_node.ray_executable()
    assert caught.value.problems == ["ray: the `ray` command is not installed in this image"]


def _wait_for_file(path: Path) -> str:
    """Until the script wrote `path` (it reached its loop), then its text; the outer limit only stops a hang.

    A file of the script's own, not its log: where the log goes is what some tests check.
    """
    deadline = time.monotonic() + 10
    while not (path.exists() and path.read_text().endswith("\n")):
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.02)
    return path.read_text()


def test_the_log_gets_stdout_and_stderr_after_what_it_held(tmp_path: Path) -> None:
    """A restarted node appends to its log: the previous run's lines stay for the post-mortem."""
    log = tmp_path / "node.log"
    log.write_text("previous run\n")
    node = ray_node.RayNode([SH, "-c", "echo out; echo err >&2; exit 3"], log_path=str(log))
    assert node.wait() == 3
    assert node.stop() == 3
    assert log.read_text() == "previous run\nout\nerr\n"


def test_without_a_log_the_output_stays_on_this_process_streams(capfd: pytest.CaptureFixture[str]) -> None:
    node = ray_node.RayNode([SH, "-c", "echo out; echo err >&2"])
    assert node.wait() == 0
    node.stop()
    captured = capfd.readouterr()
    assert (captured.out, captured.err) == ("out\n", "err\n")


def test_the_node_gets_the_environment_it_was_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GREETING", "from this process")
    log = tmp_path / "node.log"
    script = ["-c", 'echo "${GREETING:-unset}"']
    for env in ({"GREETING": "given"}, None, {}):  # None: this process's own; {}: empty, not "inherit"
        node = ray_node.RayNode([SH, *script], env=env, log_path=str(log))
        assert node.wait() == 0
        node.stop()
    assert log.read_text().splitlines() == ["given", "from this process", "unset"]


def test_the_node_runs_in_a_process_group_of_its_own() -> None:
    """stop() ends that group by id: any other Ray on the machine, and this process, are left alone."""
    with ray_node.RayNode([SH, "-c", "sleep 30"]) as node:
        assert os.getpgid(node.pid) == node.pid != os.getpgid(0)
        assert node.poll() is None
    assert node.poll() is not None


def test_stop_asks_politely_first(tmp_path: Path) -> None:
    """SIGTERM first (Ray drains its node): the exit code is the one the node chose."""
    log, ready = tmp_path / "node.log", tmp_path / "ready"
    script = f"trap 'echo draining; exit 7' TERM; echo ready; echo > {ready}; while :; do sleep 0.05; done"
    node = ray_node.RayNode([SH, "-c", script], log_path=str(log))
    _wait_for_file(ready)
    assert node.stop() == 7
    assert log.read_text() == "ready\ndraining\n"


def _gone(pid: int) -> bool:
    """No such process, or a zombie no one reaps (a container's PID 1 may not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_stop_ends_what_the_node_left_behind(tmp_path: Path) -> None:
    """gcs_server may outlive `ray start`: whatever stays in the node's group is killed too."""
    pid_file = tmp_path / "child.pid"
    node = ray_node.RayNode([SH, "-c", f"trap 'exit 0' TERM; sleep 30 & echo $! > {pid_file}; wait"])
    child = int(_wait_for_file(pid_file))
    assert node.stop() == 0
    deadline = time.monotonic() + 10
    while not _gone(child):
        assert time.monotonic() < deadline, "the node's child outlived stop()"
        time.sleep(0.02)


def test_stop_kills_a_node_that_ignores_sigterm(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ready = tmp_path / "ready"
    # It would end by itself after 2 s: a stop that waited for it would see 0, not SIGKILL.
    node = ray_node.RayNode([SH, "-c", f"trap '' TERM; echo > {ready}; sleep 2"])
    _wait_for_file(ready)
    with caplog.at_level(logging.WARNING, logger=ray_node.__name__):
        assert node.stop(timeout_s=0.3) == -9
    assert caplog.messages == [f"ray start (pid {node.pid}) ignored SIGTERM for 0s; killing its group"]


def test_stop_after_the_node_ended_returns_its_code() -> None:
    node = ray_node.RayNode([SH, "-c", "exit 5"])
    assert node.wait() == 5
    assert node.stop() == 5  # no signal to a process that is gone, no error


def test_wait_gives_up_after_its_timeout() -> None:
    # The script ends by itself after 2 s: a wait without the timeout would return 0 then.
    with ray_node.RayNode([SH, "-c", "sleep 2"]) as node, pytest.raises(subprocess.TimeoutExpired):
        node.wait(0.1)


# `ray` here is a script that prints what it was asked and one variable of its environment.
_FAKE_RAY = 'echo "$*"; echo "NODE_ENV=${NODE_ENV:-}"; echo "GCS_WAIT=${RAY_gcs_rpc_server_reconnect_timeout_s:-}"\n'


@pytest.fixture
def fake_ray(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    ray = _executable(tmp_path / "venv" / "bin" / "ray", _FAKE_RAY)
    monkeypatch.setattr(sys, "executable", str(ray.parent / "python"))
    return ray


def test_start_head_runs_ray_start_head_rank_0(fake_ray: Path, tmp_path: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    log = tmp_path / "head.log"
    with caplog.at_level(logging.INFO, logger=ray_node.__name__):
        node = ray_node.start_head(6380, options=ray_node.NodeOptions(num_cpus=4), env={"NODE_ENV": "head"},
                                   log_path=str(log))
    assert node.wait() == 0
    node.stop()
    flags = "start --block --disable-usage-stats --labels=grpo-recipe/node-rank=0 --head --port=6380 --num-cpus=4"
    # The head's GCS is this node's own: no wait for it to change.
    assert log.read_text() == f"{flags}\nNODE_ENV=head\nGCS_WAIT=\n"
    assert caplog.messages == [f"Starting the Ray head: {fake_ray} {flags}"]


def test_start_worker_joins_the_head_with_its_rank(fake_ray: Path, tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    log = tmp_path / "worker.log"
    with caplog.at_level(logging.INFO, logger=ray_node.__name__):
        node = ray_node.start_worker("10.0.0.1:6380", 2, options=ray_node.NodeOptions(num_gpus=8),
                                     env={"NODE_ENV": "worker"}, log_path=str(log))
    assert node.wait() == 0
    node.stop()
    flags = ("start --block --disable-usage-stats --labels=grpo-recipe/node-rank=2 --address=10.0.0.1:6380 "
             "--num-gpus=8")
    # A lost head's GCS never comes back (no GCS fault tolerance): the raylet gives up after 15 s, not Ray's 60.
    assert log.read_text() == f"{flags}\nNODE_ENV=worker\nGCS_WAIT=15\n"
    assert caplog.messages == [f"Joining the Ray head at 10.0.0.1:6380: {fake_ray} {flags}"]


def test_a_workers_own_gcs_wait_wins(fake_ray: Path, tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    node = ray_node.start_worker("10.0.0.1:6380", 1, env={"RAY_gcs_rpc_server_reconnect_timeout_s": "600"},
                                 log_path=str(log))
    assert node.wait() == 0
    node.stop()
    assert log.read_text().endswith("GCS_WAIT=600\n")
