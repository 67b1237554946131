"""The trainer's command line: the recipe's own PROFILE=smoke plan, with an explicit CPU mapping.

The plan comes from `entrypoint.py plan --json` (the recipe's CLI, run in the e2e venv) with
the recipe's own settings and `--` overrides, exactly as a user would ask for it. Only the keys
in cpu_swaps, host_swaps and cpu_additions change, each for the reason it gives. When the
recipe's plan changes one of those keys (or starts setting an added one), `apply_cpu_mapping` refuses, so the
change shows up here instead of being overwritten silently; every other key runs as planned.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


ROOT = Path(__file__).resolve().parents[3]
PLATFORM_MODULE = "tests.e2e.cpu"
SITE = ROOT / "tests" / "e2e" / "cpu" / "site"

#: GRPO steps of the e2e run: one checkpoint to resume from, one step after it.
STEPS = 2
#: Overrides after `--`, as a user passes them to `entrypoint.py run` (checked by the recipe against verl).
RUN_OVERRIDES: tuple[str, ...] = (f"trainer.total_training_steps={STEPS}", "trainer.resume_mode=auto")

_TCFG = "actor_rollout_ref.actor.megatron.override_transformer_config"
_OCFG = "actor_rollout_ref.actor.optim.override_optimizer_config"


@dataclass(frozen=True)
class Swap:
    """A planned key whose value the CPU run changes: `planned` must be what the recipe plans."""

    planned: str
    cpu: str
    reason: str


@dataclass(frozen=True)
class Addition:
    """A key the recipe does not plan (must stay absent from its plan) that the CPU run adds."""

    override: str
    reason: str


def cpu_swaps() -> dict[str, Swap]:
    """Planned key -> its CPU value; values are written as the plan writes them (Hydra syntax)."""
    return {
        "trainer.device": Swap("'cuda'", "'cpu'", "no accelerator: verl moves batches to the CPU"),
        f"{_TCFG}.moe_permute_fusion": Swap("True", "False", "a Transformer Engine fused kernel"),
        f"{_TCFG}.moe_grouped_gemm": Swap("True", "False", "grouped GEMM needs Transformer Engine / CUTLASS"),
        f"{_OCFG}.use_precision_aware_optimizer": Swap(
            "True", "False", "needs Transformer Engine's FusedAdam (megatron/core/optimizer/__init__.py)"
        ),
        f"{_OCFG}.optimizer_cpu_offload": Swap(
            "True", "False", "HybridDeviceOptimizer moves optimizer state between CUDA and the host"
        ),
    }


def host_swaps() -> dict[str, Swap]:
    """Planned key -> its value on CI's host (2 cores, 24 GB, no accelerator): fewer helper processes.

    Each of these is a process that imports torch and verl (about 0.5 GB and 10-20 s of a core
    each on that host); together they would double the run's start-up and push it past CI's budget.
    """
    return {
        "actor_rollout_ref.rollout.agent.num_workers": Swap("2", "1", "one agent-loop actor is enough for 16 samples"),
        "reward.num_workers": Swap("2", "1", "one reward actor is enough for 16 samples"),
    }


def cpu_additions() -> dict[str, Addition]:
    """Keys the recipe leaves to verl's defaults, set for the CPU run."""
    rollout = "actor_rollout_ref.rollout"
    return {
        f"{rollout}.enable_sleep_mode": Addition(
            f"+{rollout}.enable_sleep_mode=False", "vLLM's sleep mode is CUDA's memory pool (cumem); none on CPU"
        ),
        f"{rollout}.free_cache_engine": Addition(
            f"{rollout}.free_cache_engine=False", "verl frees the KV cache through sleep mode, which is off"
        ),
        f"{rollout}.enforce_eager": Addition(f"{rollout}.enforce_eager=True", "no CUDA graphs on CPU"),
        f"{rollout}.max_num_seqs": Addition(
            f"{rollout}.max_num_seqs=1",
            "batch invariance: vLLM-CPU's numerics depend on which sequences share a batch, and which do depends on "
            "when each request arrives; one sequence at a time, a sample's tokens depend only on it and its seed "
            "(the resumed run's step 2 must equal the uninterrupted one's to the bit, test_resume.py)",
        ),
        f"{rollout}.enable_prefix_caching": Addition(
            f"{rollout}.enable_prefix_caching=False",
            "batch invariance: with the cache a prompt's shared prefix is read from KV computed in an earlier batch "
            "(the uninterrupted run's holds step 1's, the resumed run's nothing); without it, computed anew each time",
        ),
        f"{rollout}.engine_kwargs.vllm.limit_mm_per_prompt": Addition(
            f"+{rollout}.engine_kwargs.vllm.limit_mm_per_prompt='{{\"image\":1,\"video\":0}}'",
            "host budget: one image per prompt, as the smoke data have; no video, so vLLM-CPU reserves no memory "
            "and runs no dummy profiling pass for one",
        ),
        "ray_kwargs.ray_init.num_gpus": Addition(
            "+ray_kwargs.ray_init.num_gpus=1",
            "verl's ResourcePoolManager counts only GPU/NPU resources: the CPU platform advertises one GPU",
        ),
        "ray_kwargs.ray_init.num_cpus": Addition(
            "+ray_kwargs.ray_init.num_cpus=16",
            "verl's and TransferQueue's Ray actors each reserve CPUs: with the 2 real cores some never start "
            "and the run hangs without a message",
        ),
        "ray_kwargs.ray_init.include_dashboard": Addition(
            "+ray_kwargs.ray_init.include_dashboard=False",
            "host budget: Ray's dashboard is a dozen processes (about 1 GB) that nothing here reads",
        ),
        "transfer_queue.backend.SimpleStorage.num_data_storage_units": Addition(
            "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
            "host budget: verl starts 8 TransferQueue storage actors (one process each) by default; one node needs one",
        ),
        "data.dataloader_num_workers": Addition(
            "data.dataloader_num_workers=0",
            "host budget: verl's default 8 dataloader processes for 64 rows on 2 cores; the trainer loads them itself",
        ),
    }


def cpu_environment() -> dict[str, str]:
    """Environment of the trainer and (through Ray) every worker, besides the plan's own (each commented)."""
    return {
        # verl/__init__.py:49-52 imports these modules in every process: the CPU platform and patches.
        "VERL_USE_EXTERNAL_MODULES": PLATFORM_MODULE,
        # verl/plugin/platform/platform_manager.py:92 picks the platform by name.
        "VERL_PLATFORM": "cpu",
        # verl/workers/engine/base.py:405 looks the Megatron engine up by device; it is registered for cuda.
        "VERL_ENGINE_DEVICE": "cuda",
        # vLLM-CPU's KV cache in GiB (its default 4 GiB would not fit the budget beside the trainer).
        "VLLM_CPU_KVCACHE_SPACE": "1",
        # Every process (Ray workers too) imports tests.e2e.cpu and the recipe from this checkout: first on
        # sys.path, because verl 0.9.1's wheel ships a top-level `tests` package (and TransferQueue a `recipe/`).
        # tests/e2e/cpu/site: a sitecustomize that lets PyPI's torchvision import with the CPU torch, in every
        # process, also those that never import verl (vLLM's engine and model-inspection subprocesses).
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), str(SITE), os.environ.get("PYTHONPATH")])),
        # Ray 2.60 would create ~/.ray/auth_token on its first start; a loopback test cluster needs none.
        "RAY_AUTH_MODE": "disabled",
        "RAY_DEDUP_LOGS": "0",
        "HYDRA_FULL_ERROR": "1",
        # megatron-core's jit_fuser is torch.compile (megatron/core/jit.py:21): the Gated DeltaNet's three fused
        # functions (ssm/gated_delta_net/common.py:369-432) compile on their first call, about 30 s of a core in
        # each process that runs the model; eager runs the same operations.
        "TORCHDYNAMO_DISABLE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


def recipe_settings(checkpoint_dir: Path, save_freq: int = 1) -> dict[str, str]:
    """The recipe's settings (environment variables) for the e2e run: the smoke profile's model and data."""
    return {
        "PROFILE": "smoke",
        # The plan is the gpu plan: the CPU differences are the mapping above, nothing else.
        "DEVICE": "gpu",
        "CHECKPOINT_DIR": str(checkpoint_dir),
        "SAVE_FREQ": str(save_freq),
    }


def recipe_plan(settings: Mapping[str, str], overrides: Sequence[str] = RUN_OVERRIDES) -> dict[str, Any]:
    """`entrypoint.py plan --json -- <overrides>` with these settings: the recipe's resolved plan."""
    env = {**os.environ, **settings}
    result = subprocess.run(
        [sys.executable, str(ROOT / "entrypoint.py"), "plan", "--json", "--", *overrides],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"entrypoint.py plan exited {result.returncode}:\n{result.stderr}")
    plan: dict[str, Any] = json.loads(result.stdout)
    return plan


def plan_object(settings: Mapping[str, str], overrides: Sequence[str] = RUN_OVERRIDES) -> Any:
    """The same plan as recipe_plan's, built in this process (recipe.plan.Plan): what `run` hands its report and its
    bench data writer."""
    from recipe.plan import build_plan
    from recipe.settings import Settings

    settings_model = Settings.model_validate({name.lower(): value for name, value in settings.items()})
    return build_plan(settings_model, {**os.environ, **settings}, tuple(overrides))


def _split(override: str) -> tuple[str, str, str]:
    """(prefix, key, value) of one Hydra override."""
    key, _, value = override.partition("=")
    prefix = key[: len(key) - len(key.lstrip("+~"))]
    return prefix, key[len(prefix) :], value


class PlanChanged(Exception):
    """The recipe's plan no longer has what the CPU mapping was written against."""


#: The additions a trainer joining a running cluster leaves out: Ray refuses num_cpus and num_gpus when it connects
#: (each node's `ray start` declares them), and the head's own flags decide its dashboard.
RAY_INIT_ADDITIONS = "ray_kwargs.ray_init."


def apply_cpu_mapping(overrides: Sequence[str], host: bool = True, cluster: bool = False) -> list[str]:
    """The plan's overrides with the swaps (cpu_swaps, and host_swaps unless `host` is False: a plan of the full
    recipe, where the user's overrides set those keys) applied in place and cpu_additions appended (those of
    `ray_init` only where the trainer starts Ray itself: not with `cluster`, a trainer joining Ray nodes).

    Raises PlanChanged naming every key whose planned value is not the one the swap expects,
    every swapped key the plan lost, and every added key the plan now sets itself.
    """
    swaps = {**cpu_swaps(), **(host_swaps() if host else {})}
    additions = cpu_additions()
    problems: list[str] = []
    seen: set[str] = set()
    out: list[str] = []
    for override in overrides:
        prefix, key, value = _split(override)
        if key in additions:
            problems.append(f"{key}: the recipe now plans {value}; review the CPU addition ({additions[key].reason})")
        swap = swaps.get(key)
        if swap is None:
            out.append(override)
            continue
        seen.add(key)
        if value != swap.planned:
            problems.append(f"{key}: the recipe now plans {value}, the CPU swap expects {swap.planned} ({swap.reason})")
        out.append(f"{prefix}{key}={swap.cpu}")
    problems += [f"{key}: no longer in the recipe's plan; review the CPU swap" for key in swaps if key not in seen]
    if problems:
        raise PlanChanged("\n".join(problems))
    return out + [addition.override for key, addition in additions.items()
                  if not (cluster and key.startswith(RAY_INIT_ADDITIONS))]  # fmt: skip


def trainer_command(plan: Mapping[str, Any], host: bool = True) -> tuple[list[str], dict[str, str]]:
    """The argv and environment the harness runs: the plan's, with the CPU mapping (apply_cpu_mapping's `host`)."""
    argv = list(plan["argv"])
    overrides = list(plan["overrides"])
    if argv[-len(overrides) :] != overrides:
        raise PlanChanged("the plan's argv does not end with its overrides")
    command = argv[: -len(overrides)] + apply_cpu_mapping(overrides, host)
    env = dict(os.environ)
    for name, value in plan["env"].items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    env.update(cpu_environment())
    return command, env
