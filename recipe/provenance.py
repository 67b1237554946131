"""What a run is made of (the provenance record), stored with its checkpoints, and the drift guard.

`plan --json` shows the record under "provenance"; `run` writes it (with a start time beside
it, outside the record) to <checkpoint root>/run-record.json and copies it into each
global_step_N it saves. When verl would resume and a stored record exists, the record of now
is compared with it: drift in the data, the model's config or tokenizer, the recipe or
framework versions, or the training settings is refused (exit 2), unless ALLOW_DRIFT names it.

The record is deterministic for unchanged inputs: no time, no host, sorted keys. Files are
hashed whole within a bound, and the data files' hashes cached (recipe.digests); the model's
weights are never hashed: its safetensors index stands for them. The stored file itself (its
schema, reading it as input, writing it) is recipe.record_file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from recipe import __version__
from recipe.digests import MAX_MODEL_FILE_BYTES, FileRefused, cached_digest, sha256_file
from recipe.errors import RecipeConfigError
from recipe.export.report import printable
from recipe.hydra_text import override_hint
from recipe.image_facts import distribution_version, image_info_dir, lock_digests, read_labels
from recipe.record_file import SCHEMA_VERSION
from recipe.settings import REDACTED

#: Distributions whose installed versions the record holds (null when absent).
FRAMEWORKS = (
    "verl", "torch", "torch-npu", "vllm", "vllm-ascend", "megatron-core", "megatron-bridge", "transformers", "ray",
)  # fmt: skip
#: The model's files that decide its math and its text, besides the weights (the index stands for those).
MODEL_FILES = (
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
    "special_tokens_map.json", "added_tokens.json", "chat_template.jinja", "chat_template.json",
    "preprocessor_config.json", "video_preprocessor_config.json", "processor_config.json",
    "model.safetensors.index.json",
)  # fmt: skip
#: Hydra keys that cannot change the math: where files live (their content is compared instead),
#: how often to save and validate, what to log, whether to resume.
NOT_TRAINING = frozenset({
    "data.train_files", "data.val_files", "actor_rollout_ref.model.path", "trainer.default_local_dir",
    "trainer.logger", "trainer.project_name", "trainer.experiment_name", "trainer.save_freq", "trainer.test_freq",
    "trainer.val_before_train", "trainer.resume_mode", "trainer.resume_from_path",
    # Where the workers write their logs, under the checkpoint folder: moving that folder is no drift.
    "ray_kwargs.ray_init.runtime_env.env_vars.TENSORBOARD_DIR",
    "ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH",
})  # fmt: skip
#: Fields ALLOW_DRIFT may name besides settings and Hydra keys.
FIELD_RECIPE, FIELD_FRAMEWORKS, FIELD_IMAGE = "RECIPE", "FRAMEWORKS", "IMAGE"
DRIFT_FIELDS = (FIELD_RECIPE, FIELD_FRAMEWORKS, FIELD_IMAGE)


def data_file(path: Path, environ: Mapping[str, str]) -> dict[str, Any] | None:
    """path, size, rows and sha256 of a data file; None when it is not a readable regular file.

    Raises FileRefused when it is above digests.MAX_DATA_BYTES.
    """
    try:
        if not path.is_file():
            return None
        digest, rows = cached_digest(path, environ)
        return {"path": str(path), "size": path.stat().st_size, "rows": rows, "sha256": digest}
    except FileRefused:
        if path.is_file():
            raise
        return None  # replaced by something else while it was looked at
    except OSError:
        return None


def model_files(model_dir: Path) -> dict[str, str]:
    """sha256 of each of MODEL_FILES the model directory holds (name -> digest).

    FileRefused above 1 GiB, and for a name that is there but no regular file (a FIFO, a device,
    a folder, a link to nothing): the trainer would read it, so it is refused, never left out.
    """
    found = {}
    for name in MODEL_FILES:
        path = model_dir / name
        if not os.path.lexists(path):
            continue
        try:
            found[name] = sha256_file(path, MAX_MODEL_FILE_BYTES)
        except FileNotFoundError:
            raise FileRefused(f"{path}: a link to nothing") from None
        except FileRefused:
            raise
        except OSError as error:
            raise FileRefused(f"{path}: cannot be read ({error.strerror or type(error).__name__})") from None
    return found


def installed_versions() -> dict[str, str | None]:
    """Version of each of FRAMEWORKS, from package metadata (nothing imported)."""
    return {name: distribution_version(name) for name in FRAMEWORKS}


def image_facts(environ: Mapping[str, str]) -> dict[str, Any]:
    """The image's labels and the sha256 of its locks (recipe.image_facts); labels null outside an image."""
    directory = image_info_dir(environ)
    labels = read_labels(directory)
    return {"labels": labels[0] if labels else None, "locks": lock_digests(directory)}


def split_override(text: str) -> tuple[str, str]:
    """`+key=value` -> (key, value), the Hydra prefix (+, ++, ~) dropped."""
    key, _, value = text.partition("=")
    return key.lstrip("+~"), value


def training_overrides(overrides: Sequence[str]) -> dict[str, str]:
    """The Hydra overrides that shape training (NOT_TRAINING dropped), key -> value as passed."""
    return {key: value for key, value in map(split_override, overrides) if key not in NOT_TRAINING}


def referenced_file(path: str) -> dict[str, Any]:
    """A file the config names (a reward function's code, ...) and its sha256 (null when it is not a regular file); FileRefused above 1 GiB."""
    try:
        digest: str | None = sha256_file(Path(path), MAX_MODEL_FILE_BYTES)
    except FileRefused:
        if Path(path).is_file():
            raise
        digest = None
    except OSError:
        digest = None
    return {"path": path, "sha256": digest}


def build_record(
    *,
    settings_shown: Mapping[str, Any],
    setting_keys: Mapping[str, str],
    layout: Mapping[str, Any],
    overrides: Sequence[str],
    extra_overrides: Sequence[str] = (),
    environment_reads: Mapping[str, str | None] = {},  # noqa: B006 - read only
    referenced_files: Mapping[str, str] = {},  # noqa: B006 - read only
    model_dir: Path,
    train_files: Path,
    val_files: Path,
    environ: Mapping[str, str],
) -> dict[str, Any]:
    """The provenance record of a plan (see the module's docstring); deterministic for unchanged inputs.

    `setting_keys` maps a Hydra key to the setting that decided it, so that drift is named by the
    setting a user changes (TP, not actor_rollout_ref.actor.megatron.tensor_model_parallel_size).
    `environment_reads` are the variables the config reads with oc.env and their values now
    (no secret: those reads are refused), so that changing one is drift. `referenced_files` are
    the files config keys name (key -> path: the custom reward function's, REWARD_FUNCTION_KEY,
    and any other `...path` key's), hashed too. A file above its hashing bound is
    RecipeConfigError naming the variable or key that named it.
    """
    problems: list[str] = []

    def bounded(name: str, shown: object, compute: Any) -> Any:
        try:
            return compute()
        except FileRefused as error:
            problems.append(f"{name}={str(shown)!r}: {error}; a run record hashes it (the bounds: docs/reproducibility.md)")
            return None

    secret_free = {k: v for k, v in settings_shown.items() if v != REDACTED}
    record = {
        "schema_version": SCHEMA_VERSION,
        "recipe_version": __version__,
        "frameworks": installed_versions(),
        "image": image_facts(environ),
        "model": {"path": str(model_dir), "files": bounded("MODEL_PATH", model_dir, lambda: model_files(model_dir))},
        "data": {
            "TRAIN_FILES": bounded("TRAIN_FILES", train_files, lambda: data_file(train_files, environ)),
            "VAL_FILES": bounded("VAL_FILES", val_files, lambda: data_file(val_files, environ)),
        },
        "layout": dict(layout),
        "training": training_overrides(overrides),
        "environment_reads": dict(sorted(environment_reads.items())),
        "referenced_files": {
            key: bounded(key, path, lambda path=path: referenced_file(path)) for key, path in sorted(referenced_files.items())
        },
        "extra_overrides": list(extra_overrides),
        "setting_keys": dict(sorted(setting_keys.items())),
        "settings": secret_free,
    }
    if problems:
        raise RecipeConfigError(problems)
    return record


# --- drift --------------------------------------------------------------------------------


def shown_name(name: str) -> str:
    """A record's key as a line shows it: printable, a blank one quoted (`""`), never nothing; at most 80 characters."""
    if not name.strip():
        return json.dumps(name)
    return _short(name)


def _short(value: Any) -> str:
    """One printable line for a value of a record (which may be hostile): hashes cut to 12, the rest to 80."""
    if value is None:
        return "(absent)"
    if isinstance(value, str) and not value.strip():
        return json.dumps(value)  # "" or " ": visibly empty, never a blank in the line
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else value
    if len(text) == 64 and all(c in "0123456789abcdef" for c in text):
        return text[:12]
    return printable(text if len(text) <= 80 else text[:77] + "...")


#: Layout values that follow from the settings (WORLD_SIZE = NNODES x NDEVICES_PER_NODE, DP = WORLD_SIZE / (TP x PP x
#: CP)): no user sets them, so their change is said beside the settings' that caused it, never as a field of its own.
DERIVED_LAYOUT = ("world_size", "dp")


def _layout_drift(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    """The layout settings that changed, field -> (then, now); derived values that changed ride on the first one."""
    changed = sorted(key for key in set(old) | set(new) if old.get(key) != new.get(key))
    settings = [key for key in changed if key not in DERIVED_LAYOUT]
    derived = [key for key in changed if key in DERIVED_LAYOUT]
    if not settings:  # derived values moved alone: a record whose own arithmetic is off, said as it is
        return {shown_name(key.upper()): (_short(old.get(key)), _short(new.get(key))) for key in derived}
    found = {shown_name(key.upper()): (_short(old.get(key)), _short(new.get(key))) for key in settings}
    if derived:
        first = shown_name(settings[0].upper())
        then, now = found[first]
        so = ", ".join(f"{key.upper()} {_short(old.get(key))} then, {_short(new.get(key))} now" for key in derived)
        found[first] = (then, f"{now} (so {so})")
    return found


def drift(stored: Mapping[str, Any], now: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    """Fields that differ in what decides the math: field -> (then, now), shortened for one line each."""
    found: dict[str, tuple[str, str]] = {}
    if stored.get("recipe_version") != now.get("recipe_version"):
        found[FIELD_RECIPE] = (_short(stored.get("recipe_version")), _short(now.get("recipe_version")))
    old_fw, new_fw = stored.get("frameworks") or {}, now.get("frameworks") or {}
    changed = sorted(n for n in set(old_fw) | set(new_fw) if old_fw.get(n) != new_fw.get(n))
    if changed:
        found[FIELD_FRAMEWORKS] = (
            ", ".join(f"{n} {old_fw.get(n)}" for n in changed),
            ", ".join(f"{n} {new_fw.get(n)}" for n in changed),
        )
    old_locks = (stored.get("image") or {}).get("locks") or {}
    new_locks = (now.get("image") or {}).get("locks") or {}
    if old_locks != new_locks:
        found[FIELD_IMAGE] = (_short(sorted(old_locks.values())), _short(sorted(new_locks.values())))
    old_model = (stored.get("model") or {}).get("files") or {}
    new_model = (now.get("model") or {}).get("files") or {}
    names = sorted(n for n in set(old_model) | set(new_model) if old_model.get(n) != new_model.get(n))
    if names:
        found["MODEL_PATH"] = (
            ", ".join(f"{shown_name(n)} {_short(old_model.get(n))}" for n in names),
            ", ".join(f"{shown_name(n)} {_short(new_model.get(n))}" for n in names),
        )
    for name in ("TRAIN_FILES", "VAL_FILES"):
        old = ((stored.get("data") or {}).get(name) or {}).get("sha256")
        new = ((now.get("data") or {}).get(name) or {}).get("sha256")
        if old != new:
            found[name] = (_short(old), _short(new))
    found.update(_layout_drift(stored.get("layout") or {}, now.get("layout") or {}))
    old_env, new_env = stored.get("environment_reads") or {}, now.get("environment_reads") or {}
    for name in sorted(set(old_env) | set(new_env)):
        if old_env.get(name, "(unset)") != new_env.get(name, "(unset)"):
            found[shown_name(name)] = (_short(old_env.get(name, "(unset)")), _short(new_env.get(name, "(unset)")))
    old_files, new_files = stored.get("referenced_files") or {}, now.get("referenced_files") or {}
    for key in sorted(set(old_files) | set(new_files)):
        old_digest, new_digest = (old_files.get(key) or {}).get("sha256"), (new_files.get(key) or {}).get("sha256")
        if old_digest != new_digest:
            found[shown_name(key)] = (_short(old_digest), _short(new_digest))
    old_t, new_t = stored.get("training") or {}, now.get("training") or {}
    names = {**(stored.get("setting_keys") or {}), **(now.get("setting_keys") or {})}
    for key in sorted(set(old_t) | set(new_t)):
        if old_t.get(key) != new_t.get(key):
            field = shown_name(str(names.get(key, key)))
            if field not in found:
                found[field] = (_short(old_t.get(key, "(unset)")), _short(new_t.get(key, "(unset)")))
    return found


def drift_problems(
    stored: Mapping[str, Any] | Sequence[tuple[Mapping[str, Any], Path]],
    now: Mapping[str, Any],
    allowed: Sequence[str],
    record_path: Path | None = None,
) -> tuple[list[str], list[str]]:
    """(refusals, accepted notes): one line per drifted field, each naming it, then and now.

    `stored` is one record read from `record_path`, or several (record, path) pairs: a field that
    drifted in more than one is said once, from the first that has it.
    """
    records = [(stored, record_path)] if isinstance(stored, Mapping) else list(stored)
    drifted: dict[str, tuple[str, str, Path | None]] = {}
    for record, path in records:
        for field, (then, current) in drift(record, now).items():
            drifted.setdefault(field, (then, current, path))
    refused, accepted = [], []
    for field, (then, current, path) in drifted.items():
        line = f"{field}: {then} when the checkpoint's run started ({path}), {current} now"
        if field in allowed:
            accepted.append(f"{line} (accepted: ALLOW_DRIFT)")
        else:
            refused.append(
                f"{line}; resuming would mix two runs: restore it, start afresh with "
                f"{override_hint('trainer.resume_mode=disable')} or another CHECKPOINT_DIR, or accept it with "
                f"ALLOW_DRIFT={field}"
            )
    return refused, accepted
