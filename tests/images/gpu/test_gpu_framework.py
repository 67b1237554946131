"""The gpu image's framework: packages import, carry the locked versions, see CUDA 13.0.

Marked `framework`: they run against the full image (.github/workflows/images.yml) and
are skipped, with that reason, on the CI stand-in base.
"""

from __future__ import annotations

from typing import Any

import pytest

from conftest import Image, lock_pins

PINS = lock_pins("gpu")
# Distributions a user checks first; each must equal docker/gpu/requirements*.lock.
PACKAGES = [
    "torch", "vllm", "verl", "megatron-core", "megatron-bridge", "transformer-engine-torch",
    "transformers", "ray", "flash-linear-attention", "flashinfer-python", "pydantic-settings",
]  # fmt: skip
MODULES = ["torch", "vllm", "verl", "megatron.core", "megatron.bridge", "ray", "fla", "transformers"]
# pip check's complaints that are decisions, each explained in docker/gpu/overrides.txt or
# excludes.txt; anything else is a broken install.
KNOWN_CONFLICTS = (
    "megatron-bridge 0.6.2 has requirement flashinfer-python==0.6.8.post1",
    "megatron-bridge 0.6.2 has requirement flashinfer-cubin==0.6.8.post1",
    "megatron-bridge 0.6.2 requires fast-hadamard-transform",
)


def _python(host: Any, code: str) -> str:
    return host.check_output("python3 -c %s", code).strip()


@pytest.mark.framework
@pytest.mark.parametrize("package", PACKAGES)
def test_package_version_equals_lock(host: Any, package: str) -> None:
    installed = _python(host, f"import importlib.metadata as m; print(m.version({package!r}))")
    assert installed == PINS[package]


@pytest.mark.framework
@pytest.mark.parametrize("module", MODULES)
def test_module_imports_without_a_gpu(host: Any, module: str) -> None:
    assert host.run("python3 -c %s", f"import {module}").rc == 0


@pytest.mark.framework
def test_torch_is_a_cuda_13_0_build(host: Any) -> None:
    assert _python(host, "import torch; print(torch.version.cuda)").startswith("13.0")


@pytest.mark.framework
def test_pip_check_reports_only_the_documented_overrides(host: Any) -> None:
    result = host.run("pip check")
    problems = [line for line in result.stdout.splitlines() if line.strip() and "No broken" not in line]
    assert [p for p in problems if not p.startswith(KNOWN_CONFLICTS)] == []


@pytest.mark.framework
def test_transformers_knows_qwen3_5_moe(host: Any) -> None:
    code = "from transformers.models.auto.configuration_auto import CONFIG_MAPPING as c; print('qwen3_5_moe' in c)"
    assert _python(host, code) == "True"


@pytest.mark.framework
def test_vllm_registers_qwen3_5_moe(host: Any) -> None:
    code = (
        "from vllm.model_executor.models.registry import ModelRegistry as r; "
        "print('Qwen3_5MoeForConditionalGeneration' in r.get_supported_archs())"
    )
    assert _python(host, code) == "True"


@pytest.mark.framework
def test_c_compiler_for_triton(host: Any) -> None:
    assert host.exists("cc")


@pytest.mark.framework
def test_nvidia_runtime_sees_all_gpus_by_default(image: Image) -> None:
    # From the nvidia/cuda base: tells the NVIDIA container toolkit what to inject.
    assert image.env.get("NVIDIA_VISIBLE_DEVICES") == "all"


@pytest.mark.framework
def test_nvidia_driver_capabilities_include_compute(image: Image) -> None:
    assert "compute" in image.env.get("NVIDIA_DRIVER_CAPABILITIES", "") or image.env.get(
        "NVIDIA_DRIVER_CAPABILITIES"
    ) == "all"


def test_recipe_user_is_in_video_group(host: Any) -> None:
    assert "video" in host.user("recipe").groups


@pytest.mark.accelerator
def test_torch_sees_a_gpu(host: Any) -> None:
    assert _python(host, "import torch; print(torch.cuda.is_available())") == "True"
