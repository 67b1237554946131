"""No build tool is left in the final image: compiling happens in builder stages.

The one exception is a C compiler in the full framework images: Triton (vLLM,
flash-linear-attention; triton-ascend on npu) compiles its small launcher stubs with
`cc` at run time, so it is a runtime dependency there (checked in gpu/ and npu/).
"""

from __future__ import annotations

from typing import Any

import pytest


@pytest.mark.parametrize("tool", ["g++", "make", "nvcc", "git", "cmake"])
def test_no_build_tool_on_path(host: Any, tool: str) -> None:
    assert not host.exists(tool)
