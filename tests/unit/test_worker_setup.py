"""The Ray worker hook applies the allocator decision to verl's own run-time switch, and installs the JSON-safe writer."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.support.needs import MEGATRON_BRIDGE, TEST_EXTRA, TRAINER_EXTRA, needs

needs("verl", install=TRAINER_EXTRA)
pytestmark = pytest.mark.verl

import torch  # noqa: E402
import verl.utils.device as verl_device  # noqa: E402

from recipe import worker_setup  # noqa: E402

from .raytools import HEAD_IP, RAY_TEST_TIMEOUT_S, prepare_ray_env, ray_nodes, short_temp_dir  # noqa: E402


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


@pytest.fixture(scope="module")
def hooked_ray(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real Ray cluster of one node (raytools), joined with the runtime_env the plan passes to ray.init.

    EXPANDABLE_SEGMENTS=false as recipe.allocator decides it (RECIPE_EXPANDABLE_SEGMENTS=0), on gpu.
    """
    ray = needs("ray", install=TEST_EXTRA)
    logs = tmp_path_factory.mktemp("ray-logs")
    with pytest.MonkeyPatch.context() as patch, short_temp_dir() as short:
        env = prepare_ray_env(patch)
        with ray_nodes(short, logs, env, with_worker=False) as address:
            ray.init(
                address=address,
                _node_ip_address=HEAD_IP,
                log_to_driver=False,
                runtime_env={
                    "worker_process_setup_hook": "recipe.worker_setup.configure_worker",
                    "env_vars": {"RECIPE_EXPANDABLE_SEGMENTS": "0", "RECIPE_DEVICE": "gpu",
                                 "RECIPE_HEALTH_THRESHOLDS": "mismatch_kl=0.01"},
                },
            )
            try:
                yield ray
            finally:
                ray.shutdown()


def test_in_a_ray_worker_the_switch_is_a_no_op_when_disabled(hooked_ray: Any) -> None:
    """What verl's workers call around weight sync does nothing, while verl's own switch would act."""

    @hooked_ray.remote
    def switch_in_worker() -> tuple[list[str], list[str]]:
        import torch
        import verl.utils.device as device
        from verl.plugin.platform.platform_cuda import PlatformCUDA

        calls: list[str] = []
        torch.cuda.memory._set_allocator_settings = calls.append  # no GPU here: record what verl asks
        device.get_platform = lambda: PlatformCUDA()  # as on a GPU node
        device.set_expandable_segments(True)  # the function verl's workers call
        guarded = list(calls)
        getattr(device.set_expandable_segments, "__wrapped__", lambda enable: None)(True)  # verl's own
        return guarded, calls[len(guarded):]

    guarded, unguarded = hooked_ray.get(switch_in_worker.remote(), timeout=RAY_TEST_TIMEOUT_S)
    assert guarded == []
    assert unguarded == ["expandable_segments:True"]  # the recording works: verl's switch would have acted


def test_in_a_ray_worker_the_json_safe_writer_is_installed(hooked_ray: Any) -> None:
    """verl's transformer_config.json write, in a worker: a value verl 0.9.1's own writer raises on is written."""
    needs("megatron.core", install=f"{MEGATRON_BRIDGE}: verl's checkpoint manager imports it")

    @hooked_ray.remote
    def save_in_worker() -> dict[str, Any]:
        import dataclasses
        import json
        import tempfile

        import numpy as np
        import verl.utils.checkpoint.megatron_checkpoint_manager as manager_module

        # A dataclass like Megatron's TransformerConfig (made without string annotations: this
        # test module is not importable in the worker). verl 0.9.1's json.dump raises "Circular
        # reference detected" on the numpy complex value.
        config = dataclasses.make_dataclass(
            "Config",
            [("num_layers", int, 4), ("moe_aux_loss_coeff", object, dataclasses.field(default=np.complex128(0.01)))],
        )()
        manager = object.__new__(manager_module.MegatronCheckpointManager)
        manager.rank, manager.transformer_config = 0, config
        directory = tempfile.mkdtemp()
        manager._save_transformer_config(directory)
        with open(f"{directory}/transformer_config.json") as written:
            return json.load(written)

    written = hooked_ray.get(save_in_worker.remote(), timeout=RAY_TEST_TIMEOUT_S)
    assert written == {"num_layers": 4, "moe_aux_loss_coeff": "(0.01+0j)"}


# --- Exact causes and choices, by direct calls (issue 27) -------------------------------------------


def test_a_worker_configured_again_follows_the_latest_decision(allocator_calls: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # Ray may run the hook again in a reused worker: the guard wraps verl's own switch, never an earlier guard.
    monkeypatch.setenv("RECIPE_EXPANDABLE_SEGMENTS", "0")
    worker_setup.configure_worker()
    monkeypatch.setenv("RECIPE_EXPANDABLE_SEGMENTS", "1")
    worker_setup.configure_worker()
    verl_device.set_expandable_segments(True)
    assert allocator_calls == ["expandable_segments:True"]


@pytest.mark.parametrize(("environment", "device"), [({}, "gpu"), ({"RECIPE_DEVICE": "npu"}, "npu")])
def test_the_switch_is_on_unless_disabled_and_checked_for_the_workers_device(
    allocator_calls: list[str], monkeypatch: pytest.MonkeyPatch, environment: dict[str, str], device: str
) -> None:
    asked: list[str] = []
    monkeypatch.delenv("RECIPE_DEVICE", raising=False)
    monkeypatch.delenv("RECIPE_EXPANDABLE_SEGMENTS", raising=False)  # unset: on, verl's own default
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(worker_setup, "runtime_switch_unsupported", lambda d: asked.append(d))
    worker_setup.configure_worker()
    verl_device.set_expandable_segments(True)
    assert (asked, allocator_calls) == ([device], ["expandable_segments:True"])


def test_a_disabled_switch_is_not_checked_and_warns_nothing(
    allocator_calls: list[str], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("RECIPE_EXPANDABLE_SEGMENTS", "0")
    monkeypatch.setattr(worker_setup, "runtime_switch_unsupported", lambda d: "would warn")
    with caplog.at_level(logging.WARNING, logger="recipe.worker_setup"):
        worker_setup.configure_worker()
    assert caplog.messages == []


def test_the_warning_names_the_cause_exactly_once(
    allocator_calls: list[str], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("RECIPE_EXPANDABLE_SEGMENTS", "1")
    monkeypatch.setattr(worker_setup, "runtime_switch_unsupported", lambda d: "torch_npu is not installed")
    with caplog.at_level(logging.WARNING, logger="recipe.worker_setup"):
        worker_setup.configure_worker()
        verl_device.set_expandable_segments(True)
    assert caplog.messages == ["expandable segments stay off in this worker: torch_npu is not installed"]
    assert allocator_calls == []


def test_a_verl_without_the_switch_is_named_and_left_alone(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delattr(verl_device, "set_expandable_segments")
    with caplog.at_level(logging.WARNING, logger="recipe.worker_setup"):
        worker_setup.configure_worker()
    assert not hasattr(verl_device, "set_expandable_segments")
    assert caplog.messages == [
        f"verl {worker_setup.metadata.version('verl')} has no verl.utils.device.set_expandable_segments; "
        "the allocator switch is left as verl does it"
    ]


class _NpuMemory:
    """torch.npu.memory of a torch_npu that can switch at run time."""

    @staticmethod
    def _set_allocator_settings(value: str) -> None:
        """Stands in for the real setter."""


@pytest.mark.parametrize(
    ("version", "npu", "cause"),
    [
        # The first release with the setter, and the setter present: the switch works.
        ("2.8.0.post2", type("npu", (), {"memory": _NpuMemory}), None),
        ("2.8.0.post1", type("npu", (), {"memory": _NpuMemory}), "torch_npu 2.8.0.post1 lacks torch.npu.memory._set_allocator_settings (needs >= 2.8.0.post2)"),
        # A new enough torch_npu that did not register torch.npu, or whose memory module lacks the setter.
        ("2.9.0", None, f"torch {torch.__version__} lacks torch.npu.memory._set_allocator_settings"),
        ("2.9.0", type("npu", (), {"memory": object()}), f"torch {torch.__version__} lacks torch.npu.memory._set_allocator_settings"),
    ],
)
def test_the_npu_switch_needs_the_release_and_the_setter(
    monkeypatch: pytest.MonkeyPatch, version: str, npu: Any, cause: str | None
) -> None:
    import sys
    import types

    monkeypatch.setattr(worker_setup.metadata, "version", lambda name: version)
    monkeypatch.setitem(sys.modules, "torch_npu", types.ModuleType("torch_npu"))
    if npu is None:
        monkeypatch.delattr(torch, "npu", raising=False)
    else:
        monkeypatch.setattr(torch, "npu", npu, raising=False)
    assert worker_setup.runtime_switch_unsupported("npu") == cause


def test_in_a_ray_worker_verls_off_policy_metrics_carry_the_mean_absolute_gap(hooked_ray: Any) -> None:
    """What verl's trainer calls each step, in a worker the hook ran in: the mismatch in slime's unit arrives with
    verl's prefix (recipe.mismatch), while the signed mean (`kl`) cancels to 0."""

    @hooked_ray.remote
    def metrics_in_worker() -> dict[str, float]:
        import torch
        from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask

        old = torch.full((1, 4), -1.0)
        _, _, metrics = compute_rollout_correction_and_rejection_mask(
            old_log_prob=old, rollout_log_prob=old + torch.tensor([[0.1, -0.1, 0.3, -0.3]]),
            response_mask=torch.ones(1, 4), rollout_is="token", rollout_is_threshold=2.0,
        )  # fmt: skip
        return {key: metrics[key] for key in ("rollout_corr/kl", "rollout_corr/abs_log_prob_diff") if key in metrics}

    metrics = hooked_ray.get(metrics_in_worker.remote(), timeout=RAY_TEST_TIMEOUT_S)
    assert metrics == {"rollout_corr/kl": pytest.approx(0.0, abs=1e-6), "rollout_corr/abs_log_prob_diff": pytest.approx(0.2)}


def test_in_a_ray_worker_verls_tracking_logs_the_health_curves_with_the_plans_bounds(
    hooked_ray: Any, tmp_path: Path
) -> None:
    """What verl's TaskRunner logs each step, in a worker the hook ran in: the step's metrics and one curve a sign
    (recipe.health_log), judged with the bounds the plan passed (a KL of 0.005 is under the 0.01 given, over the
    default 0.002), in verl's own TensorBoard file."""

    @hooked_ray.remote
    def log_in_worker(directory: str) -> None:
        os.environ["TENSORBOARD_DIR"] = directory
        from verl.utils.tracking import Tracking

        logger = Tracking("project", "experiment", default_backend="tensorboard")
        logger.log(data={"rollout_corr/kl": 0.005, "actor/grad_norm": float("inf")}, step=1)
        logger.finish()

    hooked_ray.get(log_in_worker.remote(str(tmp_path)), timeout=RAY_TEST_TIMEOUT_S)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path))
    events.Reload()
    value = {tag: events.Scalars(tag)[0].value for tag in events.Tags()["scalars"]}
    assert value["recipe_health/rollout_training_mismatch"] == 0.0
    assert value["recipe_health/gradient_norm_not_finite"] == 1.0 and value["rollout_corr/kl"] == pytest.approx(0.005)
