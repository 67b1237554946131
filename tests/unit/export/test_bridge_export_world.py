"""The one-process world the export runs in: real torch.distributed (gloo, world size 1) and megatron-core's
parallel state, set up only when the caller has none and torn down on the way out, even on an error.

A world left behind keeps gloo and TCP-store threads alive at interpreter exit, which crashed finished exports
(exit 139): every test checks what is left afterwards. No Megatron-Bridge needed.
"""

from __future__ import annotations

import os
import socket

import pytest

from recipe.export.bridge_export import ExportError, one_process_world


@pytest.fixture
def no_master(monkeypatch: pytest.MonkeyPatch) -> None:
    """MASTER_ADDR/MASTER_PORT unset, and whatever the export sets removed afterwards.

    setenv first: delenv of an unset variable records nothing to undo, so the values the world sets
    would leak into later tests (settings read MASTER_ADDR).
    """
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


def test_the_world_is_one_gloo_process_with_megatron_state_and_is_gone_after(
    no_master: None,
) -> None:
    import torch
    from megatron.core import parallel_state

    with one_process_world():
        assert (
            torch.distributed.get_world_size() == 1
            and torch.distributed.get_backend() == "gloo"
        )
        assert parallel_state.model_parallel_is_initialized()
        # A free port of its own on loopback, unless the caller named them.
        assert (
            os.environ["MASTER_ADDR"] == "127.0.0.1"
            and 0 < int(os.environ["MASTER_PORT"]) < 65536
        )
    assert not torch.distributed.is_initialized()
    assert not parallel_state.model_parallel_is_initialized()
    assert parallel_state._DATA_PARALLEL_GROUP is None


def test_an_error_inside_the_world_still_tears_it_down(no_master: None) -> None:
    import torch
    from megatron.core import parallel_state

    with pytest.raises(RuntimeError, match="^export failed$"), one_process_world():
        raise RuntimeError("export failed")
    assert (
        not torch.distributed.is_initialized()
        and not parallel_state.model_parallel_is_initialized()
    )


def test_a_callers_world_and_state_are_left_to_the_caller(no_master: None) -> None:
    import torch
    from megatron.core import parallel_state

    with one_process_world():
        with one_process_world():
            pass
        assert (
            torch.distributed.is_initialized()
            and parallel_state.model_parallel_is_initialized()
        )
    assert not torch.distributed.is_initialized()


def test_a_callers_world_without_megatron_state_keeps_the_world_loses_the_state(
    no_master: None,
) -> None:
    import torch
    from megatron.core import parallel_state

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = (
        "127.0.0.1",
        str(_free_port()),
    )
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    try:
        with one_process_world():
            assert parallel_state.model_parallel_is_initialized()
        assert (
            torch.distributed.is_initialized()
            and not parallel_state.model_parallel_is_initialized()
        )
    finally:
        torch.distributed.destroy_process_group()


def test_a_bigger_world_is_refused_and_torn_down(
    no_master: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    from megatron.core import parallel_state

    monkeypatch.setattr(torch.distributed, "get_world_size", lambda *a, **k: 2)
    with pytest.raises(ExportError) as error, one_process_world():
        pass
    assert str(error.value) == "export runs as one process; world size is 2"
    assert (
        not torch.distributed.is_initialized()
        and not parallel_state.model_parallel_is_initialized()
    )


def test_a_port_the_caller_set_is_used(no_master: None) -> None:
    import torch

    os.environ["MASTER_PORT"] = port = str(_free_port())
    with one_process_world():
        assert os.environ["MASTER_PORT"] == port and torch.distributed.is_initialized()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
