"""One resolved, checked launch plan: settings -> device -> model -> layout -> allocator -> argv.

`plan` prints it; `run` executes it. Every problem of every stage is collected
and reported at once.
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, TypeVar

from recipe import __version__
from recipe.allocator import AllocatorDecision, decide_allocator
from recipe.checkpoint_tracker import TRACKER_NAME, ResumeCheckError, tracked_step_dir
from recipe.cluster.rules import failure_bounds
from recipe.chip import DEFAULT_CHIP, Chip, assumed_chip, chip_setting_problem
from recipe.device import DeviceDetection, detect_device
from recipe.errors import RecipeConfigError
from recipe.export.report import printable
from recipe.image_facts import image_info_dir, read_labels
from recipe.launch import (
    Override,
    build_overrides,
    override_value,
    planned_checkpoint_root,
    planned_step_total,
    planned_training_file,
    runtime_environment,
    trainer_argv,
)
from recipe.layout import ParallelLayout, resolve_layout
from recipe.memory_fit import MemoryEstimate, device_memory, estimate
from recipe.memory_workload import EstimateSkipped, length_problems, workload_from_overrides
from recipe.models import ModelSource, load_architecture
from recipe.own_paths import own_path_problems
from recipe.plan_warnings import plan_warnings
from recipe.routing_replay import routing_replay_problems
from recipe.profiles import profile_overrides, profile_problems
from recipe.run_length import RESUME_WAYS_OUT, resume_point
from recipe.provenance import build_record, drift_problems
from recipe.record_file import RECORD_NAME, REWARD_FUNCTION_KEY, UnreadableRecord, read_record
from recipe.settings import Settings
from recipe.tracking import tracker_project, wandb_names
from recipe.user_overrides import (
    check_user_overrides,
    decided_keys,
    merge_user_overrides,
    user_overrides,
)
from recipe.verl_config import VerlConfigCheck, check_verl_config, key_kinds

T = TypeVar("T")


@dataclass(frozen=True)
class Plan:
    """Everything `run` will do, decided before it does any of it."""

    settings: Settings
    device: DeviceDetection
    model: ModelSource
    layout: ParallelLayout
    allocator: AllocatorDecision
    #: Environment changes for the trainer and its Ray workers (None: unset the variable).
    env: dict[str, str | None]
    overrides: list[str]
    argv: list[str]
    #: What the run is made of (recipe.provenance); deterministic for unchanged inputs.
    provenance: dict[str, Any] = field(default_factory=dict)
    #: Drift since the checkpoint's run started that ALLOW_DRIFT accepted, one line each.
    drift_accepted: list[str] = field(default_factory=list)
    #: On npu, the chip assumed and why ({"name", "reason"}); None on gpu.
    chip: dict[str, str] | None = None
    #: Will it fit (recipe.memory_fit); None with `memory_skipped` saying why when it cannot be estimated.
    memory: MemoryEstimate | None = None
    memory_skipped: str | None = None
    #: What the training data are, where the recipe makes them (the smoke or bench profile's); None for the user's files.
    data: str | None = None
    #: Where the trainer starts: a saved step or fresh, and the drift guard's verdict on it (recipe.run_length).
    resume: dict[str, Any] = field(default_factory=dict)
    #: What the plan accepts but would fail or mislead later (recipe.plan_warnings), one line each.
    warnings: list[str] = field(default_factory=list)
    #: Across several nodes: how long a lost node or head takes to end the run (recipe.cluster.rules.failure_bounds).
    nodes: dict[str, Any] = field(default_factory=dict)
    #: With wandb among the loggers: the project, entity and run name verl's wandb.init will use (recipe.tracking).
    wandb: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The plan as one JSON-ready document (secrets redacted)."""
        return {
            "recipe_version": __version__,
            "device": self.device.to_dict(),
            "settings": self.settings.redacted(),
            "model": self.model.to_dict(),
            "layout": self.layout.to_dict(),
            "allocator": self.allocator.to_dict(),
            "env": self.env,
            "overrides": self.overrides,
            "argv": self.argv,
            "provenance": self.provenance,
            "drift_accepted": self.drift_accepted,
            "chip": self.chip,
            "memory": self.memory.to_dict() if self.memory else {"skipped": self.memory_skipped},
            "data": self.data,
            "resume": self.resume,
            "warnings": self.warnings,
            "nodes": self.nodes,
            "wandb": self.wandb,
        }

    def to_json(self) -> str:
        """`plan --json` output."""
        return json.dumps(self.to_dict(), indent=2)

    def to_text(self) -> str:
        """`plan` output for people."""
        lay = self.layout
        lines = [
            f"device   {self.device.name} ({self.device.source}: {self.device.reason})",
            *([f"chip     {self.chip['name']} ({self.chip['reason']})"] if self.chip else []),
            f"model    {self.model.architecture.name} [{self.model.source}]",
            f"layout   TP={lay.tp} PP={lay.pp} CP={lay.cp} EP={lay.ep} ETP={lay.etp} GEN_TP={lay.gen_tp} "
            f"DP={lay.dp} on {lay.nnodes} node(s) x {lay.ndevices_per_node} = {lay.world_size} devices",
        ]
        defaulted = [name for name, source in lay.sources.items() if source != "environment"]
        if defaulted:
            lines.append(f"         defaults used for: {', '.join(defaulted)}")
        lines.append(f"memory   {self.allocator.variable}={self.allocator.value or '(unset)'}: {self.allocator.reason}")
        if self.memory:
            lines += [f"{'fit' if i == 0 else '':<8} {line}" for i, line in enumerate(self.memory.to_text())]
            lines += [f"warning  {line}" for line in self.memory.warnings()]
        else:
            lines.append(f"fit      no memory-fit estimate: {self.memory_skipped}")
        if self.data:
            lines.append(f"data     {self.data}")
        lines += [f"warning  {line}" for line in self.warnings]
        lines.append("env      " + " ".join(f"{k}={'(unset)' if v is None else v}" for k, v in self.env.items()))
        if self.resume:
            lines.append(f"resume   {self.resume['text']}")
        if self.nodes:
            lines.append(f"nodes    {self.nodes['text']}")
        if self.wandb:
            lines.append(f"wandb    {self.wandb['text']}")
        for line in self.drift_accepted:
            lines.append(f"drift    {line}")
        python, flag, module, *overrides = self.argv
        lines.append(f"command  {shlex.join([python, flag, module])}, with these overrides (one argv item each; "
                     "the exact command line: plan --json, or run's Executing: line)")  # fmt: skip
        for group, items in grouped_overrides(overrides):
            lines += [f"  {group if i == 0 else '':<9} {printable(item)}" for i, item in enumerate(items)]
        return "\n".join(lines)


#: How `plan` groups the trainer's overrides for people: the first prefix that matches names the group.
OVERRIDE_GROUPS = (
    ("data", "data."), ("model", "actor_rollout_ref.model."), ("actor", "actor_rollout_ref.actor."),
    ("rollout", "actor_rollout_ref.rollout."), ("ref", "actor_rollout_ref.ref."), ("algorithm", "algorithm."),
    ("reward", "reward."), ("trainer", "trainer."), ("ray", "ray_kwargs."),
)  # fmt: skip


def grouped_overrides(overrides: Sequence[str]) -> list[tuple[str, list[str]]]:
    """The overrides by group (OVERRIDE_GROUPS, then `other`), each group in argv order; none dropped or added."""
    groups: dict[str, list[str]] = {name: [] for name, _ in OVERRIDE_GROUPS} | {"other": []}
    for text in overrides:
        key = text.split("=", 1)[0].lstrip("+~")
        name = next((name for name, prefix in OVERRIDE_GROUPS if key.startswith(prefix)), "other")
        groups[name].append(text)
    return [(name, items) for name, items in groups.items() if items]


def _collect(problems: list[str], step: Callable[[], T]) -> T | None:
    try:
        return step()
    except RecipeConfigError as error:
        problems.extend(error.problems)
        return None


def build_plan(
    settings: Settings,
    environ: Mapping[str, str],
    extra_overrides: Sequence[str] = (),
    root: Path = Path("/"),
) -> Plan:
    """Resolve and check everything; raises RecipeConfigError with every problem found."""
    device = detect_device(settings.device, root=root, environ=environ)
    problems: list[str] = []
    model_dir = settings.model_path
    if settings.profile == "smoke" and not (model_dir / "config.json").is_file():
        # lazy: the smoke profile's modules import datasets and Pillow; only with PROFILE=smoke
        from recipe.smoke import shipped_model_dir

        model_dir = shipped_model_dir()  # `run` builds the smoke model from exactly this config
    model = _collect(problems, lambda: load_architecture(model_dir))
    chip, chip_reason = DEFAULT_CHIP, ""
    if device.name == "npu":
        chip, chip_reason = _collect(problems, lambda: _assumed_chip(environ, settings.cann_chip)) or (DEFAULT_CHIP, "")
    layout = (
        _collect(problems, lambda: resolve_layout(settings, device.name, model.architecture, chip))
        if model is not None
        else None
    )
    allocator = _collect(problems, lambda: decide_allocator(settings, device.name, environ))
    env = _collect(problems, lambda: runtime_environment(settings, device.name, allocator, environ)) if allocator else None
    if problems or model is None or layout is None or allocator is None or env is None:
        raise RecipeConfigError(problems)
    recipe_overrides = build_overrides(settings, device.name, layout, env, tracker_project(environ))
    if settings.profile != "full":
        # The profile's own overrides are the recipe's: each replaces the recipe's value for its key
        # (or is added), and is never judged like one given after `--`.
        profile = {o.key: o for o in map(_profile_override, profile_overrides(settings.profile))}
        recipe_overrides = [profile.pop(o.key, o) for o in recipe_overrides] + list(profile.values())
    extra = user_overrides(settings.override_list, extra_overrides)
    accepted, problems = check_user_overrides(recipe_overrides, extra, key_kinds(recipe_overrides) if extra else None)
    overrides = merge_user_overrides(recipe_overrides, accepted)
    # Only what the user adds after `--` can make verl read something the plan does not show.
    verl_check = check_verl_config(recipe_overrides, overrides, accepted) if accepted else VerlConfigCheck([])
    problems += verl_check.problems
    problems += own_path_problems(settings, overrides, env) + _data_file_problems(settings)
    problems += profile_problems(settings.profile, settings.train_batch_size)
    problems += routing_replay_problems(overrides, settings.allowed_upstream_issues)
    # A refused length would make the estimate divide by a sequence of no tokens: the refusal is the answer.
    refused_lengths = length_problems(overrides)
    problems += refused_lengths
    memory, memory_skipped = None, None
    if not refused_lengths:
        memory, memory_skipped = _memory_estimate(settings, device.name, chip, model, layout, overrides)
    if memory:
        problems += memory.problems()
    if problems:
        raise RecipeConfigError(problems)
    record = build_record(
        # OVERRIDES is recorded as what it is, extra overrides: the same record as for `--`.
        settings_shown={k: v for k, v in settings.redacted().items() if k != "OVERRIDES"},
        setting_keys=decided_keys(recipe_overrides),
        layout={k: v for k, v in layout.to_dict().items() if k in LAYOUT_FIELDS},
        overrides=overrides,
        extra_overrides=[str(o) for o in accepted],
        environment_reads=verl_check.environment_reads,
        # The smoke profile's own reward function is a recipe override: no `--` needed to name it.
        referenced_files={
            **({REWARD_FUNCTION_KEY: reward} if (reward := override_value(overrides, REWARD_FUNCTION_KEY)) else {}),
            **verl_check.referenced_files,
        },
        model_dir=model_dir,
        train_files=settings.resolved_train_files,
        val_files=settings.resolved_val_files,
        environ=environ,
    )
    drift_accepted = _drift_guard(settings, overrides, record)
    resume = _resume(settings, overrides, drift_accepted)
    return Plan(
        settings, device, model, layout, allocator, env, overrides, trainer_argv(overrides), record, drift_accepted,
        {"name": chip, "reason": chip_reason} if device.name == "npu" else None,
        memory,
        memory_skipped,
        _data_note(settings, overrides),
        resume,
        # The smoke profile runs on one device by design: the others' idling is no slip.
        plan_warnings(settings, environ, model, overrides,
                      (device.name, device.visible_devices if settings.profile != "smoke" else 0, layout.ndevices_per_node)),
        failure_bounds(settings.nnodes, settings.ray_wait_timeout, settings.ray_address is not None),
        wandb_names(overrides, environ),
    )


def _resume(settings: Settings, overrides: Sequence[str], drift_accepted: Sequence[str]) -> dict[str, Any]:
    """Where the trainer will start (recipe.run_length), with the drift guard's verdict, for `plan` to state."""
    root = planned_checkpoint_root(settings, overrides)
    try:
        point = resume_point(
            override_value(overrides, "trainer.resume_mode"), override_value(overrides, "trainer.resume_from_path"), root, None
        )
    except ResumeCheckError as error:
        # One rule for `plan` and `run` (recipe.run_length): what `run` refuses, the plan refuses too.
        raise RecipeConfigError(
            [f"CHECKPOINT_DIR={str(settings.checkpoint_dir)!r}: {printable(str(error))}; {RESUME_WAYS_OUT}"]
        ) from None
    if point.step is not None:
        point = replace(point, total=planned_step_total(settings, overrides))
    document = point.to_dict()
    if point.step is not None and override_value(overrides, "trainer.resume_mode") == "auto":
        records = [root / RECORD_NAME, point.path / RECORD_NAME] if point.path else [root / RECORD_NAME]
        if drift_accepted:
            document["drift"] = f"accepted by ALLOW_DRIFT: {len(drift_accepted)} field(s), the drift lines below"
        elif any(path.is_file() for path in records):
            document["drift"] = "none: the settings and inputs match the run's record"
        else:
            document["drift"] = "not checked: the checkpoint has no run record (written before run records)"
    document["text"] = printable(point.describe()) + (f"; drift {document['drift']}" if "drift" in document else "")
    return document


def _data_note(settings: Settings, overrides: Sequence[str]) -> str | None:
    """The smoke or bench profile's data, when the run uses them (recipe.smoke.profile, recipe.bench.profile)."""
    if settings.profile == "bench":
        # lazy: the bench profile's modules, only with PROFILE=bench
        from recipe.bench import bench_data_note, bench_rows

        train_file = planned_training_file(settings, overrides)
        steps = int(override_value(overrides, "trainer.total_training_steps") or 0)
        rows = bench_rows(train_file, settings.checkpoint_dir, settings.train_batch_size, steps)
        return None if rows is None else bench_data_note(steps, *rows)
    if settings.profile != "smoke":
        return None
    # lazy: the smoke profile's modules import datasets and Pillow; only with PROFILE=smoke
    from recipe.smoke import SmokeAssets, assets_root
    from recipe.smoke.profile import smoke_data_note  # lazy: the smoke profile's modules, only with PROFILE=smoke

    if settings.resolved_train_files != SmokeAssets.under(assets_root(settings.checkpoint_dir)).train_file:
        return None
    return smoke_data_note()


def _memory_estimate(
    settings: Settings, device: str, chip: Chip, model: ModelSource, layout: ParallelLayout, overrides: Sequence[str]
) -> tuple[MemoryEstimate | None, str | None]:
    """The plan's memory estimate, or None and why there is none."""
    if model.sizes is None:
        return None, f"{model.sizes_problem} ({model.source})"
    try:
        work = workload_from_overrides(overrides)
    except EstimateSkipped as skipped:
        return None, str(skipped)
    gib, source = device_memory(settings.device_memory_gib, device, chip)
    return estimate(model.sizes, layout, work, device, gib, source), None  # type: ignore[arg-type]


def _assumed_chip(environ: Mapping[str, str], setting: Chip | None) -> tuple[Chip, str]:
    """The npu chip this plan is for: the image's label, else CANN_CHIP, else the default (recipe.chip)."""
    labels = read_labels(image_info_dir(environ))
    problem = chip_setting_problem(labels[0] if labels else None, setting)
    if problem:
        raise RecipeConfigError([problem])
    return assumed_chip(labels[0] if labels else None, setting)


#: The layout's numbers that decide the math (its `sources` only say where each came from).
LAYOUT_FIELDS = ("tp", "pp", "cp", "ep", "etp", "gen_tp", "nnodes", "ndevices_per_node", "world_size", "dp")


def _data_file_problems(settings: Settings) -> list[str]:
    """TRAIN_FILES or VAL_FILES naming something that exists but is no file (a directory, a FIFO): verl reads one parquet file."""
    problems = []
    for name, path in (("TRAIN_FILES", settings.resolved_train_files), ("VAL_FILES", settings.resolved_val_files)):
        if os.path.exists(path) and not os.path.isfile(path):
            kind = "a directory" if os.path.isdir(path) else "not a regular file"
            problems.append(
                f"{name}={printable(str(path))!r}: {kind}; name the parquet file itself"
                + (f" (e.g. {printable(str(path / 'train.parquet'))})" if os.path.isdir(path) and name == "TRAIN_FILES" else "")
            )
    return problems


def _drift_guard(settings: Settings, overrides: Sequence[str], record: dict[str, Any]) -> list[str]:
    """Compare with the record of the run verl would resume; refuse drift (exit 2), return what ALLOW_DRIFT accepted."""
    if override_value(overrides, "trainer.resume_mode") != "auto":
        return []  # a fresh start, or a step the user picked with resume_path
    root = planned_checkpoint_root(settings, overrides)
    if not os.path.lexists(root / TRACKER_NAME):
        return []  # nothing to resume: verl starts afresh
    try:
        tracked = tracked_step_dir(root)
    except ResumeCheckError:
        tracked = None  # verl cannot read its tracker: `run`'s resume guard refuses that; the run's record still counts
    # The run's record and the record of the step verl resumes: either may be all that is left.
    paths = [root / RECORD_NAME, *([tracked[0] / RECORD_NAME] if tracked else [])]
    stored_records = []
    for path in paths:
        try:
            stored = read_record(path)
        except UnreadableRecord as error:
            # ALLOW_DRIFT does not reach this: it accepts a named change, and nothing can be compared here.
            raise RecipeConfigError(
                [f"CHECKPOINT_DIR={str(settings.checkpoint_dir)!r}: {printable(str(error))}; move it away to resume "
                 "without a drift check"]
            ) from None
        if stored is not None:  # None: a checkpoint from before run records, nothing to compare with
            stored_records.append((stored, path))
    # One line per field, from the run's record first.
    refused, accepted = drift_problems(stored_records, record, settings.allowed_drift)
    if refused:
        raise RecipeConfigError(refused)
    return accepted


def _profile_override(text: str) -> Override:
    key, _, value = text.partition("=")
    return Override(key, value)
