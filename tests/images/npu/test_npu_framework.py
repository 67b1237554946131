"""The npu image's framework: CANN environment, locked versions, device access.

Marked `framework`: they run against the full image (.github/workflows/images.yml) and
are skipped, with that reason, on the CI stand-in base. `accelerator` ones need an NPU.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import json

from conftest import TRAINER_IMPORTS, Image, lock_pins, marked_line

PINS = lock_pins("npu")
DOCKERFILE = (Path(__file__).resolve().parents[3] / "docker" / "Dockerfile").read_text()
# Not on PyPI, so not in the lock: the Dockerfile's pin is the expected version.
TRITON_ASCEND = re.search(r"^ARG TRITON_ASCEND_VERSION=(\S+)$", DOCKERFILE, re.M)
PACKAGES = [
    "torch", "torch-npu", "vllm-ascend", "verl", "megatron-core", "megatron-bridge",
    "transformers", "ray", "pydantic-settings",
]  # fmt: skip
# Import without a driver: torch_npu and vllm_ascend load the driver's libraries, so
# they are checked with an NPU attached (accelerator) and found installed here.
MODULES = ["torch", "vllm", "verl", "megatron.core", "ray", "transformers"]
DRIVER_LIBS = ("/usr/local/Ascend/driver/lib64/common", "/usr/local/Ascend/driver/lib64/driver")


# Once torch_npu is installed, torch loads it at import through its device-backend entry
# point, and torch_npu needs CANN's and the driver's libraries: without an NPU even a plain
# `import torch` fails unless this is off. The accelerator tests leave it on.
NO_AUTOLOAD = "TORCH_DEVICE_BACKEND_AUTOLOAD=0"


def _python(host: Any, code: str, autoload: bool = False) -> str:
    prefix = "" if autoload else NO_AUTOLOAD + " "
    return host.check_output(prefix + "python3 -c %s", code).strip()


@pytest.mark.framework
@pytest.mark.parametrize("package", PACKAGES)
def test_package_version_equals_lock(host: Any, package: str) -> None:
    installed = _python(host, f"import importlib.metadata as m; print(m.version({package!r}))")
    assert installed == PINS[package]


@pytest.mark.framework
def test_vllm_is_the_locked_source_release_without_device_code(host: Any) -> None:
    # Built with VLLM_TARGET_DEVICE=empty, vLLM's version gains a "+empty" local part.
    installed = _python(host, "import importlib.metadata as m; print(m.version('vllm'))")
    assert installed == f"{PINS['vllm']}+empty"


@pytest.mark.framework
@pytest.mark.parametrize("module", MODULES)
def test_module_imports_without_an_npu(host: Any, module: str) -> None:
    assert host.run(NO_AUTOLOAD + " python3 -c %s", f"import {module}").rc == 0


@pytest.mark.framework
def test_every_distribution_the_trainer_needs_imports_but_cann_s(host: Any) -> None:
    # verl-core and what `run` checks; test tooling and torchcodec are left out on purpose
    # (docker/npu/excludes.txt). torch_npu and vllm_ascend need CANN: accelerator tests.
    output = host.check_output(
        NO_AUTOLOAD + " python3 -c %s npu pytest,pytest-asyncio,pytest-rerunfailures,torchcodec", TRAINER_IMPORTS
    )
    failures = json.loads(marked_line(output, "IMPORT-FAILURES"))
    assert {what for what in failures if what.split(":")[-1] not in ("torch_npu", "vllm_ascend")} == set()


@pytest.mark.framework
@pytest.mark.parametrize("module", ["torch_npu", "vllm_ascend", "triton"])
def test_npu_module_is_installed(host: Any, module: str) -> None:
    code = f"import importlib.util as u; print(u.find_spec({module!r}) is not None)"
    assert _python(host, code) == "True"


@pytest.mark.framework
def test_triton_ascend_version_is_the_dockerfiles_pin(host: Any) -> None:
    assert TRITON_ASCEND is not None, "docker/Dockerfile: no ARG TRITON_ASCEND_VERSION"
    installed = _python(host, "import importlib.metadata as m; print(m.version('triton-ascend'))")
    assert installed == TRITON_ASCEND.group(1)


@pytest.mark.framework
@pytest.mark.parametrize("name", ["ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "ASCEND_OPP_PATH"])
def test_cann_variable_points_at_a_folder(image: Image, host: Any, name: str) -> None:
    assert host.file(image.env[name]).is_directory


@pytest.mark.framework
@pytest.mark.parametrize("folder", DRIVER_LIBS)
def test_ld_library_path_finds_the_host_driver(image: Image, folder: str) -> None:
    # The driver is mounted from the host at run time; the loader must already look there.
    assert folder in image.env.get("LD_LIBRARY_PATH", "").split(":")


@pytest.mark.framework
def test_cann_version_is_the_labelled_one(image: Image, host: Any) -> None:
    home = image.env["ASCEND_TOOLKIT_HOME"]
    info = host.run("cat %s/*/ascend_toolkit_install.info %s/version.cfg 2>/dev/null", home, home).stdout
    assert image.labels["io.grpo-recipe.cann.version"] in info


@pytest.mark.framework
def test_c_compiler_for_triton_ascend(host: Any) -> None:
    assert host.exists("cc")


def test_recipe_user_is_in_hwhiaiuser_group(host: Any) -> None:
    assert "HwHiAiUser" in host.user("recipe").groups


def test_hwhiaiuser_gid_is_ascends_default(host: Any) -> None:
    assert host.group("HwHiAiUser").gid == 1000


@pytest.mark.accelerator
def test_torch_npu_sees_an_npu(host: Any) -> None:
    assert _python(host, "import torch, torch_npu; print(torch.npu.is_available())", autoload=True) == "True"
