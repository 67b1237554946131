"""One resolved, checked launch plan: settings -> device -> model -> layout -> allocator -> argv.

`plan` prints it; `run` executes it. Every problem of every stage is collected
and reported at once.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, TypeVar

from recipe import __version__
from recipe.allocator import AllocatorDecision, decide_allocator
from recipe.device import DeviceDetection, detect_device
from recipe.errors import RecipeConfigError
from recipe.launch import build_overrides, merge_user_overrides, runtime_environment, trainer_argv
from recipe.layout import ParallelLayout, resolve_layout
from recipe.models import ModelSource, load_architecture
from recipe.settings import Settings

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
        }

    def to_json(self) -> str:
        """`plan --json` output."""
        return json.dumps(self.to_dict(), indent=2)

    def to_text(self) -> str:
        """`plan` output for people."""
        lay = self.layout
        lines = [
            f"device   {self.device.name} ({self.device.source}: {self.device.reason})",
            f"model    {self.model.architecture.name} [{self.model.source}]",
            f"layout   TP={lay.tp} PP={lay.pp} CP={lay.cp} EP={lay.ep} ETP={lay.etp} GEN_TP={lay.gen_tp} "
            f"DP={lay.dp} on {lay.nnodes} node(s) x {lay.ndevices_per_node} = {lay.world_size} devices",
        ]
        defaulted = [name for name, source in lay.sources.items() if source != "environment"]
        if defaulted:
            lines.append(f"         defaults used for: {', '.join(defaulted)}")
        lines.append(f"memory   {self.allocator.variable}={self.allocator.value or '(unset)'}: {self.allocator.reason}")
        lines.append("env      " + " ".join(f"{k}={'(unset)' if v is None else v}" for k, v in self.env.items()))
        lines.append("command  " + shlex.join(self.argv))
        return "\n".join(lines)


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
        from recipe.smoke import shipped_model_dir

        model_dir = shipped_model_dir()  # `run` builds the smoke model from exactly this config
    model = _collect(problems, lambda: load_architecture(model_dir))
    layout = (
        _collect(problems, lambda: resolve_layout(settings, device.name, model.architecture))
        if model is not None
        else None
    )
    allocator = _collect(problems, lambda: decide_allocator(settings, device.name, environ))
    if problems or model is None or layout is None or allocator is None:
        raise RecipeConfigError(problems)
    env = runtime_environment(settings, device.name, allocator, environ)
    recipe_overrides = build_overrides(settings, device.name, layout, env)
    if settings.profile == "smoke":
        from recipe.smoke import smoke_overrides

        extra_overrides = [*smoke_overrides(), *extra_overrides]  # the user's `--` overrides still come last
    overrides = merge_user_overrides(recipe_overrides, extra_overrides)
    return Plan(settings, device, model, layout, allocator, env, overrides, trainer_argv(overrides))
