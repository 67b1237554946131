"""verl's platform for CPU: verl 0.9.1 ships nvidia, npu and rocm platforms only.

Registered under the name `cpu` (VERL_PLATFORM=cpu). verl then asks it for the device
module, the collective backend and the Ray resource to schedule on; everything a GPU would
count or synchronise is a no-op or answers from the host (psutil).
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psutil
import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry


class CpuDeviceModule(types.ModuleType):
    """torch.cpu plus the torch.cuda-style calls verl makes (memory statistics, RNG, caches)."""

    def __init__(self) -> None:
        super().__init__("tests_e2e_cpu_device")

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def current_device(self) -> int:
        return 0

    def set_device(self, *_args: Any, **_kwargs: Any) -> None:
        return None

    def synchronize(self, *_args: Any, **_kwargs: Any) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def ipc_collect(self) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def get_rng_state(self, *_args: Any, **_kwargs: Any) -> torch.Tensor:
        return torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor, *_args: Any, **_kwargs: Any) -> None:
        torch.set_rng_state(state)

    def memory_allocated(self, *_args: Any, **_kwargs: Any) -> int:
        # verl logs device memory around each phase; the process's RSS is the CPU's equivalent.
        return int(psutil.Process().memory_info().rss)

    memory_reserved = memory_allocated
    max_memory_allocated = memory_allocated
    max_memory_reserved = memory_allocated

    def reset_peak_memory_stats(self, *_args: Any, **_kwargs: Any) -> None:
        return None

    def mem_get_info(self, *_args: Any, **_kwargs: Any) -> tuple[int, int]:
        memory = psutil.virtual_memory()
        return int(memory.available), int(memory.total)

    def memory_stats(self, *_args: Any, **_kwargs: Any) -> dict[str, int]:
        return {}

    def get_device_name(self, *_args: Any, **_kwargs: Any) -> str:
        # verl/utils/flops_counter.py (MFU) asks for the device's marketing name.
        return "CPU"

    def get_device_properties(self, *_args: Any, **_kwargs: Any) -> types.SimpleNamespace:
        return types.SimpleNamespace(name="CPU", total_memory=psutil.virtual_memory().total)


DEVICE_MODULE = CpuDeviceModule()


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    """The host CPU as verl's one "device"."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> Any:
        return DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return True

    def current_device(self) -> str:
        # verl does tensor.to(get_device_id()): an int 0 would mean the accelerator, so answer "cpu".
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: Any) -> None:
        return None

    def synchronize(self, device_index: Any = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: Any) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[None, None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray sets CUDA_VISIBLE_DEVICES for the advertised "GPU"; nothing reads it on CPU.
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        # verl's ResourcePoolManager counts only "GPU"/"NPU" node resources: the run advertises
        # one fake GPU (+ray_kwargs.ray_init.num_gpus=1) and schedules on it.
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> None:
        return None
