"""The gpu image's framework: packages import, carry the locked versions, see CUDA 13.0.

Marked `framework`: they run against the full image, which .ci/images.sh builds here
(with --require-framework, so they cannot be skipped there).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from conftest import TRAINER_IMPORTS, Image, lock_pins, marked_line

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
    # vLLM logs INFO lines to stdout on import: read only this test's own line.
    code = (
        "from vllm.model_executor.models.registry import ModelRegistry as r; "
        "print('REGISTERED', 'Qwen3_5MoeForConditionalGeneration' in r.get_supported_archs())"
    )
    assert marked_line(_python(host, code), "REGISTERED") == "True"


@pytest.mark.framework
def test_every_distribution_the_trainer_needs_imports(host: Any) -> None:
    # verl's verl-core extra (TransferQueue, mathruler, torchcodec, ...) and what `run` checks.
    # Test tooling is left out of the image on purpose (docker/gpu/excludes.txt).
    output = host.check_output("python3 -c %s gpu pytest,pytest-asyncio,pytest-rerunfailures", TRAINER_IMPORTS)
    assert json.loads(marked_line(output, "IMPORT-FAILURES")) == {}


@pytest.mark.framework
def test_transformer_engine_pytorch_imports(host: Any) -> None:
    # Alone, `import transformer_engine` needs libnccl from a driver; torch loads it first.
    assert host.run("python3 -c %s", "import torch, transformer_engine.pytorch").rc == 0


@pytest.mark.framework
def test_megatron_uses_the_real_transformer_engine(host: Any) -> None:
    # Megatron silently falls back to local layers when TE does not import (HAVE_TE=False):
    # an import test of megatron.core passes either way, this one does not.
    code = "from megatron.core.extensions.transformer_engine import HAVE_TE; print('HAVE_TE', HAVE_TE)"
    assert marked_line(_python(host, code), "HAVE_TE") == "True"


@pytest.mark.framework
def test_triton_builds_a_launcher_module(host: Any) -> None:
    # What Triton does at a kernel's first launch: compile a C extension with `cc` against
    # Python.h and its bundled cuda.h, then load it. Runs without a GPU (no libcuda linked).
    code = (
        "import os, triton, triton.runtime.build as b\n"
        "inc = os.path.join(os.path.dirname(triton.__file__), 'backends', 'nvidia', 'include')\n"
        "src = '#include <Python.h>\\n#include <cuda.h>\\n'\n"
        "src += 'static struct PyModuleDef d = {PyModuleDef_HEAD_INIT, \"probe\", 0, -1, 0};\\n'\n"
        "src += 'PyMODINIT_FUNC PyInit_probe(void) { return PyModule_Create(&d); }\\n'\n"
        "print('LAUNCHER', b.compile_module_from_src(src, 'probe', include_dirs=[inc]).__name__)"
    )
    result = host.run("cd /tmp && python3 -c %s", code)
    assert result.rc == 0, result.stderr
    assert marked_line(result.stdout, "LAUNCHER") == "probe"


@pytest.mark.framework
def test_cuda_home_has_nvcc_for_flashinfer_jit(image: Image, host: Any) -> None:
    # flashinfer JIT-compiles kernels with $CUDA_HOME/bin/nvcc; the lock's CUDA wheels carry it.
    assert host.file(f"{image.env['CUDA_HOME']}/bin/nvcc").is_file


@pytest.mark.framework
def test_cuda_home_has_the_cuda_runtime_headers(image: Image, host: Any) -> None:
    assert host.file(f"{image.env['CUDA_HOME']}/include/cuda_runtime.h").is_file


@pytest.mark.framework
def test_c_compiler_for_triton(host: Any) -> None:
    assert host.exists("cc")


@pytest.mark.framework
def test_nvidia_runtime_sees_all_gpus_by_default(image: Image) -> None:
    # Tells the NVIDIA container toolkit what to inject (a CUDA base image would set it).
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
