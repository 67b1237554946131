"""Fixtures for checking a built image with pytest-testinfra.

    pytest tests/images --image grpo-recipe:gpu

A container is started once per session from the image with tini as PID 1 and
`sleep infinity` as its child, checked through testinfra's docker:// backend, and
removed at the end. `plan --json` checks start their own short-lived containers.

Markers:
- framework: needs the full framework stage (torch, vLLM, ...); skipped, with that
  reason, on an image whose `io.grpo-recipe.framework` label is not "full".
- accelerator: needs a GPU/NPU attached to the container; skipped unless --accelerator.
Tests under gpu/ and npu/ are skipped on an image built for the other device.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import testinfra

sys.path.insert(0, str(Path(__file__).resolve().parent))
from repo_version import repo_version  # noqa: E402

DOCKER = os.environ.get("DOCKER", "docker")
HERE = Path(__file__).resolve().parent
DEVICE_LABEL = "io.grpo-recipe.device"
FRAMEWORK_LABEL = "io.grpo-recipe.framework"


def pytest_addoption(parser: pytest.Parser) -> None:
    """--image names the image under test; --accelerator says devices are attached."""
    group = parser.getgroup("images", "image tests (tests/images)")
    group.addoption("--image", help="image reference to check, e.g. grpo-recipe:gpu")
    group.addoption(
        "--accelerator",
        action="store_true",
        help="the host has the image's devices and passes them in (docker run options "
        "from $IMAGE_RUN_ARGS); runs tests marked accelerator",
    )
    group.addoption(
        "--require-framework",
        action="store_true",
        help="the image must be a full framework build: a framework test that would be "
        "skipped on it is an error instead (CI sets this for the gpu image it builds)",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Register this suite's markers (the project runs pytest with --strict-markers)."""
    config.addinivalue_line("markers", "framework: needs the full framework stage of the image")
    config.addinivalue_line("markers", "accelerator: needs a GPU/NPU passed to the container")


def docker(*args: str, check: bool = True, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the docker CLI and capture text output."""
    return subprocess.run(
        [DOCKER, *args], check=check, capture_output=True, text=True, env=env, timeout=300
    )


@dataclass(frozen=True)
class Image:
    """The image under test and what its configuration says."""

    ref: str
    config: dict[str, Any]

    @property
    def labels(self) -> dict[str, str]:
        """Image labels (empty when none)."""
        return self.config.get("Labels") or {}

    @property
    def env(self) -> dict[str, str]:
        """Image-level environment as a dict."""
        return dict(item.split("=", 1) for item in self.config.get("Env") or [])

    @property
    def device(self) -> str | None:
        """gpu or npu, from the image's device label."""
        return self.labels.get(DEVICE_LABEL)

    @property
    def full_framework(self) -> bool:
        """True when the image was built on the real framework stage."""
        return self.labels.get(FRAMEWORK_LABEL) == "full"


@pytest.fixture(scope="session")
def image(request: pytest.FixtureRequest) -> Image:
    """The image under test, inspected once."""
    ref = request.config.getoption("--image")
    if not ref:
        pytest.skip("no --image given: these tests check a built image")
    inspected = json.loads(docker("image", "inspect", ref).stdout)[0]
    return Image(ref=ref, config=inspected["Config"])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip device folders that do not match the image, and marked tests that cannot run."""
    ref = config.getoption("--image")
    labels: dict[str, str] = {}
    if ref:
        result = docker("image", "inspect", "--format", "{{json .Config.Labels}}", ref, check=False)
        if result.returncode != 0:
            raise pytest.UsageError(f"--image {ref}: {result.stderr.strip()}")
        labels = json.loads(result.stdout) or {}
    device = labels.get(DEVICE_LABEL)
    framework = labels.get(FRAMEWORK_LABEL, "unlabelled")
    for item in items:
        folder = Path(str(item.fspath)).resolve().parent
        if ref and folder.parent == HERE and folder.name in ("gpu", "npu") and folder.name != device:
            item.add_marker(pytest.mark.skip(reason=f"{folder.name} check; the image is for {device}"))
        if ref and "framework" in item.keywords and framework != "full":
            if config.getoption("--require-framework"):
                raise pytest.UsageError(
                    f"--require-framework: {ref} has {FRAMEWORK_LABEL}={framework!r}, not 'full'; "
                    f"its framework tests would be skipped"
                )
            item.add_marker(
                pytest.mark.skip(reason=f"needs the full framework stage; this image's is {framework}")
            )
        if "accelerator" in item.keywords and not config.getoption("--accelerator"):
            item.add_marker(pytest.mark.skip(reason="needs a GPU/NPU in the container (--accelerator)"))


@pytest.fixture(scope="session")
def container(image: Image, request: pytest.FixtureRequest) -> Iterator[str]:
    """A running container of the image: tini as PID 1 keeping `sleep infinity` alive."""
    extra = os.environ.get("IMAGE_RUN_ARGS", "").split() if request.config.getoption("--accelerator") else []
    cid = docker(
        "run", "--detach", "--rm", *extra, "--entrypoint", "tini", image.ref, "--", "sleep", "infinity"
    ).stdout.strip()
    try:
        yield cid
    finally:
        docker("rm", "--force", cid, check=False)


@pytest.fixture(scope="session")
def host(container: str) -> Any:
    """testinfra host for the running container."""
    return testinfra.get_host(f"docker://{container}")


@dataclass(frozen=True)
class Plan:
    """Result of `plan --json` run by the image's own entrypoint."""

    returncode: int
    stdout: str
    stderr: str

    def json(self) -> dict[str, Any]:
        """The plan document; fails the test with stderr when it is not JSON."""
        assert self.returncode == 0, f"plan exited {self.returncode}: {self.stderr}"
        return json.loads(self.stdout)


@pytest.fixture(scope="session")
def run_plan(image: Image) -> Any:
    """Call with an environment dict: runs `docker run -e ... IMAGE plan --json`."""

    def run(environment: Mapping[str, str]) -> Plan:
        env_args = [arg for key, value in environment.items() for arg in ("--env", f"{key}={value}")]
        result = docker("run", "--rm", *env_args, image.ref, "plan", "--json", check=False)
        return Plan(result.returncode, result.stdout, result.stderr)

    return run


@pytest.fixture(scope="session")
def expected_version() -> str:
    """The recipe version declared by this repository."""
    return repo_version()


def lock_pins(device: str) -> dict[str, str]:
    """name -> version of every pin in docker/<device>/*.lock (what the image must carry)."""
    pins: dict[str, str] = {}
    for lock in sorted((HERE.parents[1] / "docker" / device).glob("*.lock")):
        for line in lock.read_text().splitlines():
            if "==" in line and not line.startswith((" ", "#", "-")):
                name, version = line.split(" ")[0].split(";")[0].split("==")
                pins[name.split("[")[0].lower()] = version
    return pins


#: Run inside an image as `python3 -c TRAINER_IMPORTS DEVICE SKIPPED`: imports every
#: distribution of verl's verl-core extra (read from the image's own verl metadata), minus
#: the comma-separated SKIPPED ones, and every module `run` checks for (recipe.run.preflight), then
#: prints one line `IMPORT-FAILURES <json>`: {what: why} for each that does not import.
TRAINER_IMPORTS = r"""
import importlib, importlib.metadata as m, importlib.util, json, re, sys
from recipe.run.preflight import TRAINER_MODULES, TRAINER_SUPPORT_MODULES
device, skipped = sys.argv[1], {s for s in sys.argv[2].split(",") if s}
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
core = {norm(re.split(r"[\s<>=!~\[(;]", r, maxsplit=1)[0]) for r in m.requires("verl") or []
        if re.search(r"extra\s*==\s*.verl-core.", r)}
tops = {}
for top, dists in m.packages_distributions().items():
    for dist in dists:
        # Metadata may name tops that are not importable (torchcodec's lists FAKE_NAME).
        if not top.startswith("_") and top.isidentifier() and importlib.util.find_spec(top):
            tops.setdefault(norm(dist), set()).add(top)
wanted = {f"{dist}:{top}": top for dist in core - skipped for top in tops.get(dist, ())}
failures = {dist: "not installed" for dist in core - skipped if dist not in tops}
wanted.update({f"{dist}:{module}": module for module, dist in {**TRAINER_MODULES[device], **TRAINER_SUPPORT_MODULES}.items()})
for what, module in sorted(wanted.items()):
    try:
        importlib.import_module(module)
    except BaseException as error:
        failures[what] = f"{type(error).__name__}: {error}"[:400]
print("IMPORT-FAILURES", json.dumps(failures, sort_keys=True))
"""


def marked_line(output: str, marker: str) -> str:
    """The payload of the last line starting with MARKER (libraries may print around it)."""
    lines = [line for line in output.splitlines() if line.startswith(marker + " ")]
    assert lines, f"no {marker!r} line in the output:\n{output[-2000:]}"
    return lines[-1][len(marker) + 1 :]

