"""Settings + layout -> the Hydra overrides and environment of verl's GRPO trainer.

Pure functions: nothing here reads the machine or starts anything. The values
are upstream's tuned ones (verl examples/grpo_trainer/run_qwen3_5_35b_megatron.sh);
each deliberate difference is listed in docs/upstream.md with its reason.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from recipe.allocator import (
    ALLOC_CONF_VARIABLES,
    RUNTIME_SWITCH_VARIABLE,
    AllocatorDecision,
)
from recipe.device import Device
from recipe.errors import RecipeConfigError
from recipe.health_log import THRESHOLDS_VARIABLE
from recipe.hydra_text import hydra_string, hydra_value, literal_problem  # noqa: F401 - hydra_string: part of launch's API
from recipe.layout import DYNAMIC_BATCHING, ParallelLayout
from recipe.run_length import StepTotal, total_steps
from recipe.settings import Settings

#: verl.trainer.main_ppo, run through the recipe so that its exit status is the run's (recipe.trainer_main).
TRAINER_MODULE = "recipe.trainer_main"
#: Ray runs this in every worker before its first task (see recipe.worker_setup).
WORKER_SETUP_HOOK = "recipe.worker_setup.configure_worker"
_RAY_ENV = "ray_kwargs.ray_init.runtime_env.env_vars."

#: Device environment for the trainer and every Ray worker; a value the user set wins.
DEVICE_ENVIRONMENT: dict[Device, dict[str, str]] = {
    "gpu": {
        # Megatron overlaps TP communication with compute only with one hardware queue.
        "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        "VLLM_USE_V1": "1",
        # Upstream: vLLM's symmetric-memory all-reduce breaks under verl's colocated rollout.
        "VLLM_ALLREDUCE_USE_SYMM_MEM": "0",
    },
    "npu": {
        # Upstream sets this for Ascend: binds each process to the CPU cores nearest its NPU.
        "CPU_AFFINITY_CONF": "1",
        "VLLM_USE_V1": "1",
        # HCCL's default 120 s is too short for the first Megatron-Bridge load of a 35B model.
        "HCCL_CONNECT_TIMEOUT": "1800",
    },
}

#: What decides the allocator variables in the workers' environment (never an override after `--`).
ALLOCATOR_POLICY = "EXPANDABLE_SEGMENTS and PYTORCH_CUDA_ALLOC_CONF / PYTORCH_NPU_ALLOC_CONF (the allocator policy)"

#: The resume modes verl 0.9.1 knows; the v1 trainer fails at start on any other, after Ray is up.
RESUME_MODES = ("auto", "disable", "resume_path")

@dataclass(frozen=True)
class Override:
    """One Hydra override; `setting` names the recipe setting that decides it, if any."""

    key: str
    value: str
    prefix: str = ""
    setting: str | None = None

    def __str__(self) -> str:
        return f"{self.prefix}{self.key}={self.value}"


def _add(overrides: list[Override], key: str, value: object, prefix: str = "", setting: str | None = None) -> None:
    overrides.append(Override(key, hydra_value(value), prefix, setting))


#: verl 0.9.1's file logger (verl/utils/tracking.py FileLogger) writes to the path this variable names.
METRICS_VARIABLE = "VERL_FILE_LOGGER_PATH"
#: PROFILE=smoke: where that logger writes each step's metrics, under the experiment's checkpoint
#: directory; the smoke verdict (recipe.smoke.verdict) reads it.
METRICS_FILE = "smoke-metrics.jsonl"


def checkpoint_root(settings: Settings) -> Path:
    """Where this experiment's checkpoints go: CHECKPOINT_DIR/PROJECT_NAME/EXPERIMENT_NAME."""
    return settings.checkpoint_dir / settings.project_name / settings.experiment_name


def runtime_environment(
    settings: Settings, device: Device, allocator: AllocatorDecision, environ: Mapping[str, str]
) -> dict[str, str | None]:
    """Environment for the trainer and every Ray worker (None: unset). User values win; no secrets."""
    env: dict[str, str | None] = {}
    defaults = {
        **DEVICE_ENVIRONMENT[device],
        "TENSORBOARD_DIR": str(settings.checkpoint_dir / "tensorboard" / settings.project_name / settings.experiment_name),
        "RECIPE_DEVICE": device,
    }
    if settings.profile == "smoke":
        # verl's "file" logger (trainer.logger) writes each step's metrics there; `run` judges the smoke run from it.
        defaults[METRICS_VARIABLE] = str(checkpoint_root(settings) / METRICS_FILE)
    for name, value in defaults.items():
        env[name] = environ.get(name, value)
    # The allocator decision already folds in the user's own allocator options.
    env.update(allocator.environment())
    if settings.health_thresholds:  # the bounds `run` judges with, for the curves the trainer logs (recipe.health_log)
        env[THRESHOLDS_VARIABLE] = settings.health_thresholds
    # Each value reaches verl as a Hydra override (and the workers' environment through it).
    problems = [
        f"{name}={value!r}: {literal_problem(value)}" for name, value in env.items() if value and literal_problem(value)
    ]
    if problems:
        raise RecipeConfigError(problems)
    return env


def build_overrides(
    settings: Settings,
    device: Device,
    layout: ParallelLayout,
    runtime_env: Mapping[str, str | None],
    tracker_project: str | None = None,
) -> list[Override]:
    """The recipe's Hydra overrides for `python -m verl.trainer.main_ppo`, in upstream's order. `tracker_project`:
    WANDB_PROJECT when set (recipe.tracking), which names the trackers' project instead of PROJECT_NAME."""
    dynamic = DYNAMIC_BATCHING[device]
    npu = device == "npu"
    o: list[Override] = []
    actor, rollout, ref = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.ref"
    tcfg = f"{actor}.megatron.override_transformer_config"
    ocfg = f"{actor}.optim.override_optimizer_config"

    # Data
    _add(o, "data.train_files", str(settings.resolved_train_files), setting="TRAIN_FILES")
    _add(o, "data.val_files", str(settings.resolved_val_files), setting="VAL_FILES")
    _add(o, "data.train_batch_size", settings.train_batch_size, setting="TRAIN_BATCH_SIZE")
    _add(o, "data.max_prompt_length", 1024)
    _add(o, "data.max_response_length", 2048)
    _add(o, "data.truncation", "error")
    _add(o, "data.filter_overlong_prompts", True)
    # Seeds pinned, not left to verl's defaults (data.seed is null there): the run record holds them.
    _add(o, "data.seed", settings.seed, setting="SEED")

    # Algorithm: GRPO, KL as a loss term rather than in the reward.
    _add(o, "algorithm.adv_estimator", "grpo")
    _add(o, "algorithm.use_kl_in_reward", False)
    # vLLM and Megatron compute the same MoE with other kernels (and may route a token to other experts): the
    # samples come from another policy than the one trained. Truncated importance sampling weighs each token by
    # its ratio, capped at 2 as NeMo-RL's Qwen3.5-35B-A3B geo3k recipe does (verl's own default cap); upstream's
    # script sets none (docs/health.md, docs/upstream.md).
    correction = None if settings.rollout_correction == "off" else settings.rollout_correction
    _add(o, "algorithm.rollout_correction.rollout_is", correction, setting="ROLLOUT_CORRECTION")
    _add(o, "algorithm.rollout_correction.rollout_is_threshold", 2.0)

    # Model. Packed (THD) sequences on both targets: megatron-core 0.19.2's Gated DeltaNet takes
    # them (cu_seqlens reach its conv and delta-rule kernels, added in 0.18), and verl's
    # remove-padding forward of the smoke Qwen3.5 gives the log-probs of the padded one
    # (tests/e2e/test_parity.py: both within 1.3e-6 of each sequence's own forward on CPU,
    # and the CPU e2e trains this way). Padding costs compute on every padded token.
    _add(o, "actor_rollout_ref.model.path", str(settings.model_path), setting="MODEL_PATH")
    _add(o, "actor_rollout_ref.model.trust_remote_code", True)
    _add(o, "actor_rollout_ref.model.use_remove_padding", True)

    # Actor
    _add(o, f"{actor}.optim.lr", 1e-6)
    # A resume continues the LR schedule where the checkpoint left it. verl 0.9.1 loads the
    # scheduler's state only with this on (utils/checkpoint/megatron_checkpoint_manager.py:956);
    # off, a resumed run restarts its warmup and decay from step 0 (tests/e2e/test_resume.py
    # found the scheduler one step behind the uninterrupted run). A changed schedule is
    # refused before that by the drift guard, so the checkpoint's values are the run's own.
    _add(o, f"{actor}.optim.use_checkpoint_opt_param_scheduler", True)
    _add(o, f"{actor}.ppo_mini_batch_size", settings.train_batch_size, setting="TRAIN_BATCH_SIZE")
    _add(o, f"{actor}.ppo_micro_batch_size_per_gpu", 1)
    _add(o, f"{actor}.ppo_max_token_len_per_gpu", 4096)
    _add(o, f"{actor}.use_dynamic_bsz", dynamic)
    _add(o, f"{actor}.use_kl_loss", True)
    _add(o, f"{actor}.kl_loss_coef", 0.01)
    _add(o, f"{actor}.kl_loss_type", "low_var_kl")
    _add(o, f"{actor}.entropy_coeff", 0)
    _add(o, f"{actor}.data_loader_seed", settings.seed, setting="SEED")
    _add(o, f"{actor}.megatron.seed", settings.seed, setting="SEED")
    # Megatron-Bridge path on both targets: only there does checkpoint.strict reach
    # bridge.save_hf_weights (vanilla mbridge ignores it, and is deprecated in 0.9.1).
    _add(o, f"{actor}.megatron.use_mbridge", True)
    _add(o, f"{actor}.megatron.vanilla_mbridge", False)
    _add(o, f"{actor}.megatron.use_remove_padding", True)
    for section in (actor, ref):
        _add(o, f"{section}.megatron.tensor_model_parallel_size", layout.tp, setting="TP")
        _add(o, f"{section}.megatron.pipeline_model_parallel_size", layout.pp, setting="PP")
        _add(o, f"{section}.megatron.context_parallel_size", layout.cp, setting="CP")
        _add(o, f"{section}.megatron.expert_model_parallel_size", layout.ep, setting="EP")
        _add(o, f"{section}.megatron.expert_tensor_parallel_size", layout.etp, setting="ETP")
        _add(o, f"{section}.megatron.param_offload", settings.offload, setting="OFFLOAD")
    _add(o, f"{actor}.megatron.optimizer_offload", settings.offload, setting="OFFLOAD")
    _add(o, f"{actor}.megatron.dtype", "bfloat16")
    _add(o, f"{tcfg}.attention_backend", "auto", prefix="++")
    _add(o, f"{tcfg}.recompute_method", "uniform", prefix="+")
    _add(o, f"{tcfg}.recompute_granularity", "full", prefix="+")
    _add(o, f"{tcfg}.recompute_num_layers", 1, prefix="+")
    _add(o, f"{tcfg}.moe_aux_loss_coeff", 0.01, prefix="+")
    _add(o, f"{tcfg}.moe_z_loss_coeff", 0.001, prefix="+")
    _add(o, f"{tcfg}.moe_permute_fusion", True, prefix="+")
    _add(o, f"{tcfg}.moe_grouped_gemm", True, prefix="+")
    if npu:
        _add(o, f"{tcfg}.use_flash_attn", True, prefix="+")
        _add(o, f"{tcfg}.moe_token_dispatcher_type", "alltoall", prefix="+")
        _add(o, f"{tcfg}.use_naive_l2norm", True, prefix="+")
    _add(o, f"{ocfg}.optimizer_offload_fraction", 1, prefix="+")
    _add(o, f"{ocfg}.overlap_cpu_optimizer_d2h_h2d", True, prefix="+")
    _add(o, f"{ocfg}.use_precision_aware_optimizer", True, prefix="+")
    _add(o, f"{ocfg}.optimizer_cpu_offload", True, prefix="+")
    # Checkpoints: Hugging Face weights at every save, exported leniently unless EXPORT_STRICT.
    _add(o, f"{actor}.checkpoint.save_contents", ["model", "optimizer", "extra", "hf_model"])
    _add(o, f"{actor}.checkpoint.strict", settings.export_strict, setting="EXPORT_STRICT")

    # Rollout (vLLM, colocated, sleep mode)
    _add(o, f"{rollout}.name", "vllm")
    _add(o, f"{rollout}.tensor_model_parallel_size", layout.gen_tp, setting="GEN_TP")
    _add(o, f"{rollout}.gpu_memory_utilization", 0.65 if npu else 0.6)
    _add(o, f"{rollout}.n", settings.rollout_n, setting="ROLLOUT_N")
    _add(o, f"{rollout}.dtype", "bfloat16")
    _add(o, f"{rollout}.seed", settings.seed, setting="SEED")
    for section in (rollout, ref):
        _add(o, f"{section}.log_prob_micro_batch_size_per_gpu", 1)
        _add(o, f"{section}.log_prob_use_dynamic_bsz", dynamic)
        _add(o, f"{section}.log_prob_max_token_len_per_gpu", 4096)
    _add(o, f"{rollout}.calculate_log_probs", True)
    if npu:
        # Upstream's npu setting, kept. Not a fix of the cache desync after sleep (vllm#42995, verl#7067): that is
        # vLLM's, on both targets, and fixed in vLLM 0.22.0, which both images exceed (docs/troubleshooting.md).
        _add(o, f"{rollout}.engine_kwargs.vllm.mm_processor_cache_gb", 0, prefix="+")

    # Trainer
    loggers = ["console", "tensorboard"] + (["wandb"] if settings.wandb_api_key else [])
    if settings.profile == "smoke":
        loggers.append("file")  # one JSON line of metrics per step, at METRICS_VARIABLE: the smoke verdict reads it
    _add(o, "trainer.critic_warmup", 0)
    _add(o, "trainer.logger", loggers)
    # The trackers' project only: the checkpoint and TensorBoard folders are PROJECT_NAME's, set explicitly.
    _add(o, "trainer.project_name", tracker_project or settings.project_name, setting="PROJECT_NAME")
    _add(o, "trainer.experiment_name", settings.experiment_name, setting="EXPERIMENT_NAME")
    _add(o, "trainer.device", "npu" if npu else "cuda", setting="DEVICE")
    _add(o, "trainer.n_gpus_per_node", layout.ndevices_per_node, setting="NDEVICES_PER_NODE")
    _add(o, "trainer.nnodes", layout.nnodes, setting="NNODES")
    _add(o, "trainer.save_freq", settings.save_freq, setting="SAVE_FREQ")
    _add(o, "trainer.test_freq", settings.test_freq, setting="TEST_FREQ")
    _add(o, "trainer.val_before_train", False)
    _add(o, "trainer.total_epochs", settings.total_epochs, setting="TOTAL_EPOCHS")
    # Resume from the newest checkpoint after a crash or restart (compose/k8s restart policies rely on it).
    _add(o, "trainer.default_local_dir", str(checkpoint_root(settings)), setting="CHECKPOINT_DIR")
    _add(o, "trainer.resume_mode", "auto")

    # Ray: the device environment for every worker, and the allocator hook.
    # The allocator's variables and the device the worker hook acts on are the plan's decisions.
    decided_env = {
        "RECIPE_DEVICE": "DEVICE",
        RUNTIME_SWITCH_VARIABLE: ALLOCATOR_POLICY,
        **dict.fromkeys(ALLOC_CONF_VARIABLES, ALLOCATOR_POLICY),
        THRESHOLDS_VARIABLE: "HEALTH_THRESHOLDS",
    }
    for name, value in runtime_env.items():
        if value is not None:
            # Ray accepts only strings as env_vars values (hydra_value quotes them).
            _add(o, f"{_RAY_ENV}{name}", value, prefix="+", setting=decided_env.get(name))
    _add(o, "ray_kwargs.ray_init.runtime_env.worker_process_setup_hook", WORKER_SETUP_HOOK, prefix="+")
    if layout.nnodes > 1 or settings.ray_address:
        # recipe.cluster has started (or found) the Ray cluster; the trainer attaches to it.
        _add(o, "ray_kwargs.ray_init.address", "auto", prefix="+")

    _add(o, "model_engine", "megatron", setting="the recipe (Megatron engine only)")
    return o


def _override_key(text: str) -> str:
    key = text.split("=", 1)[0]
    return key.lstrip("~+")


def override_value(overrides: Sequence[str], key: str) -> str | None:
    """The value the last override of `key` gives it (Hydra quotes removed), or None."""
    for text in reversed(overrides):
        if "=" in text and _override_key(text) == key:
            return text.split("=", 1)[1].strip("'\"")
    return None


def planned_checkpoint_root(settings: Settings, overrides: Sequence[str]) -> Path:
    """Where the trainer saves: the plan's trainer.default_local_dir, else CHECKPOINT_DIR's root.

    The recipe writes that override from CHECKPOINT_DIR and refuses a user's (OVERRIDES or after `--`).
    """
    return Path(override_value(overrides, "trainer.default_local_dir") or checkpoint_root(settings))


def planned_training_file(settings: Settings, overrides: Sequence[str]) -> Path:
    """The training parquet the trainer reads: the plan's data.train_files, else TRAIN_FILES.

    The recipe writes that override from TRAIN_FILES and refuses a user's (OVERRIDES or after `--`).
    """
    return Path(override_value(overrides, "data.train_files") or settings.resolved_train_files)


def planned_step_total(settings: Settings, overrides: Sequence[str]) -> StepTotal | None:
    """The run's planned number of steps, the one count of `plan`, the progress lines and `run`'s finish check.

    `trainer.total_training_steps` when an override sets it, else the rows of the training file the
    trainer reads (planned_training_file) over the batch, times the epochs; None when neither tells.
    """
    return total_steps(override_value(overrides, "trainer.total_training_steps"),
                       planned_training_file(settings, overrides), settings.train_batch_size, settings.total_epochs)


def resume_mode_problem(value: Any) -> str | None:
    """Why a composed `trainer.resume_mode`, read unresolved, is not one the resume guard can vouch for (None when it is).

    Read unresolved, an interpolation is its `${...}` text, never a mode: refused as not written literally.
    """
    if value not in RESUME_MODES:
        return (
            f"trainer.resume_mode={value!r}: must be one of {', '.join(RESUME_MODES)}, written literally "
            "(verl 0.9.1 knows no other mode, and the resume guard checks what it reads before the run: "
            "an interpolation is resolved only later); use trainer.resume_mode=auto, "
            "trainer.resume_mode=disable, or trainer.resume_mode=resume_path trainer.resume_from_path=<global_step_N dir>"
        )
    return None


def trainer_argv(overrides: Sequence[str], python: str = sys.executable) -> list[str]:
    """The full trainer command line."""
    return [python, "-m", TRAINER_MODULE, *overrides]
