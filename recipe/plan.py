"""One resolved, checked launch plan: settings -> device -> model -> layout -> allocator -> argv.

`plan` prints it; `run` executes it. Every problem of every stage is collected
and reported at once.
"""

from __future__ import annotations

import json
import os
import shlex
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence, TypeVar

from recipe import __version__
from recipe.allocator import ALLOC_CONF_VARIABLES, AllocatorDecision, decide_allocator
from recipe.chip import DEFAULT_CHIP, Chip, assumed_chip
from recipe.device import DeviceDetection, detect_device
from recipe.errors import RecipeConfigError
from recipe.export.report import printable
from recipe.launch import (
    _RAY_ENV,
    Override,
    build_overrides,
    checkpoint_root,
    override_value,
    resume_mode_problem,
    runtime_environment,
    trainer_argv,
)
from recipe.layout import ParallelLayout, resolve_layout
from recipe.models import ModelSource, load_architecture
from recipe.provenance import REWARD_FUNCTION_KEY, build_record, drift_problems
from recipe.record_file import RECORD_NAME, UnreadableRecord, read_record
from recipe.settings import Settings
from recipe.user_overrides import (
    _first_line,
    check_user_overrides,
    decided_keys,
    environment_reads,
    hydra_override_parser,
    is_secret_name,
    merge_user_overrides,
)

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
        lines.append("env      " + " ".join(f"{k}={'(unset)' if v is None else v}" for k, v in self.env.items()))
        for line in self.drift_accepted:
            lines.append(f"drift    {line}")
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
    chip, chip_reason = _assumed_chip(environ) if device.name == "npu" else (DEFAULT_CHIP, "")
    layout = (
        _collect(problems, lambda: resolve_layout(settings, device.name, model.architecture, chip))
        if model is not None
        else None
    )
    allocator = _collect(problems, lambda: decide_allocator(settings, device.name, environ))
    env = _collect(problems, lambda: runtime_environment(settings, device.name, allocator, environ)) if allocator else None
    if problems or model is None or layout is None or allocator is None or env is None:
        raise RecipeConfigError(problems)
    recipe_overrides = build_overrides(settings, device.name, layout, env)
    if settings.profile == "smoke":
        from recipe.smoke import smoke_overrides

        # The profile's own overrides are the recipe's: each replaces the recipe's value for its key
        # (or is added), and is never judged like one given after `--`.
        profile = {o.key: o for o in map(_profile_override, smoke_overrides())}
        recipe_overrides = [profile.pop(o.key, o) for o in recipe_overrides] + list(profile.values())
    accepted, problems = check_user_overrides(recipe_overrides, extra_overrides)
    overrides = merge_user_overrides(recipe_overrides, accepted)
    if accepted:
        # Only what the user adds after `--` can make verl read something the plan does not show.
        problems += verl_config_problems(recipe_overrides, overrides, accepted)
    problems += _checkpoint_root_problems(settings, overrides)
    if problems:
        raise RecipeConfigError(problems)
    record = build_record(
        settings_shown=settings.redacted(),
        setting_keys=decided_keys(recipe_overrides),
        layout={k: v for k, v in layout.to_dict().items() if k in LAYOUT_FIELDS},
        overrides=overrides,
        extra_overrides=[str(o) for o in accepted],
        environment_reads=environment_reads(overrides, environ),
        reward_function_path=override_value(overrides, REWARD_FUNCTION_KEY),
        model_dir=model_dir,
        train_files=settings.resolved_train_files,
        val_files=settings.resolved_val_files,
        environ=environ,
    )
    drift_accepted = _drift_guard(settings, overrides, record)
    return Plan(
        settings, device, model, layout, allocator, env, overrides, trainer_argv(overrides), record, drift_accepted,
        {"name": chip, "reason": chip_reason} if device.name == "npu" else None,
    )


def _assumed_chip(environ: Mapping[str, str]) -> tuple[Chip, str]:
    """The npu chip this plan is for: the image's label, else the default (recipe.chip)."""
    from recipe.doctor.facts import image_info_dir, read_labels

    labels = read_labels(image_info_dir(environ))
    return assumed_chip(labels[0] if labels else None)


#: The layout's numbers that decide the math (its `sources` only say where each came from).
LAYOUT_FIELDS = ("tp", "pp", "cp", "ep", "etp", "gen_tp", "nnodes", "ndevices_per_node", "world_size", "dp")
#: verl 0.9.1's tracker of the newest save, in trainer.default_local_dir (checkpoint_manager.py):
#: present, verl resumes (the drift guard here and the resume guard of recipe.run.resume_guard both read it).
TRACKER_NAME = "latest_checkpointed_iteration.txt"


def _checkpoint_root_problems(settings: Settings, overrides: Sequence[str]) -> list[str]:
    """Why the run could not write into its checkpoint root: a part of its path that exists and is no directory."""
    root = Path(override_value(overrides, "trainer.default_local_dir") or checkpoint_root(settings))
    for part in (root, *root.parents):
        if os.path.lexists(part):
            if not part.is_dir():
                return [
                    f"CHECKPOINT_DIR={str(settings.checkpoint_dir)!r}: {printable(str(part))} is not a directory, "
                    f"so the checkpoints cannot go to {printable(str(root))}"
                ]
            return []
    return []


def _drift_guard(settings: Settings, overrides: Sequence[str], record: dict[str, Any]) -> list[str]:
    """Compare with the record of the run verl would resume; refuse drift (exit 2), return what ALLOW_DRIFT accepted."""
    if override_value(overrides, "trainer.resume_mode") != "auto":
        return []  # a fresh start, or a step the user picked with resume_path
    root = Path(override_value(overrides, "trainer.default_local_dir") or checkpoint_root(settings))
    if not os.path.lexists(root / TRACKER_NAME):
        return []  # nothing to resume: verl starts afresh
    path = root / RECORD_NAME
    try:
        stored = read_record(path)
    except UnreadableRecord as error:
        # ALLOW_DRIFT does not reach this: it accepts a named change, and nothing can be compared here.
        raise RecipeConfigError(
            [f"CHECKPOINT_DIR={str(settings.checkpoint_dir)!r}: {printable(str(error))}; move it away to resume "
             "without a drift check"]
        ) from None
    if stored is None:
        return []  # a checkpoint from before run records: nothing to compare with
    refused, accepted = drift_problems(stored, record, settings.allowed_drift, path)
    if refused:
        raise RecipeConfigError(refused)
    return accepted


def _profile_override(text: str) -> Override:
    key, _, value = text.partition("=")
    return Override(key, value)


# --- composition against the installed verl's own config -----------------------------------

#: Marks a secret read through oc.env while the composed config is resolved at plan time.
_CANARY = "<<recipe:secret-read:"
#: Resolutions followed: verl prints the config resolved, resolves it in place, then reads it again.
_RESOLUTIONS = 4


def verl_config_dir() -> Path | None:
    """verl/trainer/config of the installed verl, found without importing verl (which imports torch)."""
    try:
        spec = find_spec("verl")
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / "trainer" / "config"
        if (candidate / "ppo_trainer.yaml").is_file():
            return candidate
    return None


def compose_verl_config(overrides: Sequence[str], config_dir: Path) -> Any:
    """verl's trainer config as `python -m verl.trainer.main_ppo <overrides>` composes it (not resolved)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return compose(config_name="ppo_trainer", overrides=list(overrides))


@contextmanager
def _secret_reads_marked(seen: set[str]) -> Iterator[None]:
    """While inside: oc.env returns a marker for a secret-named variable (recorded in `seen`), the real value otherwise.

    The marker, not the name, is what is looked for afterwards: a name computed by another
    interpolation, or an interpolation assembled from pieces, is caught as well.
    """
    from omegaconf import OmegaConf
    from omegaconf.basecontainer import BaseContainer
    from omegaconf.resolvers import oc

    def marked(key: Any, *default: Any) -> Any:
        if is_secret_name(str(key)):
            seen.add(str(key))
            return f"{_CANARY}{key}>>"
        return oc.env(key, *default)

    saved = BaseContainer._resolvers.get("oc.env")
    OmegaConf.register_new_resolver("oc.env", marked, replace=True, use_cache=False)
    try:
        yield
    finally:
        if saved is None:
            OmegaConf.clear_resolver("oc.env")
        else:
            BaseContainer._resolvers["oc.env"] = saved


def _leaves(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _leaves(child, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from _leaves(child, f"{path}[{index}]")
    else:
        yield path, value


def _select(container: Any, key: str) -> tuple[bool, Any]:
    node = container
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def _compose_problem(overrides: Sequence[str], config_dir: Path) -> str | None:
    try:
        compose_verl_config(overrides, config_dir)
    except Exception as error:  # Hydra's ConfigCompositionException, OmegaConf's errors, ValueError ...
        return "; ".join(line.strip() for line in str(error).splitlines() if line.strip())[:400] or type(error).__name__
    return None


def verl_config_problems(recipe: Sequence[Override], overrides: Sequence[str], extra: Sequence[str]) -> list[str]:
    """Compose verl's own config with the final overrides and check what verl would read.

    - Hydra composes it (unknown keys, wrong case, sweeps ... are refused as Hydra refuses them);
    - resolved the way verl resolves it, no value holds a secret read through oc.env;
    - every key a setting decides still has the recipe's value (a group or package swap cannot
      change it behind the plan's back), and no allocator variable reaches the workers but ours;
    - trainer.resume_mode is a mode verl knows, written literally (the resume guard reads it).
    Needs Hydra and verl's config files; imports neither verl nor torch.
    """
    config_dir = verl_config_dir()
    if config_dir is None or hydra_override_parser() is None:
        return [
            f"overrides after `--` ({len(extra)}): need verl's trainer config (pip install '.[trainer]', or the image) "
            "to be checked the way the trainer reads them; run `plan` in the image (docker compose run --rm gpu plan -- ...)"
        ]
    from omegaconf import OmegaConf

    try:
        config = compose_verl_config(overrides, config_dir)
    except Exception:  # Hydra's ConfigCompositionException, OmegaConf's errors, ValueError ...
        # Hydra stops at the first bad override: find each one that fails on its own.
        base = [str(o) for o in recipe]
        problems, rest = [], []
        for text in extra:
            alone = merge_user_overrides(recipe, [text])
            problem = _compose_problem(alone, config_dir) if alone != base else None
            if problem:
                problems.append(f"override {text!r}: verl's config rejects it ({problem})")
            else:
                rest.append(text)
        if not problems:
            together = _compose_problem(overrides, config_dir)
            return [f"overrides after `--`: verl's config rejects them together ({together})"]
        # Every problem at once: the others are checked without the ones verl's config rejects.
        return problems + (verl_config_problems(recipe, merge_user_overrides(recipe, rest), rest) if rest else [])

    problems: list[str] = []
    trainer = config.get("trainer")
    mode = OmegaConf.to_container(trainer, resolve=False).get("resume_mode") if trainer is not None else None
    interpolated = trainer is not None and "resume_mode" in trainer and OmegaConf.is_interpolation(trainer, "resume_mode")
    problem = resume_mode_problem(mode, interpolated)
    if problem:
        problems.append(problem)

    seen: set[str] = set()
    with _secret_reads_marked(seen):
        try:
            for _ in range(_RESOLUTIONS):
                OmegaConf.resolve(config)
                if not any(isinstance(v, str) and "${" in v for _, v in _leaves(OmegaConf.to_container(config))):
                    break
            resolved = OmegaConf.to_container(config, resolve=True)
        except Exception as error:
            why = _first_line(error)[:300]
            return [*problems, f"overrides after `--`: verl's config cannot be resolved with them ({why})"]
    for path, value in _leaves(resolved):
        if isinstance(value, str) and _CANARY in value:
            names = ", ".join(sorted(seen))
            problems.append(
                f"overrides after `--`: {path} would hold the secret {names} (read through oc.env); a secret reaches "
                "verl only through the environment, never its config (which verl prints and logs)"
            )
        elif isinstance(value, str) and "${" in value:
            problems.append(
                f"overrides after `--`: {path} still holds an interpolation after {_RESOLUTIONS} resolutions "
                f"({value[:80]!r}); verl would resolve it again when it reads it"
            )

    parser = hydra_override_parser()
    for override in recipe:
        if override.setting is None:
            continue
        expected = parser.parse_override(str(override)).value()
        found, value = _select(resolved, override.key)
        if not found or not _same(value, expected):
            problems.append(
                f"overrides after `--`: change {override.key} (now {value!r}, planned {expected!r}), "
                f"which {override.setting} decides; set that instead"
            )
    env_vars = _select(resolved, _RAY_ENV.rstrip("."))[1] or {}
    planned = {o.key.removeprefix(_RAY_ENV): o for o in recipe if o.key.startswith(_RAY_ENV)}
    for variable in ALLOC_CONF_VARIABLES:
        want = parser.parse_override(str(planned[variable])).value() if variable in planned else None
        have = env_vars.get(variable) if isinstance(env_vars, dict) else None
        if have != want:
            problems.append(
                f"overrides after `--`: put {variable}={have!r} into the Ray workers' environment (planned "
                f"{want!r}), which {decided_keys(recipe)[_RAY_ENV + variable]} decides"
            )
    return problems
