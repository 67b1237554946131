"""The smoke run's verdict: did this image learn, sync its weights and export them? PASS or FAIL.

`run` with PROFILE=smoke calls `smoke_verdict` once the trainer has exited 0. It reads what
the run itself left: the metrics verl's file logger wrote for each step (one JSON line each,
`{"step": N, "data": {metric: value}}`, at the plan's VERL_FILE_LOGGER_PATH), the training data
(whose prompts, counted with their images, the logged prompt lengths must match), the newest HF
export and the watcher's report beside it. Each check says what it measured and its limit;
one failed check fails the verdict. Every file is read as hostile input: a malformed line, a
missing file or a non-number is a failed check that says so, never a traceback.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recipe.run.health import MISMATCH_ABS, MISMATCH_KL
from recipe.numbers import NumberRefused, whole_number
from recipe.read_back import FileRefused, parse_json, read_file

if TYPE_CHECKING:  # counting imports transformers and verl: only where the check runs
    from recipe.data.prompt_lengths import PromptLengths
    from recipe.export.watch import HFExport

#: GRPO's advantages: not all equal when the rewards differ within some prompt's group of samples.
ADVANTAGE_MAX, ADVANTAGE_MIN = "critic/advantages/max", "critic/advantages/min"
GRAD_NORM = "actor/grad_norm"
PROBS_DIFF_MAX = "training/rollout_probs_diff_max"
#: The shortest and longest prompt of the step's batch, in the token ids vLLM and the actor got (images expanded).
PROMPT_MIN, PROMPT_MAX = "prompt_length/min", "prompt_length/max"
#: Exported tensors of the vision tower (transformers' Qwen3.5 names: model.visual.*).
VISION_TENSORS = ".visual."
#: vLLM's and the actor's probabilities of the same sampled tokens, both bf16, other kernels: measured up to
#: 9.5e-4 on CPU (tests/e2e); a weight sync that loses or mangles a tensor moves them by 1e-1 and more.
PROBS_DIFF_LIMIT = 1e-2
#: The rollout/training mismatch in the two anchors' units (docs/health.md): verl's signed mean, NeMo-RL's `kl`, and
#: the recipe's mean |log p_rollout - log p_train| per token, slime's. Measured on CPU (tests/e2e, vLLM's CPU kernels
#: against Megatron's): 0.0043-0.0045 and 0.0116-0.0121. NeMo-RL's 0.002 is a bound for accelerators, which the CPU
#: exceeds; these limits leave the CPU about 2x and 4x room, and the second stays at half slime's 0.1, where a run
#: is called broken from 0.2. A weight sync that loses or mangles a tensor moves both by orders of magnitude.
MISMATCH_KL_LIMIT = 1e-2
MISMATCH_ABS_LIMIT = 5e-2

#: What a failed check usually means, for the block's last lines and docs/smoke.md.
HINTS: Mapping[str, str] = {
    "steps": "the trainer stopped early or logged nothing: look for the last `step:` line and the Ray worker "
    "errors after it (a failure before step 1 is usually the device stack: driver, container runtime, NCCL/HCCL)",
    "rewards vary within a prompt's group": "every sample of a prompt got the same reward, so GRPO has no "
    "signal: the reward function (reward.custom_reward_function) or identical samples from vLLM (a seed per prompt)",
    "gradients": "no gradient reached the actor: the optimizer, the loss or the Megatron engine",
    "rollout matches actor": "vLLM samples with other weights than Megatron trains: the weight sync "
    "(update_weights), sleep/wake or a dtype mismatch",
    "mismatch as KL": "vLLM's and Megatron's log-probabilities of the samples drift apart: the weight sync, a dtype "
    "mismatch, or an MoE routing tokens to other experts (docs/health.md); not logged: the rollout returned no "
    "log-probabilities (actor_rollout_ref.rollout.calculate_log_probs)",
    "mismatch per token": "the same drift, token by token, where gaps of opposite signs do not cancel; not logged: "
    "the recipe's worker hook (recipe.mismatch) did not run in verl's workers",
    "HF export": "Megatron-Bridge's export: see the report beside the export (verify-export)",
    "export was trained": "the export holds the initial weights: the export read stale weights, or training "
    "never changed them",
    "images reached the rollout": "the prompts vLLM and the actor got are not the data's prompts with their images: "
    "the images were dropped (data.image_key, a processor that failed to load, limit_mm_per_prompt) or not expanded "
    "into image tokens (docs/troubleshooting.md, images)",
    "vision tower was trained": "the vision tower's exported weights equal the initial ones: no gradient reached it "
    "(no image in the batches, a frozen tower) or the export read stale weights",
    "export watcher": "`run`'s watcher found the save broken or could not check it: its report is beside the export",
}


@dataclass(frozen=True)
class Check:
    """One property of the run: what was measured against which limit."""

    name: str
    passed: bool
    measured: str
    limit: str

    @property
    def hint(self) -> str:
        """What this check failing usually means."""
        return HINTS.get(self.name, "")


@dataclass(frozen=True)
class Verdict:
    """Every check, PASS when all passed."""

    checks: tuple[Check, ...]

    @property
    def passed(self) -> bool:
        return all(check.passed for check in self.checks)

    def to_text(self) -> str:
        """The block `run` prints: one line per check, the failed checks' hints, then `smoke: PASS|FAIL`."""
        width = max(len(check.name) for check in self.checks)
        lines = ["smoke verdict:"]
        for check in self.checks:
            mark = "PASS" if check.passed else "FAIL"
            lines.append(f"  {mark}  {check.name:<{width}}  {check.measured}  (limit: {check.limit})")
        lines += [f"  {check.name}: {check.hint}" for check in self.checks if not check.passed and check.hint]
        lines.append(f"smoke: {'PASS' if self.passed else 'FAIL'}")
        return "\n".join(lines)

    def to_json(self) -> str:
        """One JSON document: `passed` and every check."""
        return json.dumps({"passed": self.passed, "checks": [asdict(c) for c in self.checks]}, indent=2)


class MetricsError(Exception):
    """The metrics file cannot be read as verl's file logger writes it."""


#: verl's metrics log of a smoke run is kilobytes; a file past this is no such log.
MAX_METRICS_BYTES = 64 << 20


def read_metrics(path: Path) -> dict[int, dict[str, float]]:
    """{step: {metric: value}} from verl's file logger; a later line of a step wins. Non-numbers are left out.

    Raises MetricsError naming the file (and line) when it is missing, no regular file (a FIFO
    never blocks the read), too large, or a line is not `{"step": <int>, "data": {...}}`. NaN and
    Infinity, which Python's json writes, are kept: a NaN loss is the run's own verdict. A number no
    float holds (hundreds of digits) is left out like a non-number.
    """
    try:
        # Bytes that are no UTF-8 (a metric's name) are replaced, not a stop: the numbers are what is judged.
        text = read_file(Path(path), MAX_METRICS_BYTES).decode("utf-8", errors="replace")
    except FileRefused as refused:
        why = str(refused).removeprefix(f"{path}: ").removeprefix("cannot be opened (").removesuffix(")")
        raise MetricsError(f"{path}: cannot read the metrics verl logs ({why})") from None
    steps: dict[int, dict[str, float]] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = parse_json(line, f"{path}:{number}", constants=True)
        except FileRefused as refused:
            deep = "nested too deep" in str(refused)
            raise MetricsError(str(refused) if deep else f"{path}:{number}: not a JSON line") from None
        step = record.get("step") if isinstance(record, dict) else None
        data = record.get("data") if isinstance(record, dict) else None
        if isinstance(step, bool) or not isinstance(step, int) or not isinstance(data, dict):
            raise MetricsError(f'{path}:{number}: not a metrics line ({{"step": <int>, "data": {{...}}}})')
        try:
            step = whole_number(step, 0, MAX_STEP, "step")
        except NumberRefused as refused:
            raise MetricsError(f"{path}:{number}: {refused}") from None
        steps.setdefault(step, {}).update(
            {str(name): value for name, raw in data.items() if (value := _metric(raw)) is not None}
        )
    return steps


#: No run has more steps than this; a larger `step` is no step of verl's.
MAX_STEP = 10**9


def _metric(value: Any) -> float | None:
    """A metric's value as a float (NaN and infinities kept), or None for a non-number or one beyond any float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:
        return None


def _per_step(
    metrics: Mapping[int, Mapping[str, float]], steps: int, value: Callable[[Mapping[str, float]], float | None],
    first: int = 1,
) -> tuple[list[float], list[int]]:
    """The value at each logged step of first..steps, and the logged steps where it is missing or not finite.

    A step that was not logged at all is the "steps" check's failure, not every check's.
    """
    found, missing = [], []
    for step in (step for step in range(first, steps + 1) if step in metrics):
        measured = value(metrics[step])
        if measured is None or not math.isfinite(measured):
            missing.append(step)
        else:
            found.append(measured)
    return found, missing


def _spread(values: Mapping[str, float]) -> float | None:
    if ADVANTAGE_MAX not in values or ADVANTAGE_MIN not in values:
        return None
    return values[ADVANTAGE_MAX] - values[ADVANTAGE_MIN]


def _steps_ran(metrics: Mapping[int, Mapping[str, float]], steps: int, first: int = 1) -> Check:
    expected = range(first, steps + 1)
    ran = [step for step in expected if step in metrics]
    resumed = f" (resumed after step {first - 1})" if first > 1 else ""
    return Check("steps", len(ran) == len(expected), f"{len(ran)} of {len(expected)} logged{resumed}",
                 f"every step {first}..{steps}")  # fmt: skip


def _at_every_step(
    name: str,
    metrics: Mapping[int, Mapping[str, float]],
    steps: int,
    value: Callable[[Mapping[str, float]], float | None],
    good: Callable[[float], bool],
    worst: Callable[[Iterable[float]], float],
    limit: str,
    first: int = 1,
) -> Check:
    found, missing = _per_step(metrics, steps, value, first)
    if missing:
        return Check(name, False, f"not logged (or not a finite number) at step {', '.join(map(str, missing))}", limit)
    if not found:
        return Check(name, False, "no step logged", limit)
    return Check(name, all(good(v) for v in found), f"{worst(found):.3g} at its worst step", limit)


def judge_metrics(metrics: Mapping[int, Mapping[str, float]], steps: int, first: int = 1) -> list[Check]:
    """The checks the step metrics decide: every step ran, GRPO had a signal, gradients flowed, vLLM matched.

    `first`: the first step this run trained, after the save it resumed (verl's file logger starts its file anew
    on every start, so a resumed run's file holds only its own steps).
    """
    return [
        _steps_ran(metrics, steps, first),
        _at_every_step(
            "rewards vary within a prompt's group", metrics, steps, _spread, lambda v: v > 0, min,
            f"{ADVANTAGE_MAX} - {ADVANTAGE_MIN} > 0 at every step", first,
        ),
        _at_every_step(
            "gradients", metrics, steps, lambda m: m.get(GRAD_NORM), lambda v: v > 0, min,
            f"{GRAD_NORM} > 0 at every step", first,
        ),
        _at_every_step(
            "rollout matches actor", metrics, steps, lambda m: m.get(PROBS_DIFF_MAX),
            lambda v: v < PROBS_DIFF_LIMIT, max, f"{PROBS_DIFF_MAX} < {PROBS_DIFF_LIMIT:g} at every step", first,
        ),
        _at_every_step(
            "mismatch as KL", metrics, steps, lambda m: m.get(MISMATCH_KL),
            lambda v: abs(v) < MISMATCH_KL_LIMIT, lambda found: max(found, key=abs),
            f"-{MISMATCH_KL_LIMIT:g} < {MISMATCH_KL} < {MISMATCH_KL_LIMIT:g} at every step", first,
        ),
        _at_every_step(
            "mismatch per token", metrics, steps, lambda m: m.get(MISMATCH_ABS),
            lambda v: v < MISMATCH_ABS_LIMIT, max, f"{MISMATCH_ABS} < {MISMATCH_ABS_LIMIT:g} at every step", first,
        ),
    ]  # fmt: skip


def _export_report(export: Path, initial_model: Path) -> Check:
    # lazy: the export checker loads only when the verdict judges an export
    from recipe.export.expected import ExportCheckError
    # lazy: the export checker loads only when the verdict judges an export
    from recipe.export.hf_check import verify_export

    limit = "COMPLETE, or LENIENT with its reason"
    try:
        report = verify_export(export, reference=initial_model)
    except ExportCheckError as error:
        return Check("HF export", False, f"cannot be checked: {error}", limit)
    measured = report.status.upper()
    if report.status == "lenient":
        measured += f" ({'; '.join(report.allowed)})"
    elif report.status == "broken":
        measured += f" ({report.present_count} of {report.expected_count} tensors; verify-export {export})"
    return Check("HF export", report.status != "broken", measured, limit)


def _export_was_trained(export: Path, initial_model: Path, name: str, part: str = "") -> Check:
    """Some tensor of the export whose name holds `part` differs from the initial model's (fp32, first wins)."""
    # lazy: safetensors is heavy or absent where this module is imported; loaded only here
    from safetensors import safe_open

    # lazy: the shard reader loads only when the verdict judges an export
    from recipe.export.shards import read_checkpoint

    which = f"{part.strip('.')} tensor" if part else "tensor"
    limit = f"some {which} differs from the initial model's"
    exported, initial = read_checkpoint(export), read_checkpoint(initial_model)
    if exported.errors or initial.errors:
        return Check(name, False, f"unreadable: {(exported.errors + initial.errors)[0]}", limit)
    if part and not any(part in key for key in initial.tensors):
        return Check(name, True, f"the initial model has no {which}: nothing to check", limit)
    shared = sorted(key for key in set(exported.tensors) & set(initial.tensors) if part in key)
    if not shared:
        return Check(name, False, f"no {which} in both the export and the initial model", limit)
    for key in shared:
        with (
            safe_open(str(export / exported.tensors[key].shard), framework="pt") as ours,
            safe_open(str(initial_model / initial.tensors[key].shard), framework="pt") as theirs,
        ):
            if not ours.get_tensor(key).float().equal(theirs.get_tensor(key).float()):
                return Check(name, True, f"{key} differs", limit)
    return Check(name, False, f"all {len(shared)} shared {which}s equal the initial model's", limit)


def _watcher_report(export: HFExport) -> Check:
    # lazy: the export watcher's module loads only when the verdict judges an export
    from recipe.export.evidence import trusted_status
    from recipe.export.watch import REPORT_NAME

    path = export.directory.parent / REPORT_NAME
    limit = "its report, with evidence that matches the export, says COMPLETE or LENIENT"
    # Unreadable, forged, another step's or out of date (recipe.export.evidence): not the watcher's word on this export.
    status = trusted_status(path, export.step, export.step_dir, export.directory)
    if status is None:
        return Check("export watcher", False, f"no report of the watcher's for this export at {path}", limit)
    return Check("export watcher", status in ("complete", "lenient"), status.upper(), limit)


def judge_export(checkpoint_root: Path, initial_model: Path) -> list[Check]:
    """The checks of the newest finished save: its HF export, that it was trained, the watcher's report."""
    # lazy: the export watcher's module loads only when the verdict judges an export
    from recipe.export.watch import latest_hf_export

    export = latest_hf_export(checkpoint_root)
    if export is None:
        return [Check("HF export", False, f"no finished save with an HF export under {checkpoint_root}", "one")]
    return [
        _export_report(export.directory, initial_model),
        _export_was_trained(export.directory, initial_model, "export was trained"),
        _export_was_trained(export.directory, initial_model, "vision tower was trained", VISION_TENSORS),
        _watcher_report(export),
    ]


def judge_images(
    metrics: Mapping[int, Mapping[str, float]], steps: int, data: PromptLengths | str, first: int = 1
) -> Check:
    """Images reached the rollout: at every step the shortest and the longest prompt are lengths of the data's own
    prompts counted with their images (recipe.data.prompt_lengths); `data` is those lengths, or why they are not
    known. A prompt whose image was dropped, or not expanded into its image tokens, has another length."""
    name = "images reached the rollout"
    if isinstance(data, str):
        return Check(name, False, f"the data's prompts cannot be counted: {data}", "every step's prompts have images")
    if not any(data.image_tokens):
        return Check(name, True, "the training data have no images: nothing to check", "none")
    lengths = set(data.tokens)
    shown = ", ".join(map(str, sorted(lengths)[:3])) + (" ..." if len(lengths) > 3 else "")
    per_prompt = sorted(set(count for count in data.image_tokens if count))
    images = f"{per_prompt[0]}" if len(per_prompt) == 1 else f"{per_prompt[0]} to {per_prompt[-1]}"
    with_images = sum(1 for count in data.image_tokens if count)
    where = "every prompt" if with_images == len(data.image_tokens) else f"{with_images} of {len(data.image_tokens)} prompts"
    limit = f"{PROMPT_MIN} and {PROMPT_MAX} are the data's prompt lengths with images ({shown}) at every step"
    wrong: list[str] = []
    for step in (step for step in range(first, steps + 1) if step in metrics):
        low, high = metrics[step].get(PROMPT_MIN), metrics[step].get(PROMPT_MAX)
        if low is None or high is None:
            wrong.append(f"step {step}: not logged")
        elif low not in lengths or high not in lengths:
            wrong.append(f"step {step}: {low:g} to {high:g} tokens")
    if wrong:
        return Check(name, False, "; ".join(wrong), limit)
    return Check(name, True, f"{images} image tokens in {where} (prompts of {shown} tokens)", limit)


def count_training_prompts(train_file: Path, model: Path) -> PromptLengths | str:
    """The training data's prompt lengths with images, or why they cannot be counted (never raises)."""
    # lazy: counting prompts imports transformers and verl's image code
    from recipe.data.prompt_lengths import PromptCounter, count_parquet
    from recipe.data.source import describe_exception  # lazy: data.source imports datasets

    try:
        return count_parquet(train_file, PromptCounter(model))
    except Exception as error:  # noqa: BLE001  any failure is the check's failure, said in one line
        return describe_exception(error)


def smoke_verdict(
    metrics_file: Path, steps: int, checkpoint_root: Path, initial_model: Path, prompts: PromptLengths | str,
    first: int = 1,
) -> Verdict:
    """Judge a finished smoke run from its metrics file, its training data's prompt lengths (count_training_prompts)
    and its newest save. `first`: the first step it trained (after the save a restarted run resumed)."""
    try:
        metrics = read_metrics(metrics_file)
    except MetricsError as error:
        checks = [Check("steps", False, str(error), f"every step {first}..{steps}")]
    else:
        checks = [*judge_metrics(metrics, steps, first), judge_images(metrics, steps, prompts, first)]
    return Verdict(tuple(checks + judge_export(checkpoint_root, initial_model)))
