"""compose.yaml and compose.plan.yaml, checked by a real Compose v2 and the compose-spec schema.

No engine needed: `docker-compose config` loads, interpolates, merges and
validates exactly as `docker compose up` would before it talks to Docker.
The one engine check at the end runs only where a Docker daemon answers.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from .conftest import REPO, run, tool

SERVICES = ("gpu", "npu")
FILES = {"up": ["compose.yaml"], "plan": ["compose.yaml", "compose.plan.yaml"]}
NPU_DRIVER_MOUNTS = ("/usr/local/Ascend/driver", "/usr/local/dcmi", "/usr/local/bin/npu-smi",
                     "/etc/ascend_install.info")
DATA_TARGETS = {"/models", "/data", "/checkpoints", "/cache/huggingface"}


def _clean_env(**extra: str) -> dict[str, str]:
    """The process environment without any recipe or compose variable, plus ``extra``."""
    names = _documented_names() | {"COMPOSE_FILE", "COMPOSE_PROJECT_NAME", "COMPOSE_PROFILES"}
    env = {k: v for k, v in os.environ.items() if k not in names}
    env.update(extra)
    return env


def _config(compose_bin: str, files: list[str], service: str, *, env: dict[str, str] | None = None,
            project_dir: Path = REPO) -> dict[str, Any]:
    args = [compose_bin, "--project-directory", str(project_dir)]
    for name in files:
        args += ["-f", str(project_dir / name)]
    out = run([*args, "config", "--format", "json", service], env=env or _clean_env())
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _documented_names() -> set[str]:
    text = (REPO / ".env.example").read_text()
    return set(re.findall(r"^#?\s*([A-Z][A-Z0-9_]*)=", text, flags=re.MULTILINE))


@pytest.mark.parametrize("mode", sorted(FILES))
@pytest.mark.parametrize("service", SERVICES)
def test_compose_config_passes(compose_bin: str, mode: str, service: str) -> None:
    args = [compose_bin]
    for name in FILES[mode]:
        args += ["-f", name]
    out = run([*args, "config", "--quiet", service], env=_clean_env())
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("service", SERVICES)
def test_env_example_loads_as_an_env_file(compose_bin: str, service: str) -> None:
    out = run([compose_bin, "--env-file", ".env.example", "config", "--quiet", service],
              env=_clean_env())
    assert out.returncode == 0, out.stderr


def test_compose_yaml_matches_the_compose_spec_schema() -> None:
    checker = tool("check-jsonschema", "check-jsonschema==0.39.0")
    out = run([checker, "--builtin-schema", "vendor.compose-spec", "compose.yaml"])
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("mode", sorted(FILES))
def test_resolved_config_matches_the_compose_spec_schema(compose_bin: str, mode: str,
                                                         tmp_path: Path) -> None:
    """The merged result (compose.plan.yaml's `!reset` tags resolved) is valid too."""
    checker = tool("check-jsonschema", "check-jsonschema==0.39.0")
    args = [compose_bin]
    for name in FILES[mode]:
        args += ["-f", name]
    resolved = run([*args, "config"], env=_clean_env())
    assert resolved.returncode == 0, resolved.stderr
    path = tmp_path / "resolved.yaml"
    path.write_text(resolved.stdout)
    out = run([checker, "--builtin-schema", "vendor.compose-spec", str(path)])
    assert out.returncode == 0, out.stdout + out.stderr


def test_gpu_service_reserves_every_gpu(compose_bin: str) -> None:
    gpu = _config(compose_bin, FILES["up"], "gpu")["services"]["gpu"]
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"capabilities": ["gpu"], "driver": "nvidia", "count": -1}]  # -1: all
    assert gpu["image"] == "grpo-recipe:gpu"
    assert gpu["environment"]["DEVICE"] == "gpu"


@pytest.mark.parametrize("device", ["gpu", "npu"])
def test_each_image_is_the_one_dockerfile_for_its_device(compose_bin: str, device: str) -> None:
    """`docker compose build DEVICE` is docker/Dockerfile with DEVICE: its framework and the one recipe stage (issue 24)."""
    build = _config(compose_bin, FILES["up"], device)["services"][device]["build"]
    assert build["dockerfile"] == "docker/Dockerfile" and build["args"]["DEVICE"] == device
    assert "target" not in build  # the last stage, the recipe


def test_npu_service_maps_devices_and_driver_without_privileged(compose_bin: str) -> None:
    npu = _config(compose_bin, FILES["up"], "npu")["services"]["npu"]
    assert not npu.get("privileged", False)
    sources = [d["source"] for d in npu["devices"]]
    assert sources[:16] == [f"/dev/davinci{i}" for i in range(16)]  # A3: 16 logical NPUs
    assert {"/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"} <= set(sources)
    mounts = {v["target"]: v for v in npu["volumes"]}
    for path in NPU_DRIVER_MOUNTS:
        assert mounts[path]["source"] == path
        assert mounts[path]["read_only"] is True
        assert mounts[path]["bind"]["create_host_path"] is False
    assert npu["group_add"] == ["1000"]
    assert npu["image"] == "grpo-recipe:npu" and npu["environment"]["DEVICE"] == "npu"


@pytest.mark.parametrize("service", SERVICES)
def test_runtime_settings_for_collectives(compose_bin: str, service: str) -> None:
    svc = _config(compose_bin, FILES["up"], service)["services"][service]
    assert int(svc["shm_size"]) >= 16 * 2**30  # NCCL/HCCL fail in Docker's 64 MB
    assert svc["ulimits"]["memlock"] == -1
    assert svc["ulimits"]["stack"] == 67108864
    assert svc["init"] is True
    assert svc["network_mode"] == "host"
    # No capability, no privilege gained through setuid (issue 11, item 19).
    assert svc["cap_drop"] == ["ALL"]
    assert svc["security_opt"] == ["no-new-privileges:true"]
    # Restart after a crash (resume), never after a finished run, and not forever.
    assert re.fullmatch(r"on-failure:\d+", svc["restart"])
    mounts = {v["target"]: v for v in svc["volumes"]}
    assert DATA_TARGETS <= set(mounts)
    assert mounts["/models"]["read_only"] is True
    assert not mounts["/checkpoints"].get("read_only", False)


@pytest.mark.parametrize("service", SERVICES)
def test_every_setting_reaches_the_container_only_when_set(compose_bin: str, service: str,
                                                           tmp_path: Path) -> None:
    from recipe import settings
    names = {n.upper() for n in settings.Settings.model_fields} - {"DEVICE", "RAY_ADDRESS"}
    env = _config(compose_bin, FILES["up"], service)["services"][service]["environment"]
    assert names <= set(env), sorted(names - set(env))
    # Unset on the host: unset (null) in the container, so the recipe's default applies.
    assert all(env[n] is None for n in names), {n: env[n] for n in names if env[n] is not None}
    # Set in the shell, or in an env file: passed through as is.
    env_file = tmp_path / "settings.env"
    env_file.write_text("PP=4\nHF_TOKEN=hf_example\n")
    out = run([compose_bin, "--env-file", str(env_file), "config", "--format", "json", service],
              env=_clean_env(TP="2", DEVICE="npu"))
    assert out.returncode == 0, out.stderr
    resolved = json.loads(out.stdout)["services"][service]["environment"]
    assert (resolved["TP"], resolved["PP"], resolved["HF_TOKEN"]) == ("2", "4", "hf_example")
    assert resolved["DEVICE"] == service  # the service word wins over a stray DEVICE


def test_env_example_documents_every_variable() -> None:
    documented = _documented_names()
    compose_text = (REPO / "compose.yaml").read_text()
    interpolated = set(re.findall(r"\$\{([A-Z][A-Z0-9_]*)", compose_text))
    passthrough = set(re.findall(r"^    ([A-Z][A-Z0-9_]*):\s*$", compose_text, flags=re.MULTILINE))
    wanted = interpolated | passthrough
    from recipe import settings
    wanted |= {n.upper() for n in settings.Settings.model_fields}
    assert wanted - documented == set()
    assert "RAY_WAIT_TIMEOUT" in documented and "MASTER_ADDR" in documented
    # Documentation only: nothing in it may take effect by being copied as is,
    # except the commented lines the user uncomments.
    live = [line for line in (REPO / ".env.example").read_text().splitlines()
            if line.strip() and not line.lstrip().startswith("#")]
    assert live == []


def test_plan_overlay_drops_device_access_only(compose_bin: str) -> None:
    for service in SERVICES:
        up = _config(compose_bin, FILES["up"], service)["services"][service]
        plan = _config(compose_bin, FILES["plan"], service)["services"][service]
        assert "devices" not in plan and "deploy" not in plan and not plan.get("group_add")
        assert plan["restart"] == "no"
        up_data = [v for v in up["volumes"] if v["target"] in DATA_TARGETS]
        assert plan["volumes"] == up_data  # same host paths, no Ascend driver mounts
        for key in ("image", "environment", "shm_size", "ulimits", "init", "network_mode", "cap_drop", "security_opt"):
            assert plan[key] == up[key], key


# mutation -> (text in compose.yaml, replacement, the validators that must reject it)
BROKEN = {
    # A misspelt key: npu would silently run without its devices.
    "unknown key": ("    devices:\n      - /dev/davinci0\n", "    devcies:\n      - /dev/davinci0\n",
                    {"compose", "schema"}),
    # A malformed size: the schema allows any string here, Compose parses it.
    "bad shm_size": ("shm_size: ${SHM_SIZE:-64gb}", "shm_size: lots", {"compose"}),
    # ulimits must be numbers (the schema lets any string through).
    "bad ulimit": ("memlock: -1 ", "memlock: unlimited ", {"compose"}),
    # A device list where a mapping belongs.
    "wrong type": ("  ulimits:\n", "  ulimits:\n    - memlock\n  x-was-ulimits:\n", {"compose", "schema"}),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_compose_file_fails(compose_bin: str, tmp_path: Path, case: str) -> None:
    old, new, rejected_by = BROKEN[case]
    text = (REPO / "compose.yaml").read_text()
    assert old in text, f"mutation {case!r} no longer applies to compose.yaml"
    broken = tmp_path / "compose.yaml"
    broken.write_text(text.replace(old, new, 1))
    out = run([compose_bin, "-f", str(broken), "config", "--quiet"], cwd=tmp_path,
              env=_clean_env())
    checker = tool("check-jsonschema", "check-jsonschema==0.39.0")
    schema = run([checker, "--builtin-schema", "vendor.compose-spec", str(broken)])
    rejected = {name for name, result in (("compose", out), ("schema", schema))
                if result.returncode != 0}
    assert rejected >= rejected_by, f"{case}: accepted by {sorted(rejected_by - rejected)}"


# --- with a Docker engine -----------------------------------------------------------------


def _engine() -> str:
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("no docker CLI: the engine check needs one to import its probe image")
    out = run([docker, "info", "--format", "{{.ServerVersion}}"], timeout=20)
    if out.returncode != 0:
        pytest.skip("no Docker engine answers at DOCKER_HOST (start dockerd to run this check)")
    return docker


#: The plain `pytest` run of .ci/run has no Docker engine yet; .ci/images.sh starts one, exports
#: DOCKER_HOST and runs the checks below again: there, under CI=true, a skip fails.
NEEDS_ENGINE = pytest.mark.ci_may_skip(
    "needs a Docker engine: .ci/images.sh runs it with one", unless_env="DOCKER_HOST"
)


@NEEDS_ENGINE
@pytest.mark.parametrize("service", SERVICES)
def test_engine_runs_without_accelerators_only_with_the_plan_overlay(
        compose_bin: str, kubectl_bin: str, tmp_path: Path, service: str) -> None:
    """On this machine (no GPU, no NPU) `up` files are refused, the plan overlay runs.

    The image is a stand-in (a static binary), tagged by GPU_IMAGE/NPU_IMAGE, so
    the check needs no build; what is real is compose.yaml + compose.plan.yaml.
    """
    docker = _engine()
    tag = f"grpo-recipe-probe:{uuid.uuid4().hex[:8]}"
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    shutil.copy(kubectl_bin, rootfs / "probe")
    tar = tmp_path / "probe.tar"
    subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tar), "probe"], check=True)
    imported = run([docker, "import", "-c", 'ENTRYPOINT ["/probe"]', str(tar), tag])
    assert imported.returncode == 0, imported.stderr
    hostdirs = {name: tmp_path / name for name in ("models", "data", "checkpoints", "hf")}
    for path in hostdirs.values():
        path.mkdir()
    env = _clean_env(GPU_IMAGE=tag, NPU_IMAGE=tag, SHM_SIZE="256mb",
                     HOST_MODELS_DIR=str(hostdirs["models"]), HOST_DATA_DIR=str(hostdirs["data"]),
                     HOST_CHECKPOINTS_DIR=str(hostdirs["checkpoints"]),
                     HOST_HF_CACHE_DIR=str(hostdirs["hf"]))
    # This sandbox's dockerd may not raise memlock/nofile past its own hard
    # limits; the ulimits themselves are checked by test_runtime_settings_for_collectives.
    limits = tmp_path / "sandbox-limits.yaml"
    limits.write_text(f"services:\n  {service}:\n    ulimits: !reset {{}}\n")
    project = f"probe{uuid.uuid4().hex[:8]}"
    try:
        results = {}
        for mode, files in FILES.items():
            args = [compose_bin, "-p", project, "--project-directory", str(REPO)]
            for name in files:
                args += ["-f", str(REPO / name)]
            args += ["-f", str(limits)]
            results[mode] = run([*args, "run", "--rm", "--pull", "never", service,
                                 "version", "--client"], env=env, timeout=120)
    finally:
        run([compose_bin, "-p", project, "-f", str(REPO / "compose.yaml"), "down", "--remove-orphans"],
            env=env)
        run([docker, "image", "rm", "-f", tag])
    assert results["plan"].returncode == 0, results["plan"].stderr
    assert "Client Version" in results["plan"].stdout
    assert results["up"].returncode != 0
    # npu: the first thing missing is one of the host's driver mounts (never
    # made up as empty directories), else the device nodes.
    driver = "|".join(re.escape(p) for p in NPU_DRIVER_MOUNTS)
    expected = ("could not select device driver" if service == "gpu" else
                f"bind source path does not exist: ({driver})|/dev/davinci0")
    assert re.search(expected, results["up"].stderr), results["up"].stderr



@NEEDS_ENGINE
@pytest.mark.parametrize("service", SERVICES)
def test_plan_through_compose_in_the_built_image(compose_bin: str, tmp_path: Path,
                                                 service: str) -> None:
    """`plan --json` through compose on this machine: settings and OVERRIDES reach the container."""
    docker = _engine()
    image = f"grpo-recipe:{service}"
    labels = run([docker, "image", "inspect", "--format", "{{json .Config.Labels}}", image], timeout=20)
    if labels.returncode != 0:
        pytest.skip(f"{image} is not built in this engine (.ci/images.sh builds it)")
    framework = json.loads(labels.stdout)["io.grpo-recipe.framework"]
    hostdirs = {name: tmp_path / name for name in ("models", "data", "checkpoints", "hf")}
    for path in hostdirs.values():
        path.mkdir()
    for name in ("data", "checkpoints", "hf"):  # as the README's set-up does: the image's user (uid 1000) writes there
        os.chown(hostdirs[name], 1000, 1000)
    limits = tmp_path / "sandbox-limits.yaml"  # see the engine check above
    limits.write_text(f"services:\n  {service}:\n    ulimits: !reset {{}}\n")
    env = _clean_env(SHM_SIZE="256mb", SAVE_FREQ="7", HF_TOKEN="hf_do_not_print",
                     HOST_MODELS_DIR=str(hostdirs["models"]), HOST_DATA_DIR=str(hostdirs["data"]),
                     HOST_CHECKPOINTS_DIR=str(hostdirs["checkpoints"]),
                     HOST_HF_CACHE_DIR=str(hostdirs["hf"]))
    project = f"plan{uuid.uuid4().hex[:8]}"
    args = [compose_bin, "-p", project, "--project-directory", str(REPO),
            "-f", str(REPO / "compose.yaml"), "-f", str(REPO / "compose.plan.yaml"), "-f", str(limits)]
    plan_argv = [*args, "run", "--rm", "--pull", "never", service, "plan", "--json"]
    overrides = {**env, "OVERRIDES": "trainer.total_training_steps=9"}
    try:
        with_overrides = run(plan_argv, env=overrides, timeout=180)
        plain = run(plan_argv, env=env, timeout=180) if framework == "standin" else with_overrides
    finally:
        run([*args, "down", "--remove-orphans"], env=env)
    for out in (with_overrides, plain):
        assert "hf_do_not_print" not in out.stdout + out.stderr
    if framework == "standin":
        # The stand-in framework has no Hydra, and `plan` checks overrides only the way the
        # trainer reads them: it refuses them by count, which shows that OVERRIDES arrived.
        assert with_overrides.returncode == 2, with_overrides.stderr
        assert "your overrides (1): need Hydra" in with_overrides.stderr
    assert plain.returncode == 0, plain.stderr
    plan = json.loads(plain.stdout)
    assert plan["device"]["name"] == service
    assert plan["settings"]["SAVE_FREQ"] == 7
    assert plan["settings"]["HF_TOKEN"] == "**********"
    if framework == "full":
        assert plan["argv"][-1] == "trainer.total_training_steps=9"  # OVERRIDES, the one way on every path
    else:
        assert framework == "standin", framework


def test_a2_override_from_the_docs(compose_bin: str, tmp_path: Path) -> None:
    """docs/deploy.md's compose.override.yaml for A2 nodes loads and gives 8 NPUs."""
    docs = (REPO / "docs" / "deploy.md").read_text()
    match = re.search(r"<!-- compose-override: 910b -->\n```yaml\n(.*?)```", docs, flags=re.DOTALL)
    assert match, "the A2 override block is gone from docs/deploy.md"
    override = tmp_path / "compose.override.yaml"
    override.write_text(match.group(1))
    npu = _config(compose_bin, ["compose.yaml"], "npu", project_dir=REPO)["services"]["npu"]
    args = [compose_bin, "--project-directory", str(REPO), "-f", str(REPO / "compose.yaml"),
            "-f", str(override), "config", "--format", "json", "npu"]
    out = run(args, env=_clean_env())
    assert out.returncode == 0, out.stderr
    a2 = json.loads(out.stdout)["services"]["npu"]
    davinci = [d["source"] for d in a2["devices"] if re.fullmatch(r"/dev/davinci\d+", d["source"])]
    assert davinci == [f"/dev/davinci{i}" for i in range(8)]
    assert a2["environment"]["NDEVICES_PER_NODE"] == "8"
    assert a2["volumes"] == npu["volumes"]  # the driver mounts stay


def test_tensorboard_serves_the_checkpoint_volume_only_under_its_profile(compose_bin: str) -> None:
    """`up gpu|npu` is unchanged (the service has a profile); it reads the event files read-only, on localhost."""
    plain = run([compose_bin, "config", "--services"], env=_clean_env())
    assert plain.returncode == 0 and sorted(plain.stdout.split()) == ["gpu", "npu"], plain.stderr
    out = run([compose_bin, "--profile", "tensorboard", "config", "--format", "json", "tensorboard"], env=_clean_env())
    assert out.returncode == 0, out.stderr
    service = json.loads(out.stdout)["services"]["tensorboard"]
    assert service["image"] == "grpo-recipe:gpu" and service["entrypoint"][:3] == ["tensorboard", "--logdir",
                                                                                   "/checkpoints/tensorboard"]
    (volume,) = service["volumes"]
    assert (volume["target"], volume["read_only"]) == ("/checkpoints", True)
    (port,) = service["ports"]
    assert (port["host_ip"], port["published"], port["target"]) == ("127.0.0.1", "6006", 6006)
