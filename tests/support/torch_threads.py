"""A fixture for test modules that mutmut runs: torch on one thread, so that forked children do not deadlock.

mutmut forks its process for every mutant; GNU OpenMP's thread pool, started by an earlier torch call in the
parent, is not fork-safe, and a child waits on it forever (a false "timeout"). Import it into a test module
(`from tests.support.torch_threads import single_threaded_torch  # noqa: F401`): it applies to that module.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True, scope="module")
def single_threaded_torch() -> Iterator[None]:
    """torch without its OpenMP pool for the module's tests; the previous thread count afterwards."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
