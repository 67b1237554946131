"""The Ray worker hook applies the allocator decision to verl's own run-time switch."""

from __future__ import annotations

import logging
import shutil
from typing import Iterator

import pytest

pytest.importorskip("verl", reason="needs the trainer extra: pip install -e '.[trainer]' (CI installs it)")
pytestmark = pytest.mark.verl

import torch  # noqa: E402
import verl.utils.device as verl_device  # noqa: E402

from recipe import worker_setup  # noqa: E402


@pytest.fixture
def allocator_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Record what verl asks torch's CUDA allocator to do (no GPU here), and restore verl afterwards."""
    calls: list[str] = []
    monkeypatch.setattr(torch.cuda.memory, "_set_allocator_settings", calls.append, raising=False)
    # verl picks its platform from the hardware; on this CPU machine pin it to CUDA's, as on a GPU node.
    from verl.plugin.platform.platform_cuda import PlatformCUDA

    monkeypatch.setattr(verl_device, "get_platform", lambda: PlatformCUDA())
    monkeypatch.setattr(verl_device, "set_expandable_segments", verl_device.set_expandable_segments)
    monkeypatch.setenv("RECIPE_DEVICE", "gpu")
    yield calls


def test_enabled_passes_verls_switch_through(allocator_calls: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RECIPE_EXPANDABLE_SEGMENTS", "1")
    worker_setup.configure_worker()
    verl_device.set_expandable_segments(True)
    verl_device.set_expandable_segments(False)
    assert allocator_calls == ["expandable_segments:True", "expandable_segments:False"]


def test_disabled_makes_verls_switch_a_no_op(allocator_calls: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RECIPE_EXPANDABLE_SEGMENTS", "0")
    worker_setup.configure_worker()
    verl_device.set_expandable_segments(True)
    assert allocator_calls == []


def test_configuring_twice_does_not_stack(allocator_calls: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RECIPE_EXPANDABLE_SEGMENTS", "1")
    worker_setup.configure_worker()
    worker_setup.configure_worker()
    verl_device.set_expandable_segments(True)
    assert allocator_calls == ["expandable_segments:True"]


def test_unsupported_torch_warns_with_the_cause_and_never_raises(
    allocator_calls: list[str], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delattr(torch.cuda.memory, "_set_allocator_settings")
    monkeypatch.setenv("RECIPE_EXPANDABLE_SEGMENTS", "1")
    with caplog.at_level(logging.WARNING, logger="recipe.worker_setup"):
        worker_setup.configure_worker()
        verl_device.set_expandable_segments(True)
    assert f"torch {torch.__version__} lacks torch.cuda.memory._set_allocator_settings" in caplog.text


def test_old_torch_npu_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_setup.metadata, "version", lambda name: "2.7.1" if name == "torch_npu" else "0")
    assert worker_setup.runtime_switch_unsupported("npu") == (
        "torch_npu 2.7.1 lacks torch.npu.memory._set_allocator_settings (needs >= 2.8.0.post2)"
    )


def test_missing_torch_npu_is_named() -> None:
    assert worker_setup.runtime_switch_unsupported("npu") == "torch_npu is not installed"


def test_ray_runs_the_hook_in_its_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """With Ray for real: the runtime_env the plan passes to ray.init reaches verl in a worker."""
    import tempfile

    ray = pytest.importorskip("ray")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    # Ray's socket paths must stay under 108 bytes: pytest's tmp_path is too deep.
    temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    ray.init(
        num_cpus=1,
        include_dashboard=False,
        _temp_dir=temp_dir,
        runtime_env={
            "worker_process_setup_hook": "recipe.worker_setup.configure_worker",
            "env_vars": {"RECIPE_EXPANDABLE_SEGMENTS": "0", "RECIPE_DEVICE": "gpu"},
        },
    )
    try:

        @ray.remote
        def switch_in_worker() -> bool:
            import verl.utils.device

            return hasattr(verl.utils.device.set_expandable_segments, "__wrapped__")

        assert ray.get(switch_in_worker.remote(), timeout=120) is True
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
