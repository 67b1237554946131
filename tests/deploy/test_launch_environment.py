"""The same settings on every launch path: what the user writes reaches the container, proven with the real renderers.

A `.env` (Compose) or k8s/base/settings.env (the Job, the RayJob) holding the recipe's settings, a
library's own variables, OVERRIDES and a typo is rendered by Compose v2 (`config`) and by kustomize
(`kubectl kustomize`); the container's environment read out of the rendered model is then given to
`entrypoint.py plan --json`, the recipe's own reader. So the typo's warning fires, the overrides reach
the trainer's argv, and the library variables arrive, on each of the four paths: Compose `up`,
`compose run` (the plan overlay), the Job and the RayJob.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.harness.rayjob import container_environment as _container_environment

from .conftest import REPO, run
from .test_compose import _clean_env

#: What a user writes into .env / settings.env: a setting, a typo of one, library variables, overrides.
USER_LINES = {
    "TP": "4",
    "TPP": "4",
    "WANDB_PROJECT": "geo3k-trials",
    "NCCL_DEBUG": "INFO",
    "HCCL_CONNECT_TIMEOUT": "1200",
    "CPU_AFFINITY_CONF": "1",
    "OVERRIDES": "trainer.total_training_steps=100 actor_rollout_ref.actor.optim.lr=2e-6",
}
#: What the OVERRIDES line must put into the trainer's argv.
EXPECTED_ARGV = ["trainer.total_training_steps=100", "actor_rollout_ref.actor.optim.lr=2e-6"]
TYPO_WARNING = "warning: TPP is not a setting (ignored); did you mean TP?"


def plan_in(environment: dict[str, str | None], tmp_path: Path) -> tuple[dict[str, Any], str]:
    """`entrypoint.py plan --json` run with exactly this container environment; (its document, its stderr)."""
    env = {name: value for name, value in environment.items() if value is not None}
    env.update(PATH=os.environ["PATH"], HOME=str(tmp_path), PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, str(REPO / "entrypoint.py"), "plan", "--json"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr


def assert_reaches_the_trainer(environment: dict[str, str | None], tmp_path: Path) -> None:
    """Every user line is in the container's environment, the typo is named, the overrides end the argv."""
    assert {name: environment.get(name) for name in USER_LINES} == USER_LINES
    plan, stderr = plan_in(environment, tmp_path)
    assert TYPO_WARNING in stderr.splitlines()
    assert plan["layout"]["tp"] == 4 and plan["layout"]["sources"]["TP"] == "environment"
    # The learning rate replaces the recipe's own in its place; the step count is added at the end.
    assert plan["argv"][-1] == EXPECTED_ARGV[0] and EXPECTED_ARGV[1] in plan["argv"]
    assert [item for item in plan["argv"] if item.startswith("actor_rollout_ref.actor.optim.lr=")] == [EXPECTED_ARGV[1]]
    assert plan["provenance"]["extra_overrides"] == EXPECTED_ARGV  # recorded as overrides after `--` are


# --- Compose ------------------------------------------------------------------------------


@pytest.mark.parametrize("files", [["compose.yaml"], ["compose.yaml", "compose.plan.yaml"]], ids=["up", "run-plan"])
@pytest.mark.parametrize("service", ["gpu", "npu"])
def test_every_dotenv_line_reaches_the_compose_service(compose_bin: str, tmp_path: Path, service: str,
                                                       files: list[str]) -> None:
    project = tmp_path / "project"
    project.mkdir()
    for name in files:
        shutil.copy(REPO / name, project / name)
    (project / ".env").write_text("".join(f"{name}={value}\n" for name, value in USER_LINES.items())
                                  + "SHM_SIZE=1gb\nHOST_MODELS_DIR=./m\n")
    args = [compose_bin, "--project-directory", str(project)] + [a for n in files for a in ("-f", str(project / n))]
    out = run([*args, "config", "--format", "json", service], env=_clean_env())
    assert out.returncode == 0, out.stderr
    environment = json.loads(out.stdout)["services"][service]["environment"]
    assert environment["DEVICE"] == service
    assert_reaches_the_trainer(environment, tmp_path)
    # Compose's own variables pass too, and the recipe takes them for what they are: no warning about them.
    assert environment["SHM_SIZE"] == "1gb" and environment["HOST_MODELS_DIR"] == "./m"


def test_the_shell_wins_over_dotenv_and_no_dotenv_is_no_error(compose_bin: str, tmp_path: Path) -> None:
    """A setting in the shell beats .env's (Compose's order); a project without .env still renders."""
    shutil.copy(REPO / "compose.yaml", tmp_path / "compose.yaml")
    bare = run([compose_bin, "--project-directory", str(tmp_path), "config", "--format", "json", "gpu"],
               env=_clean_env())
    assert bare.returncode == 0, bare.stderr
    (tmp_path / ".env").write_text("TP=4\nOVERRIDES=trainer.total_training_steps=100\n")
    out = run([compose_bin, "--project-directory", str(tmp_path), "config", "--format", "json", "gpu"],
              env=_clean_env(TP="8", OVERRIDES="trainer.total_training_steps=5"))
    assert out.returncode == 0, out.stderr
    environment = json.loads(out.stdout)["services"]["gpu"]["environment"]
    assert (environment["TP"], environment["OVERRIDES"]) == ("8", "trainer.total_training_steps=5")


def test_compose_variables_are_never_called_typos() -> None:
    """compose.yaml's own ${NAME}s reach the container through .env: none of them may draw a near-miss warning."""
    import re

    from recipe.env_warnings import near_miss_warnings

    names = set()
    for name in ("compose.yaml", "compose.plan.yaml"):
        names |= set(re.findall(r"\$\{([A-Z][A-Z0-9_]*)", (REPO / name).read_text()))
    assert {"SHM_SIZE", "RESTART_POLICY", "HOST_MODELS_DIR", "GPU_IMAGE"} <= names
    assert near_miss_warnings({name: "x" for name in names}) == []


# --- Kubernetes ---------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", ["gpu", "npu", "gpu-ray", "npu-ray"])
def test_every_settings_env_line_reaches_every_pod(kubectl_bin: str, tmp_path: Path, overlay: str) -> None:
    tree = tmp_path / "k8s"
    shutil.copytree(REPO / "k8s", tree)
    settings = tree / "base" / "settings.env"
    settings.write_text(settings.read_text() + "".join(f"{name}={value}\n" for name, value in USER_LINES.items()))
    out = run([kubectl_bin, "kustomize", str(tree / "overlays" / overlay)])
    assert out.returncode == 0, out.stderr
    docs = [doc for doc in yaml.safe_load_all(out.stdout) if doc]
    config_maps = {doc["metadata"]["name"]: doc["data"] for doc in docs if doc["kind"] == "ConfigMap"}
    containers: dict[str, dict[str, Any]] = {}
    for doc in docs:
        if doc["kind"] == "Job":
            specs = [doc["spec"]["template"]["spec"]]
        elif doc["kind"] == "RayJob":
            cluster = doc["spec"]["rayClusterSpec"]
            specs = [cluster["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"] for g in cluster["workerGroupSpecs"]]
        else:
            continue
        for spec in specs:
            for container in [*spec.get("initContainers", []), *spec["containers"]]:
                containers.setdefault(container["name"], container)
    assert containers, "no pod in the rendered overlay"
    for name, container in containers.items():
        environment = _container_environment(container, config_maps)
        assert {key: environment.get(key) for key in USER_LINES} == USER_LINES, name
    # The trainer runs where `entrypoint.py run` runs: the Job's trainer, the RayJob's head (its entrypoint
    # is submitted there), with the address KubeRay gives the driver.
    trainer = containers["trainer"] if "trainer" in containers else containers["ray-head"]
    environment = _container_environment(trainer, config_maps)
    if overlay.endswith("-ray"):
        environment["RAY_ADDRESS"] = "127.0.0.1:6379"
    assert_reaches_the_trainer(environment, tmp_path)


# --- Several nodes: the two-node e2e's own settings, as two machines' .env files -----------------------------


def test_the_two_node_e2es_settings_render_through_compose_on_both_machines(compose_bin: str, tmp_path: Path) -> None:
    """What tests/e2e/test_two_nodes.py gives each node's `run` (tests/e2e/harness/nodes.py: Cluster.user_settings)
    written as each machine's `.env` and rendered by Compose: every value reaches the container as the test ran
    it, and `plan --json` on each rendered environment plans the same trainer for both nodes, with the bounds a
    lost node and a lost head are held to."""
    from recipe.cluster.rules import lost_head_bound_s, lost_node_bound_s
    from tests.e2e.harness.nodes import new_cluster
    from tests.e2e.harness.plan import recipe_settings

    cluster = new_cluster({**recipe_settings(tmp_path / "checkpoints", save_freq=1), "RAY_WAIT_TIMEOUT": "30"})
    plans = []
    for rank in (0, 1):
        settings = cluster.user_settings(rank)
        project = tmp_path / f"machine-{rank}"
        project.mkdir()
        shutil.copy(REPO / "compose.yaml", project / "compose.yaml")
        (project / ".env").write_text("".join(f"{name}='{value}'\n" for name, value in settings.items()))
        out = run([compose_bin, "--project-directory", str(project), "config", "--format", "json", "gpu"],
                  env=_clean_env())  # fmt: skip
        assert out.returncode == 0, out.stderr
        environment = json.loads(out.stdout)["services"]["gpu"]["environment"]
        assert {name: environment.get(name) for name in settings} == settings
        plan, _ = plan_in(environment, tmp_path)
        assert (plan["settings"]["NODE_RANK"], plan["settings"]["NNODES"]) == (rank, 2)
        assert cluster.token not in json.dumps(plan)  # the plan redacts it
        plans.append(plan)
    assert plans[0]["argv"] == plans[1]["argv"]
    assert plans[0]["nodes"] == plans[1]["nodes"]
    assert (plans[0]["nodes"]["lost_node_bound_s"], plans[0]["nodes"]["lost_head_bound_s"]) == (
        lost_node_bound_s(), lost_head_bound_s(30))


def test_the_two_node_e2es_rayjob_renders_the_settings_it_ran_and_plans_its_driver(tmp_path: Path) -> None:
    """The RayJob the two-node e2e's restart runs (tests/e2e/harness/rayjob.py), rendered from k8s/overlays/gpu-ray
    with the e2e's settings in settings.env: every setting reaches both pods, NNODES is the overlay's and 1 + the
    worker replicas, and the entrypoint, given the head's environment and the cluster's address, plans the same
    trainer as the Compose nodes do with the same settings and overrides."""
    from tests.e2e.harness.nodes import new_cluster
    from tests.e2e.harness.plan import recipe_settings
    from tests.e2e.harness.rayjob import render_rayjob
    from tests.e2e.test_two_nodes import node_overrides, rayjob_settings

    cluster = new_cluster({**recipe_settings(tmp_path / "checkpoints", save_freq=1), "RAY_WAIT_TIMEOUT": "30"})
    settings = rayjob_settings(cluster)
    rendered = render_rayjob(settings, tmp_path)
    assert rendered.entrypoint == ["python3", "/opt/recipe/entrypoint.py", "run"]
    for env in (rendered.head_env, rendered.worker_env):
        assert {name: env.get(name) for name in settings} == settings
        assert env["NNODES"] == str(1 + rendered.worker_replicas)
    driver, _ = plan_in({**rendered.head_env, "RAY_ADDRESS": cluster.address}, tmp_path)
    overrides = node_overrides()  # what the Compose nodes get after `--`, here in OVERRIDES
    compose, _ = plan_in({**cluster.user_settings(0), "OVERRIDES": " ".join(overrides)}, tmp_path)
    assert driver["argv"] == compose["argv"]
    assert set(overrides) <= set(driver["argv"])
