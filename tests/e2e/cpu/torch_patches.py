"""torch.distributed on a CPU platform."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

_original_init_process_group = dist.init_process_group


def init_process_group(*args: Any, backend: Any = None, **kwargs: Any) -> Any:
    """verl/utils/distributed.py:89 (verl 0.9.1) asks for backend f"cpu:gloo,{device}:{backend}", which on
    this platform is "cpu:gloo,cpu:gloo"; torch refuses a device type named twice. Plain gloo is the same."""
    if isinstance(backend, str) and backend.replace(" ", "") == "cpu:gloo,cpu:gloo":
        backend = "gloo"
    return _original_init_process_group(*args, backend=backend, **kwargs)


dist.init_process_group = init_process_group
