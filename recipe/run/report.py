"""The end-of-run report: where each step's time went, tokens per second per device, MFU, and memory against the plan.

Built from verl's own step metrics (recipe.run.verl_metrics), read back from the event files
after the trainer ended, whatever its end: finished, failed or stopped. `run` writes it as
run-report.json beside the checkpoints and prints it as a short table (docs/performance.md
explains how to read it). Pure: the numbers in, the report out; nothing here reads a file.

The FLOP count (flops_per_token) is the usual 2 x active weights per token for a forward pass
(Kaplan et al. 2020; PaLM's MFU, Chowdhery et al. 2022), over the passes a GRPO step makes:
the rollout's (1), the old and reference log-probs' (1 each, when the step ran them) and the
actor update's forward and backward (3). Not counted, so the MFU is a lower bound: the
quadratic attention term of the full-attention layers (one in four in Qwen3.5), Gated
DeltaNet's state update (linear in tokens, like a small matmul), recomputed layers, and the
vision tower (it runs on image patches, not tokens).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from recipe.memory_fit import GIB, MemoryEstimate
from recipe.run import verl_metrics as names
from recipe.run.health import MISMATCH_ABS, MISMATCH_KL, Sign, Thresholds, signs_of

#: What the report says of a run, by the trainer's exit status.
STOPPED_CODES = {130: "stopped (SIGINT)", 143: "stopped (SIGTERM)"}
#: A measured peak this far above the estimate (10 %) is reported, with the term that most likely grew.
OVER_ESTIMATE = 1.10
#: The gpu default peak: an H100 SXM's dense bf16 (NVIDIA H100 datasheet: 1,979 TFLOP/s with sparsity, half dense).
GPU_PEAK_TFLOPS = 989.0
#: Passes over each token in one GRPO step, each 2 x active weights FLOPs a token (the module docstring).
PASSES = {names.PHASES["generation"]: 1, names.PHASES["log-probs (old)"]: 1, names.PHASES["log-probs (ref)"]: 1,
          names.PHASES["actor update"]: 3}  # fmt: skip
#: Which measured figure stands beside which phase of the plan's estimate (the start of recipe.memory_fit's names), and
#: whether it measures what the estimate counts: the node's used RAM is every process's (the OS, vLLM, Ray, ...), so it
#: is shown beside the estimate but never called over it.
MEASURED = (
    ("actor phase", names.ACTOR_PEAK_GIB, "the actor worker's device peak (torch max_memory_allocated)", True),
    ("host RAM", names.HOST_USED_GIB, "the node's used RAM as the actor saw it (psutil; every process on the node)",
     False),
)  # fmt: skip
#: Timers verl 0.9.1 runs in every step of the recipe's plans; the others (the save's, the reward's, which 0.9.1
#: never logs) are not missed when absent.
EVERY_STEP = ("generation", "log-probs (old)", "log-probs (ref)", "advantages", "actor update", "weight sync")
#: What the report says of a phase verl does not measure (the rollout's: vLLM takes its pool whole at start).
NOT_MEASURED = "not measured by verl"
#: The estimate's term that most likely grew when the actor's peak is over: vLLM's pool when the excess is at least
#: this share of the pool (vLLM did not release it while the actor trained), else the largest term that grows with the
#: batch (activations, logits: the fixed ones are counted byte for byte, tests/e2e/test_memory_fit.py).
VLLM_POOL_SHARE = 0.5


@dataclass(frozen=True)
class Peak:
    """The device's dense bf16 peak the MFU divides by, and where that figure came from."""

    tflops: float | None
    source: str


def device_peak(device: str, setting: float | None) -> Peak:
    """PEAK_TFLOPS when set; else an H100's on gpu; none on npu (no public figure the recipe trusts per die)."""
    if setting is not None:
        return Peak(setting, "PEAK_TFLOPS")
    if device == "gpu":
        return Peak(GPU_PEAK_TFLOPS, "an H100's dense bf16 peak; PEAK_TFLOPS for another")
    return Peak(None, "no peak assumed on npu; set PEAK_TFLOPS to the chip's dense bf16 peak for an MFU")


@dataclass(frozen=True)
class ReportInputs:
    """What the report needs besides the metrics: from the plan, and the trainer's exit status."""

    exit_code: int
    devices: int
    active_per_token: int | None
    peak: Peak
    memory: MemoryEstimate | None
    #: Where the signs start (HEALTH_THRESHOLDS).
    thresholds: Thresholds = Thresholds()


@dataclass(frozen=True)
class StepRow:
    """One step: its time, the time of each phase verl timed, its tokens."""

    step: int
    seconds: float
    phases: dict[str, float]
    tokens: float | None
    verl_throughput: float | None

    @property
    def untimed(self) -> float:
        """Time inside the step that none of verl's timers covers."""
        return self.seconds - sum(self.phases.values())

    def tokens_per_device_second(self, devices: int) -> float | None:
        """The step's tokens per second per device: verl's count over the step's time and the run's devices."""
        if self.tokens is None or self.seconds <= 0:
            return None
        return self.tokens / (self.seconds * devices)

    def to_dict(self, devices: int) -> dict[str, Any]:
        """JSON-ready form."""
        return {"step": self.step, "seconds": self.seconds, "phases": self.phases, "untimed_s": self.untimed,
                "tokens": self.tokens, "tokens_per_s_per_device": self.tokens_per_device_second(devices),
                "verl_throughput": self.verl_throughput}  # fmt: skip


def step_rows(metrics: Mapping[int, Mapping[str, float | None]]) -> list[StepRow]:
    """The steps with a finite, positive step time, in order; a phase with no finite value is left out of its step."""
    rows = []
    for step in sorted(metrics):
        values = metrics[step]
        seconds = values.get(names.STEP_SECONDS)
        if seconds is None or not math.isfinite(seconds) or seconds <= 0:
            continue
        phases = {label: value for label, tag in names.PHASES.items()
                  if (value := values.get(tag)) is not None and math.isfinite(value) and value >= 0}  # fmt: skip
        tokens, throughput = values.get(names.TOKENS), values.get(names.THROUGHPUT)
        rows.append(StepRow(step, seconds, phases, tokens if _finite(tokens) and tokens >= 0 else None,  # type: ignore[operator]
                            throughput if _finite(throughput) else None))  # fmt: skip
    return rows


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def flops_per_token(active_per_token: int, timed: Sequence[str]) -> int:
    """2 x active weights for each pass the step made over a token (PASSES, of the phases verl timed)."""
    tags = {names.PHASES[label] for label in timed}
    return 2 * active_per_token * sum(passes for tag, passes in PASSES.items() if tag in tags)


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _likely_term(phase_name: str, excess: float, memory: MemoryEstimate) -> str:
    """The estimate's term that most likely grew (VLLM_POOL_SHARE): a name from the plan's estimate."""
    phases = {phase.name: phase for phase in memory.phases}
    pool = next((t for p in phases.values() for t in p.terms if t.name.startswith("vLLM pool")), None)
    if phase_name.startswith("actor") and pool is not None and excess >= VLLM_POOL_SHARE * pool.bytes:
        return f"{pool.name}: still held while the actor trained"
    terms = phases[phase_name].terms
    growing = [t for t in terms if not t.fixed] or terms
    return max(growing, key=lambda t: t.bytes).name


@dataclass(frozen=True)
class MemoryRow:
    """A measured peak beside the plan's estimate of the same phase."""

    phase: str
    metric: str
    what: str
    measured_gib: float | None
    estimate_gib: float | None
    likely_term: str | None = None

    @property
    def ratio(self) -> float | None:
        """Measured over estimated."""
        if self.measured_gib is None or not self.estimate_gib:
            return None
        return self.measured_gib / self.estimate_gib

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        over = self.likely_term is not None  # set only where the figure measures what the estimate counts
        return {"phase": self.phase, "metric": self.metric, "what": self.what, "measured_gib": self.measured_gib,
                "estimate_gib": self.estimate_gib, "ratio": self.ratio, "over_estimate": over,
                "likely_term": self.likely_term}  # fmt: skip


def memory_rows(metrics: Mapping[int, Mapping[str, float | None]], memory: MemoryEstimate | None) -> list[MemoryRow]:
    """Each phase of the plan's estimate (without one, each phase verl measures) beside the largest value verl logged for
    it over the steps; a phase verl does not measure says so."""
    phase_names = [phase.name for phase in memory.phases] if memory else [start for start, _, _, _ in MEASURED]
    estimates = {phase.name: phase.total / GIB for phase in memory.phases} if memory else {}
    rows = []
    for phase_name in phase_names:
        metric, what, comparable = next(
            ((m, w, c) for start, m, w, c in MEASURED if phase_name.startswith(start)), ("", NOT_MEASURED, False)
        )
        logged = [v for values in metrics.values() if (v := values.get(metric)) is not None and math.isfinite(v) and v >= 0]
        measured = max(logged) if logged else None
        estimate = estimates.get(phase_name)
        row = MemoryRow(phase_name, metric, what, measured, estimate)
        if comparable and memory and row.ratio is not None and row.ratio > OVER_ESTIMATE and measured is not None and estimate:
            excess = (measured - estimate) * GIB
            row = MemoryRow(phase_name, metric, what, measured, estimate, _likely_term(phase_name, excess, memory))
        rows.append(row)
    return rows


@dataclass(frozen=True)
class RunReport:
    """The report of one run (docs/performance.md)."""

    outcome: str
    exit_code: int
    devices: int
    steps: list[StepRow]
    memory: list[MemoryRow]
    validation_s: float | None
    active_per_token: int | None
    peak: Peak
    notes: list[str] = field(default_factory=list)
    #: The signs of a failing run it showed (recipe.run.health), in the order they started.
    signs: list[Sign] = field(default_factory=list)
    #: The rollout/training mismatch in each unit over the steps (mismatch_figures).
    mismatch: dict[str, dict[str, float | None]] = field(default_factory=dict)

    def phase_medians(self) -> dict[str, tuple[float, int]]:
        """label -> (median seconds over the steps that ran it, how many steps did)."""
        out = {}
        for label in names.PHASES:
            values = [row.phases[label] for row in self.steps if label in row.phases]
            if values:
                out[label] = (statistics.median(values), len(values))
        return out

    def tokens_per_s_per_device(self) -> float | None:
        """Median over the steps of each step's tokens per second per device."""
        return _median([v for row in self.steps if (v := row.tokens_per_device_second(self.devices)) is not None])

    def model_tflops_per_device(self) -> float | None:
        """Median over the steps of the model FLOPs (flops_per_token) per second per device, in TFLOP/s."""
        if not self.active_per_token:
            return None
        values = []
        for row in self.steps:
            rate = row.tokens_per_device_second(self.devices)
            if rate is not None:
                values.append(rate * flops_per_token(self.active_per_token, list(row.phases)) / 1e12)
        return _median(values)

    def mfu(self) -> float | None:
        """Model TFLOP/s per device over the device's peak (None without a peak)."""
        achieved = self.model_tflops_per_device()
        return None if achieved is None or not self.peak.tflops else achieved / self.peak.tflops

    def to_dict(self) -> dict[str, Any]:
        """run-report.json's content."""
        medians = self.phase_medians()
        return {
            "outcome": self.outcome,
            "exit_code": self.exit_code,
            "devices": self.devices,
            "steps_reported": len(self.steps),
            "step_s_median": _median([row.seconds for row in self.steps]),
            "phases_median_s": {label: {"median_s": m, "steps": n} for label, (m, n) in medians.items()},
            "untimed_s_median": _median([row.untimed for row in self.steps]),
            "validation_s_median": self.validation_s,
            "tokens_per_s_per_device": self.tokens_per_s_per_device(),
            "mfu": {
                "value": self.mfu(),
                "model_tflops_per_device": self.model_tflops_per_device(),
                "peak_tflops": self.peak.tflops,
                "peak_source": self.peak.source,
                "active_weights_per_token": self.active_per_token,
                "formula": "2 x active weights per token x (1 rollout + 1 old log-prob + 1 ref log-prob + 3 actor "
                "update) passes, for the passes verl timed; x tokens / (step seconds x devices x peak). Attention's "
                "quadratic term, DeltaNet's state update, recomputation and the vision tower are not counted: a "
                "lower bound",
            },
            "memory": [row.to_dict() for row in self.memory],
            "per_step": [row.to_dict(self.devices) for row in self.steps],
            "health": [{"sign": sign.name, "since_step": sign.since, "seen": sign.seen} for sign in self.signs],
            "mismatch": self.mismatch,
            "notes": self.notes,
        }

    def to_json(self) -> str:
        """run-report.json's text; a figure that overflowed to inf (a step of 1e-308 s) is null, as JSON has no inf."""
        return json.dumps(_finite_only(self.to_dict()), indent=2, allow_nan=False)

    def to_text(self, where: str) -> str:
        """The short table `run` prints at the end."""
        lines = [f"run report ({where}): {self.outcome}, {len(self.steps)} step(s) on {self.devices} device(s)"]
        if not self.steps:
            lines += [f"  {note}" for note in self.notes]
            return "\n".join(lines)
        step = _median([row.seconds for row in self.steps]) or 0.0
        lines.append(f"  {'step (median)':28} {step:9.1f} s")
        for label, (median, count) in self.phase_medians().items():
            share = f"{100 * median / step:5.1f} %" if step else ""
            often = "" if count == len(self.steps) else f"  ({count} of {len(self.steps)} steps)"
            lines.append(f"  {label:28} {median:9.1f} s {share}{often}")
        untimed = _median([row.untimed for row in self.steps])
        if untimed is not None:
            lines.append(f"  {'untimed by verl':28} {untimed:9.1f} s")
        if self.validation_s is not None:
            lines.append(f"  {'validation (outside steps)':28} {self.validation_s:9.1f} s")
        rate = self.tokens_per_s_per_device()
        lines.append(f"  {'tokens/s/device':28} {'n/a' if rate is None else format(rate, '9.1f')}")
        achieved, mfu = self.model_tflops_per_device(), self.mfu()
        if achieved is None:
            lines.append(f"  {'MFU':28}       n/a (the model's sizes are unknown)")
        elif mfu is None:
            lines.append(f"  {'model TFLOP/s/device':28} {achieved:9.3g}  (MFU: {self.peak.source})")
        else:
            lines.append(f"  {'MFU':28} {100 * mfu:9.3g} %  ({achieved:.3g} of {self.peak.tflops:g} TFLOP/s: "
                         f"{self.peak.source})")  # fmt: skip
        for row in self.memory:
            if row.measured_gib is None:
                measured = row.what if not row.metric else f"nothing logged ({row.metric})"
            else:
                measured = f"{row.measured_gib:.2f} GiB measured"
            estimate = "no estimate" if row.estimate_gib is None else f"estimate {row.estimate_gib:.2f} GiB"
            ratio = "" if row.ratio is None else f", ratio {row.ratio:.2f}"
            lines.append(f"  memory, {row.phase}: {measured}, {estimate}{ratio}")
            if row.likely_term:
                lines.append(f"    over the estimate by {100 * (row.ratio or 0) - 100:.0f} %: most likely "
                             f"{row.likely_term} grew; please report it (docs/performance.md)")  # fmt: skip
        for unit, figures in self.mismatch.items():
            label, form, scale = MISMATCH_SHOWN[unit]
            bound = "" if figures["bound"] is None else f" (bound {figures['bound']:g})"
            lines.append(f"  {label:28} median {format(scale * (figures['median'] or 0.0), form)}, "
                         f"worst {format(scale * (figures['worst'] or 0.0), form)}{bound}")  # fmt: skip
        lines += [f"  health: {sign.name} from step {sign.since} ({sign.seen})" for sign in self.signs]
        lines += [f"  {note}" for note in self.notes]
        return "\n".join(lines)


#: The mismatch's units in the table: label, number format, scale.
MISMATCH_SHOWN = {"kl": ("mismatch, KL", ".2g", 1.0), "abs_log_prob_diff": ("mismatch, |Δlog p| per token", ".2g", 1.0),
                  "capped_tokens": ("tokens capped, %", ".2f", 100.0)}  # fmt: skip


def mismatch_figures(metrics: Mapping[int, Mapping[str, float | None]],
                     limits: Thresholds = Thresholds()) -> dict[str, dict[str, float | None]]:  # fmt: skip
    """The rollout/training mismatch over the run's steps, in each unit verl (or recipe.mismatch) logged: the median,
    the worst step's value (the largest in size: verl's KL is signed) and the bound its health sign starts at
    (docs/health.md); and the share of tokens the correction capped. A unit no step logged is left out."""
    out: dict[str, dict[str, float | None]] = {}
    for unit, tag, bound in (("kl", MISMATCH_KL, limits.mismatch_kl), ("abs_log_prob_diff", MISMATCH_ABS, limits.mismatch_abs),
                             ("capped_tokens", names.CAPPED_TOKENS, None)):  # fmt: skip
        values = [value for step in sorted(metrics) if _finite(value := metrics[step].get(tag))]
        if values:
            out[unit] = {"median": statistics.median(values), "worst": max(values, key=abs), "bound": bound}  # type: ignore[arg-type]
    return out


def _finite_only(value: Any) -> Any:
    """`value` with each float that is not finite replaced by None, in its dicts and lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite_only(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_finite_only(item) for item in value]
    return value


def outcome(exit_code: int) -> str:
    """finished, stopped (by which signal) or failed (with its exit status)."""
    if exit_code == 0:
        return "finished"
    return STOPPED_CODES.get(exit_code, f"failed (exit {exit_code})")


def build_report(metrics: Mapping[int, Mapping[str, float | None]], inputs: ReportInputs) -> RunReport:
    """The report of the steps verl logged (recipe.run.progress.read_steps' form), whatever the run's end."""
    rows = step_rows(metrics)
    notes = []
    if not metrics:
        notes.append("no step was logged: the trainer ended before its first step's metrics")
    elif not rows:
        notes.append(f"{len(metrics)} step(s) logged, none with a finite step time ({names.STEP_SECONDS})")
    missing = sorted(label for label in EVERY_STEP if rows and all(label not in row.phases for row in rows))
    if missing:
        notes.append(f"not logged by this verl: {', '.join(missing)}")
    validation = _median([v for values in metrics.values() if (v := values.get(names.VALIDATION_SECONDS)) is not None
                          and math.isfinite(v) and v >= 0])  # fmt: skip
    return RunReport(outcome(inputs.exit_code), inputs.exit_code, inputs.devices, rows,
                     memory_rows(metrics, inputs.memory), validation, inputs.active_per_token, inputs.peak, notes,
                     signs_of(metrics, inputs.thresholds), mismatch_figures(metrics, inputs.thresholds))  # fmt: skip
