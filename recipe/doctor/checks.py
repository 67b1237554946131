"""Which checks `doctor` runs: in-process ones (user, volumes, labels, driver) and probe steps.

The plan of checks and the in-process checks it names stay side by side, so that every stable
check name below is defined in this one file; which distributions the imports category tries is
recipe.doctor.trainer_imports'.

Check names are stable (the image tests and `--only` use them):

    environment  user, writable:CHECKPOINT_DIR, writable:HF_HOME, writable:TMPDIR, shm, labels
    imports      import:<distribution>   (every distribution the trainer needs)
    framework    transformer_engine, triton_launcher (gpu); torch_npu (npu); allocator_switch
    device       driver, devices, memory, matmul:<cuda|npu>:<i>, expandable_segments, collective
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path

from recipe.device import DeviceDetection
from recipe.doctor import facts
from recipe.doctor.runner import CheckResult, Probe, Status, Step
from recipe.doctor.trainer_imports import import_targets, normalize

#: Default limit of one check, per category, in seconds (`doctor --timeout` sets them all).
DEFAULT_TIMEOUTS_S = {"imports": 180.0, "framework": 120.0, "device": 60.0}

#: Distributions whose import pulls in torch or a large framework: spread over the probes first.
HEAVY = frozenset({
    "verl", "vllm", "vllm-ascend", "megatron-bridge", "megatron-core", "torch", "torch-npu", "ray",
    "flash-linear-attention", "transformers", "datasets", "peft", "accelerate", "tensordict", "torchdata",
    "torchcodec", "wandb", "tensorboard", "megatron-energon",
})  # fmt: skip
#: /dev/shm below this is a warning: NCCL fails in Docker's default 64 MB.
MIN_SHM_BYTES = 1 << 30
#: Most probe processes importing at once, whatever the cores.
MAX_IMPORT_PROBES = 4

BACKEND = {"gpu": ("cuda", "nccl"), "npu": ("npu", "hccl")}


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def split_into_probes(chains: list[tuple[int, list[Step]]], count: int) -> list[list[Step]]:
    """Longest-first onto the least loaded bin: heavy imports spread, light ones fill in."""
    bins: list[tuple[int, list[Step]]] = [(0, []) for _ in range(max(1, count))]
    for weight, steps in sorted(chains, key=lambda chain: -chain[0]):
        index = min(range(len(bins)), key=lambda i: bins[i][0])
        load, held = bins[index]
        bins[index] = (load + weight, held + steps)
    return [steps for _, steps in bins if steps]


@dataclass
class Plan:
    """Everything `doctor` will check: in-process checks and probes."""

    local: list[tuple[str, str, Callable[[], tuple[Status, str]]]] = field(default_factory=list)
    probes: list[Probe] = field(default_factory=list)
    #: Checks decided without running anything (a distribution not installed).
    decided: list[CheckResult] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def names(self) -> list[str]:
        return (
            [name for name, _, _ in self.local]
            + [r.name for r in self.decided]
            + [s.name for p in self.probes for s in p.steps]
        )

    def select(self, keep: Callable[[str], bool]) -> None:
        self.local = [check for check in self.local if keep(check[0])]
        self.decided = [result for result in self.decided if keep(result.name)]
        self.missing = [m for m in self.missing if keep(f"import:{m}")]
        for probe in self.probes:
            probe.steps = [step for step in probe.steps if keep(step.name)]
        self.probes = [probe for probe in self.probes if probe.steps]


# --- in-process checks ----------------------------------------------------------------------


def check_user(in_image: bool) -> tuple[Status, str]:
    uid = os.getuid()
    if uid != 0:
        who = facts.user_facts()["name"] or "no passwd entry"
        return "ok", f"uid {uid} ({who}), not root"
    if in_image:
        return "fail", "running as root (uid 0): the image's user is recipe (uid 1000); do not override --user"
    return "warn", "running as root (uid 0); the images run as uid 1000"


def check_writable(variable: str, path: Path) -> tuple[Status, str]:
    """A file can really be created where `run` writes (a read-only or root-owned mount says no)."""
    existing = next((p for p in [path, *path.parents] if p.exists()), None)
    uid = os.getuid()
    if existing is None or not existing.is_dir():
        return "fail", f"{variable}={str(path)!r}: {existing} is not a directory"
    where = "" if existing == path else f" (missing; its parent {existing} is where run creates it)"
    try:
        handle, name = tempfile.mkstemp(prefix=".doctor-", dir=existing)
        os.close(handle)
        os.unlink(name)
    except OSError as error:
        return "fail", f"{variable}={str(path)!r}{where}: not writable by uid {uid} ({error.strerror})"
    free = shutil.disk_usage(existing).free / (1 << 30)
    return "ok", f"{variable}={str(path)!r}{where}: writable by uid {uid}, {free:.1f} GiB free"


def check_shm(path: Path = Path("/dev/shm")) -> tuple[Status, str]:
    try:
        usage = shutil.disk_usage(path)
    except OSError as error:
        return "warn", f"{path}: {error.strerror}; NCCL/HCCL and Ray's object store use it"
    size = usage.total / (1 << 30)
    if usage.total < MIN_SHM_BYTES:
        return "warn", (
            f"{path} is {usage.total >> 20} MiB: NCCL fails in Docker's default 64 MB and Ray's object store "
            "lives there (compose: shm_size; Kubernetes: a memory emptyDir)"
        )
    return "ok", f"{path} is {size:.1f} GiB ({usage.free / (1 << 30):.1f} GiB free)"


def same_release(installed: str, labelled: str) -> bool:
    """2.11.0+cu130 matches 2.11.0; vllm 0.23.0+empty matches 0.23.0."""
    try:
        # lazy: only for images that name a CUDA toolkit (packaging comes with the framework)
        from packaging.version import Version

        return Version(installed).public == Version(labelled).public
    except Exception:  # noqa: BLE001 - packaging missing or an unparsable version
        return installed.split("+", 1)[0] == labelled.split("+", 1)[0]


def check_labels(
    labels: dict[str, str] | None, info_dir: Path, device: str, environ: Mapping[str, str]
) -> tuple[Status, str]:
    """Every version label the image carries matches what is installed; the device label, DEVICE."""
    if labels is None:
        return "warn", f"not in an image ({info_dir}/labels.d is missing): no labels to compare"
    matched, problems = [], []
    for key, value in sorted(labels.items()):
        found = re.fullmatch(r"io\.grpo-recipe\.([\w.-]+)\.version", key)
        if key == "io.grpo-recipe.device" and value != device:
            problems.append(f"this image is built for {value}, DEVICE resolves to {device}")
        if key == "org.opencontainers.image.version":
            name, installed = "grpo-recipe", facts.distribution_version("grpo-recipe")
        elif found:
            name = found.group(1)
            if name == "cuda":
                installed = facts.torch_cuda_version()
            elif name == "cann":
                # As tests/images checks it: the label appears in the toolkit's version files.
                texts = facts.cann_version_files(environ)
                installed, _ = facts.cann_version_text(environ)
                if any(value in text for _, text in texts):
                    installed = value
            else:
                installed = facts.distribution_version(name)
        else:
            continue
        if installed is None:
            problems.append(f"{name} {value} labelled, not installed (or not found)")
        elif not same_release(installed, value) and not installed.startswith(value + "."):
            problems.append(f"{name} {installed} installed, {value} labelled")
        else:
            matched.append(name)
    if problems:
        return "fail", "; ".join(problems)
    framework = labels.get("io.grpo-recipe.framework", "?")
    return "ok", f"framework {framework}; {len(matched)} labelled version(s) match: {', '.join(sorted(matched)) or 'none'}"


def check_driver(device: str, driver: facts.DriverFacts) -> tuple[Status, str]:
    """The driver answers (its tools do not hang or fail) and is new enough for torch's CUDA."""
    found = driver.facts
    if driver.problem is not None:
        return "fail", driver.problem
    if device == "gpu":
        version = found.get("driver_version") or found.get("kernel_module")
        if version is None:
            return "warn", "no NVIDIA driver visible (no /proc/driver/nvidia/version, no nvidia-smi)"
        reason = f"NVIDIA driver {version}"
        supports, built = found.get("cuda_driver_version"), facts.torch_cuda_version()
        if supports:
            reason += f", supports CUDA {supports}"
        if supports and built and int(supports.split(".")[0]) < int(built.split(".")[0]):
            return "fail", f"{reason}; torch is built for CUDA {built}: the host needs a newer driver"
        gpus = found.get("gpus") or []
        if gpus:
            reason += f"; {len(gpus)} x {gpus[0]['name']}"
        return "ok", reason
    version = found.get("driver_version") or found.get("npu_smi_version")
    if version is None:
        return "warn", f"no Ascend driver visible ({facts.ASCEND_DRIVER_VERSION} missing, no npu-smi)"
    cann = found.get("cann_version")
    return "ok", f"Ascend driver {version}" + (f", CANN {cann}" if cann else ", CANN version not found")


# --- the plan ------------------------------------------------------------------------------


def build_plan(
    device: str,
    detection: DeviceDetection,
    *,
    checkpoint_dir: Path,
    expandable_segments: bool,
    labels: dict[str, str] | None,
    info_dir: Path,
    driver: Callable[[], facts.DriverFacts],
    environ: Mapping[str, str],
    timeout_s: float | None,
    assumed_memory: tuple[float, str] | None = None,
    devices_required: bool = True,
) -> Plan:
    """Every check for this device and machine; probes split over the usable cores.

    `assumed_memory` is the device memory plan's estimate assumes (GiB, where the figure comes from).
    `devices_required`: no visible device fails the node (doctor's default); False (`--no-devices`, a machine
    without accelerators by design: CI, a build host) makes it a warning.
    """
    plan = Plan()
    limit = {k: timeout_s or v for k, v in DEFAULT_TIMEOUTS_S.items()}
    in_image = labels is not None
    hf_home = Path(environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    plan.local += [
        ("user", "environment", lambda: check_user(in_image)),
        ("writable:CHECKPOINT_DIR", "environment", lambda: check_writable("CHECKPOINT_DIR", checkpoint_dir)),
        ("writable:HF_HOME", "environment", lambda: check_writable("HF_HOME", hf_home)),
        ("writable:TMPDIR", "environment", lambda: check_writable("TMPDIR", Path(tempfile.gettempdir()))),
        ("shm", "environment", check_shm),
        ("labels", "environment", lambda: check_labels(labels, info_dir, device, environ)),
    ]
    if detection.visible_devices or device == "gpu" and facts.NVIDIA_PROC_VERSION.exists() or (
        device == "npu" and facts.ASCEND_DRIVER_VERSION.exists()
    ):
        plan.local.append(("driver", "device", lambda: check_driver(device, driver())))

    env = dict(environ)
    if device == "npu":
        # With torch_npu installed, `import torch` loads it (and CANN) unless this is 0: the imports
        # are checked on their own; torch_npu loading is the torch_npu check.
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"

    targets, plan.notes = import_targets(device)
    chains: list[tuple[int, list[Step]]] = []
    te_chain: list[Step] | None = None
    for target in targets:
        if target.version is None and not any(_spec_exists(m) for m in target.modules):
            plan.missing.append(target.distribution)
            plan.decided.append(
                CheckResult(target.name, "imports", "fail", f"not installed ({target.why})", 0.0, None)
            )
            continue
        what = f"{target.distribution} {target.version or '(no metadata)'}"
        step = Step(target.name, "import", "imports", limit["imports"], {"modules": target.modules, "what": what})
        chain = [step]
        if device == "gpu" and normalize(target.distribution) == "megatron-bridge":
            te_chain = chain
        key = normalize(target.distribution)
        # torch first in its process: its own import time is reported there, not hidden in another's.
        chains.append((4 if key == "torch" else 3 if key in HEAVY else 1, chain))

    framework: list[Step] = []
    if device == "gpu":
        te = Step("transformer_engine", "transformer_engine", "framework", limit["framework"])
        if te_chain is not None:
            te_chain.append(te)  # Megatron is imported there already
        else:
            chains.append((3, [te]))
        framework.append(Step("triton_launcher", "triton_launcher", "framework", limit["framework"]))
    else:
        framework.append(Step("torch_npu", "torch_npu", "framework", limit["framework"]))
    framework.append(
        Step(
            "allocator_switch", "allocator_switch", "framework", limit["framework"],
            {"device": device, "required": expandable_segments},
        )
    )
    chains += [(2, [step]) for step in framework]
    count = min(MAX_IMPORT_PROBES, _usable_cores())
    for index, steps in enumerate(split_into_probes(chains, count)):
        plan.probes.append(Probe(f"imports-{index}", steps, env, on_hang="continue"))

    if detection.visible_devices:
        device_type, backend = BACKEND[device]
        device_env = dict(environ)
        args = {"device_type": device_type}
        steps = [
            Step("devices", "devices", "device", limit["device"], {**args, "nodes": detection.visible_devices}),
            Step("memory", "memory", "device", limit["device"],
                 {**args, **({"assumed_gib": assumed_memory[0], "assumed_source": assumed_memory[1]} if assumed_memory else {})}),
            Step("matmul", "matmul", "device", limit["device"], args),
            Step("expandable_segments", "expandable_segments", "device", limit["device"], args),
            Step("collective", "collective", "device", limit["device"], {**args, "backend": backend}),
        ]
        # After a device hung, every later device step would hang for its whole timeout too.
        plan.probes.append(Probe("device", steps, device_env, on_hang="stop"))
    else:
        reason = (
            f"no {device} device visible ({detection.reason}): "
            "device, memory, matmul, expandable-segments and collective checks not run"
        )
        # A node that lost its device mounts must not pass the check meant to catch it.
        status = "fail" if devices_required else "warn"
        reason += ("; on a machine without accelerators by design (CI, a build host): doctor --no-devices"
                   if devices_required else " (--no-devices)")  # fmt: skip
        plan.local.append(("devices", "device", lambda: (status, reason)))
    return plan


def _spec_exists(module: str) -> bool:
    try:
        return find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def run_local(name: str, category: str, check: Callable[[], tuple[Status, str]]) -> CheckResult:
    began = time.perf_counter()
    try:
        status, reason = check()
    except Exception as error:  # noqa: BLE001 - a check that breaks is that check's failure
        status, reason = "fail", f"{type(error).__name__}: {error}"
    return CheckResult(name, category, status, reason, time.perf_counter() - began)
