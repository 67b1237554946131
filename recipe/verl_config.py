"""The plan's overrides composed against the installed verl's own trainer config, as verl composes them.

What the user adds after `--` can make verl read something the plan does not show: composing with
Hydra (found without importing verl) catches what verl's config rejects, a value that resolves to
a secret, and a key that stops meaning what a setting decided. Resolving it also shows what the
config makes verl read besides itself (environment variables, code files), for the run record.
"""

from __future__ import annotations

import os
import stat
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from recipe.allocator import ALLOC_CONF_VARIABLES
from recipe.config_typos import typo_problems
from recipe.launch import _RAY_ENV, Override, resume_mode_problem
from recipe.user_overrides import _first_line, decided_keys, hydra_override_parser, is_secret_name, mask_url_password
from recipe.user_overrides import merge_user_overrides
from recipe.verl_types import select_key, type_problems, value_kind

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
    # lazy: hydra is heavy or absent where this module is imported; loaded only here
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return compose(config_name="ppo_trainer", overrides=list(overrides))


@dataclass(frozen=True)
class VerlConfigCheck:
    """What composing and resolving verl's config with the final overrides found."""

    problems: list[str]
    #: Every variable oc.env read while the config was resolved (secrets are problems instead), and
    #: its value now (None: unset): a name assembled by other interpolations included.
    environment_reads: dict[str, str | None] = field(default_factory=dict)
    #: Keys whose last word ends in `path`, that no setting decides, resolved to a regular file (a
    #: reward function's, a reward manager's, a dataset class's code): their content is part of the math.
    referenced_files: dict[str, str] = field(default_factory=dict)


@contextmanager
def _secret_reads_marked(seen: set[str], reads: dict[str, str | None]) -> Iterator[None]:
    """While inside: oc.env returns a marker for a secret-named variable (recorded in `seen`), the real value otherwise.

    The marker, not the name, is what is looked for afterwards: a name computed by another
    interpolation, or an interpolation assembled from pieces, is caught as well. Every other
    variable read goes into `reads` with its value now, whatever way its name was written.
    """
    # lazy: omegaconf is heavy or absent where this module is imported; loaded only here
    from omegaconf import OmegaConf
    # lazy: omegaconf is heavy or absent where this module is imported; loaded only here
    from omegaconf.basecontainer import BaseContainer
    # lazy: omegaconf is heavy or absent where this module is imported; loaded only here
    from omegaconf.resolvers import oc

    def marked(key: Any, *default: Any) -> Any:
        if is_secret_name(str(key)):
            seen.add(str(key))
            return f"{_CANARY}{key}>>"
        reads[str(key)] = mask_url_password(os.environ.get(str(key)))  # the record keeps no password
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


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def _compose_problem(overrides: Sequence[str], config_dir: Path) -> str | None:
    try:
        compose_verl_config(overrides, config_dir)
    except Exception as error:  # Hydra's ConfigCompositionException, OmegaConf's errors, ValueError ...
        return "; ".join(line.strip() for line in str(error).splitlines() if line.strip())[:400] or type(error).__name__
    return None


def _recipe_config(recipe: Sequence[Override], config_dir: Path) -> Callable[[], Any]:
    """verl's config as the recipe's own overrides compose it (a container, unresolved), composed on first use."""
    composed: list[Any] = []

    def config() -> Any:
        # lazy: omegaconf is heavy or absent where this module is imported; loaded only here
        from omegaconf import OmegaConf

        if not composed:
            composed.append(OmegaConf.to_container(compose_verl_config([str(o) for o in recipe], config_dir), resolve=False))
        return composed[0]

    return config


def key_kinds(recipe: Sequence[Override]) -> Callable[[str], str | None] | None:
    """What verl reads each key as (recipe.verl_types.value_kind) under the recipe's overrides; None without
    verl's config. Composes verl's config once, on the first key asked about."""
    config_dir = verl_config_dir()
    if config_dir is None or hydra_override_parser() is None:
        return None
    recipe_config = _recipe_config(recipe, config_dir)
    return lambda key: value_kind(recipe_config(), key, config_dir)


def _regular_file(value: Any) -> bool:
    try:
        return isinstance(value, str) and bool(value) and stat.S_ISREG(os.stat(value).st_mode)
    except (OSError, ValueError):
        return False


def check_verl_config(recipe: Sequence[Override], overrides: Sequence[str], extra: Sequence[str]) -> VerlConfigCheck:
    """Compose verl's own config with the final overrides, check what verl would read, and say what it reads.

    - Hydra composes it (unknown keys, wrong case, sweeps ... are refused as Hydra refuses them);
    - resolved the way verl resolves it, no value holds a secret read through oc.env;
    - every key a setting decides still has the recipe's value (a group or package swap cannot
      change it behind the plan's back), and no allocator variable reaches the workers but ours;
    - trainer.resume_mode is a mode verl knows, written literally (the resume guard reads it).
    What it reads besides the config: the environment variables resolved through oc.env, and the
    files that keys ending in `path` name (VerlConfigCheck). Needs Hydra and verl's config files;
    imports neither verl nor torch.
    """
    config_dir = verl_config_dir()
    if config_dir is None or hydra_override_parser() is None:
        return VerlConfigCheck([
            f"your overrides ({len(extra)}): need verl's trainer config (pip install '.[trainer]', or the image) "
            "to be checked the way the trainer reads them; run `plan` in the image (docker compose run --rm gpu plan -- ...)"
        ])
    # lazy: omegaconf is heavy or absent where this module is imported; loaded only here
    from omegaconf import OmegaConf

    base = [str(o) for o in recipe]  # a key one slip from one verl has is refused naming it (recipe.config_typos):
    recipe_config = _recipe_config(recipe, config_dir)

    def typos_found() -> dict[str, str]:  # an added key composes silently; a changed one fails (composed only then)
        return typo_problems(extra, recipe_config(), hydra_override_parser())

    typos = typos_found() if any(text.startswith("+") for text in extra) else {}
    try:
        config = compose_verl_config(overrides, config_dir)
    except Exception:  # Hydra's ConfigCompositionException, OmegaConf's errors, ValueError ...
        # Hydra stops at the first bad override: find each one that fails on its own.
        problems, rest, typos = [], [], typos or typos_found()
        for text in extra:
            alone = merge_user_overrides(recipe, [text])
            problem = _compose_problem(alone, config_dir) if alone != base else None
            if text in typos:
                problems.append(typos[text])
            elif problem:
                problems.append(f"override {text!r}: verl's config rejects it ({problem})")
            else:
                rest.append(text)
        if not problems:
            together = _compose_problem(overrides, config_dir)
            return VerlConfigCheck([f"your overrides: verl's config rejects them together ({together})"])
        # Every problem at once: the others are checked without the ones verl's config rejects.
        others = check_verl_config(recipe, merge_user_overrides(recipe, rest), rest).problems if rest else []
        return VerlConfigCheck(problems + others)

    problems: list[str] = list(typos.values())
    problems += type_problems(recipe_config(), OmegaConf.to_container(config, resolve=False), extra, config_dir)
    trainer = config.get("trainer")
    mode = OmegaConf.to_container(trainer, resolve=False).get("resume_mode") if trainer is not None else None
    problem = resume_mode_problem(mode)
    if problem:
        problems.append(problem)

    seen: set[str] = set()
    reads: dict[str, str | None] = {}
    with _secret_reads_marked(seen, reads):
        try:
            for _ in range(_RESOLUTIONS):
                OmegaConf.resolve(config)
                if not any(isinstance(v, str) and "${" in v for _, v in _leaves(OmegaConf.to_container(config))):
                    break
            resolved = OmegaConf.to_container(config, resolve=True)
        except Exception as error:
            why = _first_line(error)[:300]
            return VerlConfigCheck([*problems, f"your overrides: verl's config cannot be resolved with them ({why})"])
    decided = decided_keys(recipe)
    files: dict[str, str] = {}
    for path, value in _leaves(resolved):
        if path.rsplit(".", 1)[-1].endswith("path") and path not in decided and _regular_file(value):
            files[path] = value
        if isinstance(value, str) and _CANARY in value:
            names = ", ".join(sorted(seen))
            problems.append(
                f"your overrides: {path} would hold the secret {names} (read through oc.env); a secret reaches "
                "verl only through the environment, never its config (which verl prints and logs)"
            )
        elif isinstance(value, str) and "${" in value:
            problems.append(
                f"your overrides: {path} still holds an interpolation after {_RESOLUTIONS} resolutions "
                f"({value[:80]!r}); verl would resolve it again when it reads it"
            )

    parser = hydra_override_parser()
    for override in recipe:
        if override.setting is None:
            continue
        expected = parser.parse_override(str(override)).value()
        found, value = select_key(resolved, override.key)
        if not found or not _same(value, expected):
            problems.append(
                f"your overrides: change {override.key} (now {value!r}, planned {expected!r}), "
                f"which {override.setting} decides; set that instead"
            )
    env_vars = select_key(resolved, _RAY_ENV.rstrip("."))[1] or {}
    planned = {o.key.removeprefix(_RAY_ENV): o for o in recipe if o.key.startswith(_RAY_ENV)}
    for variable in ALLOC_CONF_VARIABLES:
        want = parser.parse_override(str(planned[variable])).value() if variable in planned else None
        have = env_vars.get(variable) if isinstance(env_vars, dict) else None
        if have != want:
            problems.append(
                f"your overrides: put {variable}={have!r} into the Ray workers' environment (planned "
                f"{want!r}), which {decided[_RAY_ENV + variable]} decides"
            )
    return VerlConfigCheck(problems, dict(sorted(reads.items())), files)
