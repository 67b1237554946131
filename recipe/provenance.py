"""What a run is made of (the provenance record), stored with its checkpoints, and the drift guard.

`plan --json` shows the record under "provenance"; `run` writes it (with a start time beside
it, outside the record) to <checkpoint root>/run-record.json and copies it into each
global_step_N it saves. When verl would resume and a stored record exists, the record of now
is compared with it: drift in the data, the model's config or tokenizer, the recipe or
framework versions, or the training settings is refused (exit 2), unless ALLOW_DRIFT names it.

The record is deterministic for unchanged inputs: no time, no host, sorted keys. Files are
hashed whole (sha256; about 1.3 s per GB here, see benchmarks/provenance_hashing.py) and the
data files' hashes kept while their size and mtime stay the same; the model's weights are
never hashed: its safetensors index stands for them.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from recipe import __version__
from recipe.settings import REDACTED

RECORD_NAME = "run-record.json"
SCHEMA_VERSION = 1
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
})  # fmt: skip
#: Fields ALLOW_DRIFT may name besides settings and Hydra keys.
FIELD_RECIPE, FIELD_FRAMEWORKS, FIELD_IMAGE = "RECIPE", "FRAMEWORKS", "IMAGE"
CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    """The sha256 of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def parquet_rows(path: Path) -> int | None:
    """Rows of a parquet file from its footer; None when pyarrow is absent or cannot read it."""
    try:
        import pyarrow.parquet as pq

        return int(pq.read_metadata(path).num_rows)
    except Exception:  # noqa: BLE001 - a record is still made; the hash says what the file is
        return None


def hash_cache_path(environ: Mapping[str, str]) -> Path:
    """Where known file hashes are kept: $XDG_CACHE_HOME (or ~/.cache)/grpo-recipe/sha256.json."""
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "grpo-recipe" / "sha256.json"


def cached_digest(path: Path, environ: Mapping[str, str]) -> tuple[str, int | None]:
    """(sha256, parquet rows) of a file, reused while its (path, size, mtime, inode) stay the same.

    Hashing costs about 1.3 s per GB here and counting rows imports pyarrow; `plan` runs
    often (benchmarks/provenance_hashing.py). The cache is best effort: unreadable, hostile or
    unwritable, it is ignored.
    """
    info = path.stat()
    resolved = str(path.resolve())
    key = f"{resolved}|{info.st_size}|{info.st_mtime_ns}|{info.st_ino}"
    cache_file = hash_cache_path(environ)
    try:
        cache = json.loads(cache_file.read_text(encoding="utf-8")) if cache_file.stat().st_size < (4 << 20) else {}
    except (OSError, ValueError):
        cache = {}
    if not isinstance(cache, dict):
        cache = {}
    known = cache.get(key)
    if (
        isinstance(known, dict)
        and isinstance(known.get("sha256"), str)
        and len(known["sha256"]) == 64
        and (known.get("rows") is None or type(known.get("rows")) is int)
    ):
        return known["sha256"], known.get("rows")
    digest, rows = sha256_file(path), parquet_rows(path)
    cache = {k: v for k, v in cache.items() if not k.startswith(f"{resolved}|")} | {key: {"sha256": digest, "rows": rows}}
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        handle, temp = tempfile.mkstemp(dir=cache_file.parent, prefix=".sha256.")
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(cache, out)
        os.replace(temp, cache_file)
    except OSError:
        pass
    return digest, rows


def data_file(path: Path, environ: Mapping[str, str]) -> dict[str, Any] | None:
    """path, size, rows and sha256 of a data file; None when it is not a readable regular file."""
    try:
        if not path.is_file():
            return None
        digest, rows = cached_digest(path, environ)
        return {"path": str(path), "size": path.stat().st_size, "rows": rows, "sha256": digest}
    except OSError:
        return None


def model_files(model_dir: Path) -> dict[str, str]:
    """sha256 of each of MODEL_FILES the model directory holds (name -> digest)."""
    found = {}
    for name in MODEL_FILES:
        path = model_dir / name
        try:
            if path.is_file():
                found[name] = sha256_file(path)
        except OSError:
            continue
    return found


def installed_versions() -> dict[str, str | None]:
    """Version of each of FRAMEWORKS, from package metadata (nothing imported)."""
    versions: dict[str, str | None] = {}
    for name in FRAMEWORKS:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def image_facts(environ: Mapping[str, str]) -> dict[str, Any]:
    """The image's labels and the sha256 of its locks (doctor's files); labels null outside an image."""
    from recipe.doctor.facts import image_info_dir, lock_digests, read_labels

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


def build_record(
    *,
    settings_shown: Mapping[str, Any],
    setting_keys: Mapping[str, str],
    layout: Mapping[str, Any],
    overrides: Sequence[str],
    extra_overrides: Sequence[str] = (),
    model_dir: Path,
    train_files: Path,
    val_files: Path,
    environ: Mapping[str, str],
) -> dict[str, Any]:
    """The provenance record of a plan (see the module's docstring); deterministic for unchanged inputs.

    `setting_keys` maps a Hydra key to the setting that decided it, so that drift is named by the
    setting a user changes (TP, not actor_rollout_ref.actor.megatron.tensor_model_parallel_size).
    """
    secret_free = {k: v for k, v in settings_shown.items() if v != REDACTED}
    return {
        "schema_version": SCHEMA_VERSION,
        "recipe_version": __version__,
        "frameworks": installed_versions(),
        "image": image_facts(environ),
        "model": {"path": str(model_dir), "files": model_files(model_dir)},
        "data": {"TRAIN_FILES": data_file(train_files, environ), "VAL_FILES": data_file(val_files, environ)},
        "layout": dict(layout),
        "training": training_overrides(overrides),
        "extra_overrides": list(extra_overrides),
        "setting_keys": dict(sorted(setting_keys.items())),
        "settings": secret_free,
    }


# --- drift --------------------------------------------------------------------------------


def _short(value: Any) -> str:
    if value is None:
        return "(absent)"
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else value
    if len(text) == 64 and all(c in "0123456789abcdef" for c in text):
        return text[:12]
    return text if len(text) <= 80 else text[:77] + "..."


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
    old_model, new_model = (stored.get("model") or {}).get("files"), (now.get("model") or {}).get("files")
    if old_model != new_model:
        names = sorted(n for n in set(old_model or {}) | set(new_model or {}) if (old_model or {}).get(n) != (new_model or {}).get(n))
        found["MODEL_PATH"] = (
            ", ".join(f"{n} {_short((old_model or {}).get(n))}" for n in names),
            ", ".join(f"{n} {_short((new_model or {}).get(n))}" for n in names),
        )
    for name in ("TRAIN_FILES", "VAL_FILES"):
        old = ((stored.get("data") or {}).get(name) or {}).get("sha256")
        new = ((now.get("data") or {}).get(name) or {}).get("sha256")
        if old != new:
            found[name] = (_short(old), _short(new))
    if stored.get("layout") != now.get("layout"):
        old_l, new_l = stored.get("layout") or {}, now.get("layout") or {}
        for key in sorted(set(old_l) | set(new_l)):
            if old_l.get(key) != new_l.get(key):
                found[key.upper()] = (_short(old_l.get(key)), _short(new_l.get(key)))
    old_t, new_t = stored.get("training") or {}, now.get("training") or {}
    names = {**(stored.get("setting_keys") or {}), **(now.get("setting_keys") or {})}
    for key in sorted(set(old_t) | set(new_t)):
        if old_t.get(key) != new_t.get(key):
            field = names.get(key, key)
            if field not in found:
                found[field] = (_short(old_t.get(key, "(unset)")), _short(new_t.get(key, "(unset)")))
    return found


def drift_problems(
    stored: Mapping[str, Any], now: Mapping[str, Any], allowed: Sequence[str], record_path: Path
) -> tuple[list[str], list[str]]:
    """(refusals, accepted notes): one line per drifted field, each naming it, then and now."""
    refused, accepted = [], []
    for field, (then, current) in drift(stored, now).items():
        line = f"{field}: {then} when the checkpoint's run started ({record_path}), {current} now"
        if field in allowed:
            accepted.append(f"{line} (accepted: ALLOW_DRIFT)")
        else:
            refused.append(
                f"{line}; resuming would mix two runs: restore it, start afresh with "
                f"`-- trainer.resume_mode=disable` (or another CHECKPOINT_DIR), or accept it with ALLOW_DRIFT={field}"
            )
    return refused, accepted


def read_record(path: Path) -> dict[str, Any] | None:
    """A stored run record's provenance; None when there is none. Raises ValueError when it is unusable."""
    if not path.exists():
        return None
    if not path.is_file() or path.stat().st_size > 16 << 20:
        raise ValueError(f"{path}: not a run record (not a regular file of at most 16 MiB)")
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not a run record ({type(error).__name__})") from None
    record = document.get("provenance") if isinstance(document, dict) else None
    if not isinstance(record, dict) or record.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(f"{path}: not a run record of schema {SCHEMA_VERSION}")
    return record


def write_record(root: Path, record: Mapping[str, Any], started: datetime | None = None) -> Path:
    """Write <root>/run-record.json atomically (a temp file renamed): the record and its start time."""
    root.mkdir(parents=True, exist_ok=True)
    document = {"provenance": record, "started_at": (started or datetime.now(timezone.utc)).isoformat()}
    target = root / RECORD_NAME
    handle, temp = tempfile.mkstemp(prefix=f".{RECORD_NAME}.", dir=root)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(document, out, indent=2, sort_keys=True)
            out.write("\n")
        os.replace(temp, target)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return target


def copy_into_new_steps(root: Path, existing: set[str], record_path: Path) -> list[Path]:
    """Copy the run record into each global_step_N under root that was not there when the run started."""
    copied = []
    for step in sorted(root.glob("global_step_*")):
        target = step / RECORD_NAME
        if step.name in existing or not step.is_dir() or target.exists():
            continue
        try:
            target.write_bytes(record_path.read_bytes())
            copied.append(target)
        except OSError:
            continue  # the step is being deleted (verl's max_ckpt_to_keep) or not writable: the next sweep sees it
    return copied
