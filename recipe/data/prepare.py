"""Prepare one dataset: load it, convert every split to verl's format, write the parquet files.

Every split is converted (and every row checked) before anything is written: a refused source
leaves no file and no folder behind. Both files are then staged and put in place together at
the end, so an interrupted run leaves the previous files (or none) and never a half-written
one. Running it again rewrites the same bytes for the same source.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from recipe.atomic import AtomicFileSet, remove_stale_temps
from recipe.data.errors import DataPreparationError, RowError, SourceDataError
from recipe.data.guard import (
    DEFAULT_MAX_IMAGE_BYTES,
    ImagePolicy,
    printable,
    shown,
    summarise,
)
from recipe.data.prompt_lengths import PromptLengths
from recipe.data.source import describe_exception, load_source
from recipe.data.specs import SPECS, SPLITS, DatasetName, DatasetSpec, output_features
from recipe.digests import MAX_DATA_BYTES, FileRefused, sha256_file
from recipe.errors import RecipeConfigError

if TYPE_CHECKING:
    import datasets


@dataclass(frozen=True)
class PreparedFile:
    """One parquet file that was written."""

    split: str
    path: Path
    rows: int
    bytes: int


#: What PreparedData and the manifest say of the prompt lengths when no model was given to count them with.
NOT_COUNTED = "not counted: no model given"


@dataclass(frozen=True)
class PreparedData:
    """What `prepare_dataset` wrote."""

    dataset: DatasetName
    data_source: str
    out_dir: Path
    files: tuple[PreparedFile, ...]
    #: Each split's prompt lengths in tokens, text and images (recipe.data.prompt_lengths), or why not counted.
    prompt_lengths: dict[str, PromptLengths] | str = NOT_COUNTED

    def path(self, split: str) -> Path:
        """The parquet file of `split` (train or test)."""
        for written in self.files:
            if written.split == split:
                return written.path
        raise KeyError(split)

    def summary(self) -> list[str]:
        """One line per file (`wrote PATH: N rows, M bytes`), then each split's prompt lengths, or why none."""
        lines = [f"wrote {f.path}: {f.rows} rows, {f.bytes} bytes" for f in self.files]
        if isinstance(self.prompt_lengths, str):
            return [*lines, f"prompt lengths: {self.prompt_lengths}"]
        return [*lines, *(f"prompt lengths ({split}): {lengths.describe()}" for split, lengths in self.prompt_lengths.items())]


def count_prompt_lengths(
    converted: Mapping[str, Iterable[Mapping[str, Any]]], model_dir: Path | None
) -> dict[str, PromptLengths] | str:
    """Each split's prompt lengths counted with the model's processor, or why they are not counted (never raises:
    the files are what prepare-data is for; the count is advice)."""
    if model_dir is None:
        return NOT_COUNTED
    if not (model_dir / "config.json").is_file():
        return f"not counted: no model at MODEL_PATH={model_dir} (image tokens depend on the model's processor)"
    from recipe.data.prompt_lengths import PromptCounter  # lazy: transformers and verl, only when counting

    try:
        counter = PromptCounter(model_dir)
        return {split: PromptLengths.of(counter.count(row) for row in rows) for split, rows in converted.items()}
    except Exception as error:  # noqa: BLE001  a processor that cannot load is said, never a failed preparation
        return f"not counted with {model_dir}'s processor ({describe_exception(error)})"


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def get_spec(name: str) -> DatasetSpec:
    """The spec of dataset `name`; RecipeConfigError naming the choices otherwise."""
    try:
        return SPECS[name]
    except KeyError:
        raise RecipeConfigError([f"dataset={name!r}: must be one of {', '.join(SPECS)}"]) from None


def _undecoded_images(spec: DatasetSpec, split: str, raw: datasets.Dataset) -> datasets.Dataset:
    """Cast the images column so rows carry encoded bytes: no decode and re-encode of every image."""
    # lazy: datasets is heavy or absent where this module is imported; loaded only here
    from datasets import Image, List, Sequence

    features = raw.features.copy()
    feature = features["images"]
    if isinstance(feature, Image):
        features["images"] = Image(decode=False)
    elif isinstance(feature, List | Sequence) and isinstance(feature.feature, Image):
        features["images"] = List(Image(decode=False))
    else:
        raise SourceDataError(
            [f"{spec.name} split {split!r}: column images is {shown(feature, 160)}; expected a list of datasets Image"]
        )
    # In memory: `cast` would otherwise write a cache file into the source's folder.
    return raw.cast(features, keep_in_memory=True)


def _refused_row(spec: DatasetSpec) -> dict[str, Any]:
    """A row of the output schema standing in for a refused one (the split is discarded anyway)."""
    row: dict[str, Any] = {"data_source": "", "prompt": []}
    if spec.has_images:
        row["images"] = []
    return row | {
        "ability": "",
        "reward_model": {"style": "", "ground_truth": ""},
        "extra_info": {"split": "", "index": -1, "answer": "", "question": ""},
    }


def convert_split(
    spec: DatasetSpec, raw: datasets.Dataset, split: str, images: ImagePolicy | None = None
) -> tuple[datasets.Dataset, list[str]]:
    """Convert one raw split to verl's columns, in memory (the source may be read-only).

    Returns the converted split and one line per refused row (`<dataset> <split> row <i>:
    <column> <rule>`); a split with refused rows must not be written.
    """
    images = images or ImagePolicy()
    raw = raw.select_columns(list(spec.columns))
    if spec.has_images:
        raw = _undecoded_images(spec, split, raw)
    refused: list[str] = []
    placeholder = _refused_row(spec)

    def convert(example: dict[str, Any], index: int) -> dict[str, Any]:
        try:
            return spec.convert(example, index, split, images)
        except RowError as exc:
            refused.append(f"{spec.name} {split} row {index}: {exc}")
            return placeholder

    converted = raw.map(
        convert,
        with_indices=True,
        remove_columns=list(spec.columns),
        features=output_features(spec),
        keep_in_memory=True,
        # An explicit fingerprint: nothing is cached, and `datasets` need not hash the closure.
        new_fingerprint=f"recipe-{spec.name}-{split}-{raw._fingerprint}",
        desc=f"{spec.name} {split}: converting",
    )
    return converted, refused


def _parquet_writer(dataset: datasets.Dataset, batch_size: int | None) -> Callable[[BinaryIO], object]:
    """A writer for AtomicFileSet.stage: `dataset` as parquet, with the `datasets` feature metadata."""

    def write(handle: BinaryIO) -> object:
        return dataset.to_parquet(handle, batch_size=batch_size)

    return write


def _check_written(path: Path, rows: int) -> None:
    """Read the staged file's footer back: a truncated or wrong file never gets committed."""
    import pyarrow.parquet as pq  # lazy: pyarrow is heavy or absent where this module is imported; loaded only here

    written = pq.read_metadata(path).num_rows
    if written != rows:
        raise DataPreparationError(f"{path}: wrote {written} rows, expected {rows}")


#: Written beside the parquet files: where they came from (the source's revision) and their hashes.
MANIFEST_NAME = "manifest.json"


def _manifest_bytes(manifest: dict[str, Any]) -> bytes:
    return (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()


def source_revision(spec: DatasetSpec, source: str | os.PathLike[str] | None) -> dict[str, Any]:
    """What the data came from, so that the same files can be traced (and made) again.

    From the hub: the dataset repository's commit (asked of the hub; null offline, with the
    reason). From --source: a sha256 over its files' relative paths and contents, sorted.
    """
    if source is None:
        try:
            # lazy: huggingface_hub is heavy or absent where this module is imported; loaded only here
            from huggingface_hub import HfApi

            commit = HfApi().dataset_info(spec.hub_id).sha
            return {"hub": spec.hub_id, "revision": commit}
        except Exception as error:  # noqa: BLE001 - offline or refused: the files are still right
            return {"hub": spec.hub_id, "revision": None, "why": f"not asked of the hub ({type(error).__name__})"}
    root = Path(source).expanduser()
    digest = hashlib.sha256()
    budget = MAX_DATA_BYTES  # for the whole tree: a sparse 2 TiB file in it is refused, never read
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        try:
            file_digest = sha256_file(path, budget)
            budget -= path.stat().st_size
        except FileRefused as error:
            raise RecipeConfigError(
                [f"--source={str(root)!r}: {printable(str(error))}: the manifest hashes the whole source, at most "
                 f"{MAX_DATA_BYTES >> 30} GiB in all; keep only the dataset's files there"]
            ) from None
        except OSError as error:
            raise RecipeConfigError(
                [f"--source={str(root)!r}: {printable(str(path))} cannot be read ({describe_exception(error)})"]
            ) from None
        digest.update(f"{path.relative_to(root).as_posix()}\0{file_digest}\n".encode())
    return {"path": str(root), "content_sha256": digest.hexdigest()}


def _remove_empty(created: list[Path]) -> None:
    """Remove the directories this run created for --out, innermost first, where they are still empty."""
    for directory in created:
        try:
            directory.rmdir()
        except OSError:
            return


def output_problem(out: Path) -> str | None:
    """Why OUT cannot receive the files (one line naming it), or None; creates nothing.

    OUT must be a directory or not exist yet, and its nearest existing ancestor a directory this
    user may write into, where `mkdir -p` will create the rest.
    """
    if out.exists() and not out.is_dir():
        return f"--out={out}: not a directory; check DATA_DIR or --out"
    existing = out
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return f"--out={out}: {existing} is not a directory; check DATA_DIR or --out"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"--out={out}: {existing} is not writable by uid {os.getuid()}; check DATA_DIR or --out"
    return None


def prepare_dataset(
    name: DatasetName,
    out_dir: str | os.PathLike[str],
    source: str | os.PathLike[str] | None = None,
    *,
    batch_size: int | None = None,
    progress: Callable[[str], None] | None = None,
    max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES,
    model_dir: Path | None = None,
) -> PreparedData:
    """Convert dataset `name` into `out_dir/train.parquet` and `out_dir/test.parquet` for verl.

    Args:
        name: geo3k (hiyouga/geometry3k, with images) or gsm8k (openai/gsm8k, text).
        out_dir: directory to write to; created when missing.
        source: None for the hub (HF_TOKEN, HF_ENDPOINT, HF_HOME from the environment), or a
            local directory: `save_to_disk` output or a download of the hub repository.
        batch_size: rows per parquet row group (default: what `datasets` picks; 100 with images).
        progress: receives one line per step; default: stderr. Long steps also show
            `datasets` progress bars on stderr.
        max_image_bytes: largest image accepted, embedded or read from a path.
        model_dir: the model whose processor counts each prompt's tokens, text and images, for the manifest
            and the summary (verl drops a prompt over data.max_prompt_length without a word); None: not counted.

    Raises:
        RecipeConfigError: unknown name, unusable source, or an out_dir that cannot be created;
            SourceDataError (a RecipeConfigError) when the source's files or rows are refused
            (recipe/data/guard.py has the rules), naming every refused row up to a limit.
        DataPreparationError: the hub cannot be reached, a write fails.
    """
    spec = get_spec(name)
    if max_image_bytes < 1:
        raise RecipeConfigError([f"max_image_bytes={max_image_bytes}: must be at least 1"])
    say = progress or _stderr
    out = Path(out_dir).expanduser()
    targets = {split: out / f"{split}.parquet" for split in SPLITS}
    # Before any download: an output that cannot be written is a usage error, said at once.
    problem = output_problem(out)
    if problem:
        raise RecipeConfigError([problem])

    loaded = load_source(spec, source, say)
    images = ImagePolicy(folder=loaded.folder, max_bytes=max_image_bytes)
    converted: dict[str, datasets.Dataset] = {}
    refused: list[str] = []
    for split in SPLITS:
        converted[split], refused_rows = convert_split(spec, loaded.splits[split], split, images)
        refused += refused_rows
    if refused:
        raise SourceDataError(summarise(refused))

    if model_dir is not None:
        say(f"{spec.name}: counting prompt lengths in tokens (text and images) with {model_dir}'s processor")
    lengths = count_prompt_lengths(converted, model_dir)
    revision = source_revision(spec, source)  # before --out exists: a refused source leaves nothing behind
    created = [part for part in (out, *out.parents) if not os.path.lexists(part)]
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        problem = f"{out}: cannot create the output directory ({describe_exception(exc)}); check DATA_DIR or --out"
        raise RecipeConfigError([problem]) from None
    for leftover in remove_stale_temps(targets.values()):
        say(f"removed {leftover}, left by an interrupted run")

    written: list[PreparedFile] = []
    try:
        with AtomicFileSet() as files:
            digests = {}
            for split, target in targets.items():
                rows = converted[split]
                say(f"{spec.name} {split}: writing {len(rows)} rows")
                staged = files.stage(target, _parquet_writer(rows, batch_size))
                _check_written(staged, len(rows))
                written.append(PreparedFile(split, target, len(rows), staged.stat().st_size))
                digests[split] = {"file": target.name, "rows": len(rows), "sha256": sha256_file(staged)}
            manifest = {
                "dataset": spec.name, "data_source": spec.hub_id, "source": revision, "files": digests,
                "prompt_tokens": lengths if isinstance(lengths, str) else {k: v.to_manifest() for k, v in lengths.items()},
            }  # fmt: skip
            files.stage(out / MANIFEST_NAME, lambda handle: handle.write(_manifest_bytes(manifest)))
            files.commit()
    except OSError as exc:
        _remove_empty(created)
        raise DataPreparationError(f"{spec.name}: writing to {out} failed ({describe_exception(exc)})") from None
    except BaseException:  # interrupted: the folders this run made go too, as its files did
        _remove_empty(created)
        raise
    return PreparedData(spec.name, spec.hub_id, out, tuple(written), lengths)
