#!/usr/bin/env python3
"""Trainer rehearsal: verl's real trainer, launched as PROFILE=smoke launches it, on a machine without devices.

What it does, in order:

1. Builds the smoke assets (tiny Qwen3.5-MoE VLM, tokenizer, data) offline in a temp dir
   with the recipe's own `recipe.smoke.prepare_smoke_assets`.
2. Asks the recipe's own `plan --json` (PROFILE=smoke, DEVICE=gpu, CHECKPOINT_DIR in the temp
   dir; every other recipe variable of the caller removed) for the trainer's argv and
   environment. Nothing here writes a Hydra override: the argv is the plan's, unchanged.
3. Starts a Ray head of its own with the recipe's `recipe.cluster.ray_node.start_head`, on a loopback
   address, every port chosen free (no fixed dashboard, agent or client port), token auth
   off, and one GPU *declared* (`--num-gpus`, no GPU needed), so that verl's resource-pool
   check passes. The trainer joins it through RAY_ADDRESS, as it joins the recipe's own
   head when NNODES > 1.
4. Runs the plan's trainer argv (`python -m recipe.trainer_main <overrides>`, verl's main_ppo) with a timeout.
5. Prints one JSON document (`Result`): the stages reached, each found by a line that
   verl 0.9.1 (or TransferQueue, which it starts) prints, see STAGES; the exit code; and
   the failure that stopped the run, named, with the verl function it was raised in.

Without an accelerator the run cannot train. The point is how far it gets: through every
stage that needs no device, stopping at the first device use (`Result.stopped_at_device`).

Only the standard library, the recipe and what the trainer itself needs (verl, Ray) are
used, so it runs from a checkout's venv and inside the images, where the recipe is installed:

    python tests/rehearsal.py [--keep] [--timeout S]
    docker run --rm -i --entrypoint python3 IMAGE - < tests/rehearsal.py

Exit code: 0 when the run stopped at the first device use after every stage before it;
1 otherwise (the JSON says why); 2 when it could not be set up (assets, plan or Ray head).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

#: The plan rehearsed: the smoke profile on the gpu target (the one the gpu image runs).
PLAN_SETTINGS: Mapping[str, str] = {"PROFILE": "smoke", "DEVICE": "gpu"}

#: Ray's address: loopback, but not 127.0.0.1, which Ray replaces by the machine's own
#: address (ray/_private/services.py:resolve_ip_for_localhost). All of 127/8 is loopback on Linux.
RAY_HOST = "127.0.0.4"

#: Logical CPUs the Ray head declares, for Ray's scheduling only (a real node declares its
#: cores). TransferQueue alone holds 9: its controller and verl's default 8 storage units ask
#: for num_cpus=1 each, and tq.init waits forever, silently, for a unit Ray cannot place.
RAY_CPUS = 32

#: Seconds the trainer may run. It stops in about 2 minutes on 2 busy cores.
DEFAULT_TIMEOUT_S = 600.0

#: Environment of the Ray head and the trainer, on top of the plan's.
REHEARSAL_ENV: Mapping[str, str] = {
    # Ray 2.60 would otherwise create ~/.ray/auth_token (token auth), shared with other Ray users.
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    # Ray starts its workers at nice 15: on a busy machine each one importing torch waits minutes.
    "RAY_worker_niceness": "0",
    # Every actor's lines as they are: Ray's dedup folds identical lines of several actors.
    "RAY_DEDUP_LOGS": "0",
    # Stage markers are INFO lines: verl's loggers take their level from here...
    "VERL_LOGGING_LEVEL": "INFO",
    # ...and TransferQueue's default to WARNING (transfer_queue/utils/logging_utils.py:get_logger).
    "TQ_LOGGING_LEVEL": "INFO",
    # The whole traceback (the failure is named from it), not Hydra's one-line summary.
    "HYDRA_FULL_ERROR": "1",
    "PYTHONUNBUFFERED": "1",
    # Nothing is downloaded: the smoke assets are local.
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
}


@dataclass(frozen=True)
class Stage:
    """A step of the trainer's start-up, recognised by a line it prints."""

    name: str
    #: Searched in the trainer's output: the driver's own lines and the lines Ray forwards
    #: from its actors (`(TaskRunnerV1 pid=N) ...`), colour codes removed.
    pattern: str
    #: Where the line is printed, checked against verl 0.9.1 / TransferQueue 0.1.11.
    source: str
    #: True for the stages verl reaches before its first device use.
    before_device: bool = True


#: In the order verl 0.9.1 reaches them on its default path (trainer.use_v1=true):
#: verl/trainer/main_ppo.py main -> run_ppo -> TaskRunnerV1.run -> PPOTrainer.init -> _setup
#: (verl/trainer/ppo/v1/trainer_base.py).
STAGES: tuple[Stage, ...] = (
    Stage(
        "config",
        # Hydra composed the plan's overrides onto ppo_trainer and verl's own checks passed.
        r"\[validate_config\] All configuration checks passed successfully!",
        "verl/utils/config.py:validate_config (print), called by verl/trainer/main_ppo.py:main",
    ),
    Stage(
        "ray",
        # Printed right before ray.init joins the cluster; the TaskRunner actor runs next.
        r"ray init kwargs: \{",
        "verl/trainer/main_ppo.py:run_ppo (print)",
    ),
    Stage(
        "transfer_queue",
        # Logged once the controller and every storage unit are up and the config is stored.
        r"TransferQueue config: \{",
        "transfer_queue/interface.py:init (logger.info), called by verl/trainer/main_ppo.py:TaskRunnerV1.run",
    ),
    Stage(
        "dataset",
        # After _init_tokenizer (tokenizer and processor from the model dir) and both RLHFDatasets.
        r"train and validate dataloader initialized, train dataset size: [1-9]\d*, val dataset size: [1-9]\d*",
        "verl/trainer/ppo/v1/trainer_base.py:PPOTrainer._init_dataloader (logger.info)",
    ),
    Stage(
        "resource_pool",
        # Logged after ResourcePoolManager.create_resource_pool(), whose _check_resource_available
        # raises "Total available GPUs 0 is less than total desired GPUs N" without declared GPUs.
        r"worker group kwargs: \{",
        "verl/trainer/ppo/v1/trainer_base.py:PPOTrainer._setup (logger.info)",
    ),
    Stage(
        "worker_group",
        # The colocated actor/rollout/ref WorkerDict actors exist (RayWorkerGroup + spawn).
        r"create worker group dict_keys\(\[",
        "verl/trainer/ppo/v1/trainer_base.py:PPOTrainer._setup (logger.info)",
    ),
    # Past this point every stage needs the device: the next call, actor_rollout_wg.init_model(),
    # builds the ref and actor TrainingWorkers, whose first act is the device's process group
    # (verl/utils/distributed.py:initialize_global_process_group_ray, backend cpu:gloo,cuda:nccl).
    Stage(
        "model_init",
        r"actor and ref model engine initialized",
        "verl/trainer/ppo/v1/trainer_base.py:PPOTrainer._setup (logger.info)",
        before_device=False,
    ),
    # The reward set-up comes after the model's in verl 0.9.1's V1 trainer (RewardLoopManager,
    # step 7 of _setup, after init_model in step 6), so no run without a device reaches it.
    Stage(
        "reward",
        r"reward loop manager initialized",
        "verl/trainer/ppo/v1/trainer_base.py:PPOTrainer._setup (logger.info)",
        before_device=False,
    ),
)

#: verl carries on without the processor when it cannot build it (a text-only run): reported.
#: Its warning, from verl/utils/tokenizer/tokenizer.py:hf_processor.
PROCESSOR_FAILED = re.compile(r"Failed to create processor: (?P<reason>.*)")

#: How "no device" shows up at the first device use, by the torch in use.
DEVICE_FAILURES: Mapping[str, str] = {
    # CPU torch (the test venv): the worker's process group for device "cuda" asks for NCCL.
    "torch without NCCL (CPU build)": r"Distributed package doesn't have NCCL built in",
    # CUDA torch, no GPU (the gpu image here): the same process group, whose NCCL backend's
    # constructor checks the device count (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp).
    "no GPU for NCCL": r"ProcessGroupNCCL is only supported with GPUs, no GPUs found",
    # CPU torch, any CUDA call: torch/cuda/__init__.py:_lazy_init.
    "torch without CUDA (CPU build)": r"Torch not compiled with CUDA enabled",
    # CUDA torch in a container without the NVIDIA driver: torch/cuda/__init__.py:_lazy_init.
    "no NVIDIA driver": r"Found no NVIDIA driver on your system",
    # CUDA torch, driver present, no device visible.
    "no CUDA device": r"No CUDA GPUs are available|no CUDA-capable device is detected|CUDA driver initialization failed",
}

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: `(TaskRunnerV1 pid=123) ` or `(WorkerDict pid=4, ip=...) `: how Ray prefixes an actor's line.
_RAY_PREFIX = r"(?:\([^()]*pid=\d+[^()]*\)\s*)?"
_EXCEPTION_LINE = re.compile(
    _RAY_PREFIX + r"(?P<type>(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt))"
    r"(?:\((?P<cause>\w+)\))?(?::\s*(?P<message>.*))?$"
)
_VERL_FRAME = re.compile(r'File "[^"]*/(?P<file>verl/[^"]+\.py)", line \d+, in (?P<func>\w+)')


@dataclass(frozen=True)
class Failure:
    """The exception that ended the run, as its traceback names it."""

    #: Exception type as printed (`ModuleNotFoundError`, `RuntimeError`, ...).
    type: str
    message: str
    #: The line it was read from.
    line: str
    #: The innermost verl frame of its traceback (`verl/utils/distributed.py:initialize_...`), if any.
    raised_in: str | None
    #: The DEVICE_FAILURES entry it matches; None when it is not a device failure.
    device_use: str | None


@dataclass
class Result:
    """What `rehearse` finds; `main` prints it as JSON."""

    #: Stages verl reaches before its first device use, in order.
    expected: list[str]
    reached: list[str]
    #: Expected stages not reached.
    missing: list[str]
    exit_code: int | None
    timed_out: bool
    failure: Failure | None
    #: Why verl built no processor (it goes on text-only), from its warning; None when it built one.
    processor_error: str | None
    #: Every expected stage reached, none past it, and the run ended by a device failure.
    stopped_at_device: bool
    seconds: dict[str, float] = field(default_factory=dict)
    log: str | None = None
    setup_error: str | None = None

    def to_json(self) -> str:
        """The document `main` prints."""
        return json.dumps(asdict(self), indent=2)


def strip_colours(lines: Sequence[str]) -> list[str]:
    """Ray colours its actor prefixes; the markers are matched on plain text."""
    return [_ANSI.sub("", line) for line in lines]


def stages_reached(lines: Sequence[str], stages: Sequence[Stage] = STAGES) -> list[str]:
    """Names of the stages whose marker appears in the output, in STAGES order."""
    text = "\n".join(lines)
    return [stage.name for stage in stages if re.search(stage.pattern, text)]


def processor_error(lines: Sequence[str]) -> str | None:
    """The reason of verl's first "Failed to create processor" warning, or None."""
    for index, line in enumerate(lines):
        match = PROCESSOR_FAILED.search(line)
        if match:
            reason = match["reason"].strip()
            if not reason and index + 1 < len(lines):
                # transformers' messages about missing backends start on a line of their own.
                reason = re.sub("^" + _RAY_PREFIX, "", lines[index + 1].strip()).strip()
            # Its first sentence: transformers goes on with installation advice.
            return reason.split(". ")[0].rstrip(".") + "." if reason else "(no reason given)"
    return None


def _raised_in(lines: Sequence[str], at: int) -> str | None:
    """The innermost verl frame of the traceback that ends at line `at`."""
    for line in reversed(lines[:at]):
        frame = _VERL_FRAME.search(line)
        if frame:
            return f"{frame['file']}:{frame['func']}"
        if line.lstrip().startswith("Traceback (most recent call last)"):
            break
    return None


def find_failure(lines: Sequence[str]) -> Failure | None:
    """The failure that ended the run: the first device failure printed, else the last exception line.

    Ray re-raises an actor's exception in each actor it passes through
    (`ray.exceptions.RayTaskError(RuntimeError): ...`), and a traceback ends with its root
    cause: a device failure anywhere is the stop; otherwise the last exception line is.
    """
    last: tuple[int, re.Match[str]] | None = None
    for index, line in enumerate(lines):
        match = _EXCEPTION_LINE.match(line.strip())
        if not match:
            continue
        for name, pattern in DEVICE_FAILURES.items():
            if re.search(pattern, line):
                return Failure(
                    match["type"], (match["message"] or "").strip(), line.strip(), _raised_in(lines, index), name
                )
        last = (index, match)
    if last is None:
        return None
    index, match = last
    return Failure(
        match["type"], (match["message"] or "").strip(), lines[index].strip(), _raised_in(lines, index), None
    )


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def clean_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The caller's environment without any recipe setting or Ray address (they would change the run)."""
    from recipe.settings import Settings

    names = {name.upper() for name in Settings.model_fields} | {
        "PYTORCH_CUDA_ALLOC_CONF",
        "PYTORCH_NPU_ALLOC_CONF",
        "RAY_ADDRESS",
    }
    return {key: value for key, value in environ.items() if key.upper() not in names}


def with_recipe_on_path(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` with the checkout of the imported `recipe` package, if it is one, first on PYTHONPATH.

    From a checkout, the plan's process and Ray's workers (which import recipe.worker_setup,
    the plan's worker_process_setup_hook) find this recipe only through it: TransferQueue
    0.1.11's wheel installs a top-level `recipe/` directory of its own into site-packages,
    which hides an editable install. Installed (the images), nothing changes: site-packages
    must not go ahead of the standard library.
    """
    import recipe

    root = Path(recipe.__file__).resolve().parent.parent
    env = dict(environ)
    if (root / "pyproject.toml").is_file():
        paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(root)]
        env["PYTHONPATH"] = os.pathsep.join([str(root), *paths])
    return env


def smoke_plan(checkpoint_dir: Path, environ: Mapping[str, str]) -> dict[str, Any]:
    """The recipe's `plan --json` for PLAN_SETTINGS with this CHECKPOINT_DIR.

    Run as the CLI runs it, in a process of its own: only the given environment counts.
    """
    env = with_recipe_on_path({**environ, **PLAN_SETTINGS, "CHECKPOINT_DIR": str(checkpoint_dir)})
    code = "import sys; from recipe.cli import main; sys.exit(main(['plan', '--json']))"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"plan --json exited {done.returncode}: {done.stderr.strip()}")
    plan: dict[str, Any] = json.loads(done.stdout)
    return plan


def trainer_environment(base: Mapping[str, str], plan_env: Mapping[str, str | None]) -> dict[str, str]:
    """As recipe.cli runs the trainer (the plan's changes to the environment), plus REHEARSAL_ENV."""
    env = dict(base)
    for name, value in plan_env.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    env.update(REHEARSAL_ENV)
    return with_recipe_on_path(env)


def _stop_group(process: subprocess.Popen[bytes], grace_s: float = 15.0) -> None:
    """End a process started in a session of its own, then whatever is left of its group, by its pid."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(grace_s)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def _run_trainer(
    argv: Sequence[str], env: Mapping[str, str], cwd: Path, log_path: Path, timeout_s: float
) -> tuple[int, bool]:
    """The trainer's exit code (-N: killed by signal N) and whether it ran out of time."""
    with open(log_path, "wb") as log:
        trainer = subprocess.Popen(
            list(argv), env=dict(env), cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        timed_out = False
        try:
            trainer.wait(timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _stop_group(trainer)
    return trainer.returncode, timed_out


def rehearse(
    workdir: Path,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    environ: Mapping[str, str] | None = None,
    checkpoint_dir: Path | None = None,
) -> Result:
    """Run the rehearsal in `workdir` (keep its path short: Ray's socket paths must stay under 107 bytes).

    `environ` (default: this process's) is the trainer's environment before the plan's and
    REHEARSAL_ENV's changes; recipe settings in it are dropped. `checkpoint_dir` (default
    `workdir/ck`) is the plan's CHECKPOINT_DIR, where the smoke assets are built or reused.
    """
    from recipe.cluster import ray_node, readiness
    from recipe.smoke import assets_root, prepare_smoke_assets

    expected = [stage.name for stage in STAGES if stage.before_device]
    seconds: dict[str, float] = {}
    started = time.monotonic()

    def setup_failed(error: str) -> Result:
        return Result(expected, [], expected, None, False, None, None, False, seconds, None, error)

    try:
        workdir.mkdir(parents=True, exist_ok=True)
        base = clean_environment(os.environ if environ is None else environ)
        checkpoint_dir = checkpoint_dir or workdir / "ck"
        prepare_smoke_assets(assets_root(checkpoint_dir))
        seconds["assets"] = round(time.monotonic() - started, 1)
        plan = smoke_plan(checkpoint_dir, base)
    except Exception as error:  # noqa: BLE001 - reported in the JSON, with its type
        return setup_failed(f"{type(error).__name__}: {error}")

    # verl's RLHFDataset goes through `datasets`, which caches the parquet: kept in the work dir.
    env = {**trainer_environment(base, plan["env"]), "HF_DATASETS_CACHE": str(workdir / "hf-datasets")}
    port = _free_port(RAY_HOST)
    options = ray_node.NodeOptions(
        num_cpus=RAY_CPUS,
        num_gpus=int(plan["layout"]["ndevices_per_node"]),
        node_ip_address=RAY_HOST,
        temp_dir=str(workdir / "ray"),
        object_store_memory=256 * 1024 * 1024,
        extra_args=(
            "--include-dashboard=false",
            f"--dashboard-port={_free_port(RAY_HOST)}",
            f"--dashboard-agent-listen-port={_free_port(RAY_HOST)}",
            f"--ray-client-server-port={_free_port(RAY_HOST)}",
            f"--metrics-export-port={_free_port(RAY_HOST)}",
        ),
    )
    address = f"{RAY_HOST}:{port}"
    head_log = workdir / "ray-head.log"
    log_path = workdir / "trainer.log"
    ray_started = time.monotonic()
    with ray_node.start_head(port, options=options, env=env, log_path=str(head_log)) as head:
        while not readiness.head_reachable(address, timeout_s=1.0):
            if head.poll() is not None or time.monotonic() - ray_started > 120:
                return setup_failed(f"ray start --head did not come up (exit code {head.poll()}; see {head_log})")
            time.sleep(0.5)
        seconds["ray_head"] = round(time.monotonic() - ray_started, 1)
        trainer_started = time.monotonic()
        exit_code, timed_out = _run_trainer(plan["argv"], {**env, "RAY_ADDRESS": address}, workdir, log_path, timeout_s)
        seconds["trainer"] = round(time.monotonic() - trainer_started, 1)
    seconds["total"] = round(time.monotonic() - started, 1)

    lines = strip_colours(log_path.read_text(encoding="utf-8", errors="replace").splitlines())
    reached = stages_reached(lines)
    failure = find_failure(lines)
    missing = [name for name in expected if name not in reached]
    past_device = [name for name in reached if name not in expected]
    stopped_at_device = (
        not missing and not past_device and not timed_out and failure is not None and failure.device_use is not None
    )
    return Result(
        expected,
        reached,
        missing,
        exit_code,
        timed_out,
        failure,
        processor_error(lines),
        stopped_at_device,
        seconds,
        str(log_path),
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the rehearsal and print its JSON document; see the module's docstring for exit codes."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds the trainer may run")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (assets, trainer and Ray logs)")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="rehearsal-", dir="/tmp"))
    try:
        result = rehearse(workdir, timeout_s=args.timeout)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    if not args.keep:
        result.log = None
    print(result.to_json(), flush=True)
    if result.setup_error:
        return 2
    return 0 if result.stopped_at_device else 1


if __name__ == "__main__":
    # From a checkout (`python tests/rehearsal.py`) the rehearsal is of that checkout's recipe,
    # not of whatever `recipe` the import system finds first (see with_recipe_on_path).
    _checkout = Path(__file__).resolve().parents[1] if Path(__file__).is_file() else None
    if _checkout is not None and (_checkout / "recipe" / "__init__.py").is_file():
        sys.path.insert(0, str(_checkout))
    sys.exit(main())
