"""Prepare one dataset: load it, convert every split to verl's format, write the parquet files.

Both files are staged first and put in place together at the end, so an interrupted run
leaves the previous files (or none) and never a half-written one. Running it again rewrites
the same bytes for the same source.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from recipe.data.atomic import AtomicFileSet, remove_stale_temps
from recipe.data.errors import DataPreparationError
from recipe.data.source import describe_exception, load_source
from recipe.data.specs import SPECS, SPLITS, DatasetName, DatasetSpec, RowError, output_features
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


@dataclass(frozen=True)
class PreparedData:
    """What `prepare_dataset` wrote."""

    dataset: DatasetName
    data_source: str
    out_dir: Path
    files: tuple[PreparedFile, ...]

    def path(self, split: str) -> Path:
        """The parquet file of `split` (train or test)."""
        for written in self.files:
            if written.split == split:
                return written.path
        raise KeyError(split)

    def summary(self) -> list[str]:
        """One line per file: `wrote PATH: N rows, M bytes`."""
        return [f"wrote {f.path}: {f.rows} rows, {f.bytes} bytes" for f in self.files]


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
    from datasets import Image, List, Sequence

    features = raw.features.copy()
    feature = features["images"]
    if isinstance(feature, Image):
        features["images"] = Image(decode=False)
    elif isinstance(feature, List | Sequence) and isinstance(feature.feature, Image):
        features["images"] = List(Image(decode=False))
    else:
        raise RecipeConfigError(
            [f"{spec.name} split {split!r}: column images is {feature!r}; expected a list of datasets Image"]
        )
    # In memory: `cast` would otherwise write a cache file into the source's folder.
    return raw.cast(features, keep_in_memory=True)


def convert_split(spec: DatasetSpec, raw: datasets.Dataset, split: str) -> datasets.Dataset:
    """Convert one raw split to verl's columns, in memory (the source may be read-only)."""
    raw = raw.select_columns(list(spec.columns))
    if spec.has_images:
        raw = _undecoded_images(spec, split, raw)

    def convert(example: dict[str, Any], index: int) -> dict[str, Any]:
        try:
            return spec.convert(example, index, split)
        except RowError as exc:
            raise DataPreparationError(f"{spec.name} {split} row {index}: {exc}") from None

    return raw.map(
        convert,
        with_indices=True,
        remove_columns=list(spec.columns),
        features=output_features(spec),
        keep_in_memory=True,
        # An explicit fingerprint: nothing is cached, and `datasets` need not hash the closure.
        new_fingerprint=f"recipe-{spec.name}-{split}-{raw._fingerprint}",
        desc=f"{spec.name} {split}: converting",
    )


def _parquet_writer(dataset: datasets.Dataset, batch_size: int | None) -> Callable[[BinaryIO], object]:
    """A writer for AtomicFileSet.stage: `dataset` as parquet, with the `datasets` feature metadata."""

    def write(handle: BinaryIO) -> object:
        return dataset.to_parquet(handle, batch_size=batch_size)

    return write


def _check_written(path: Path, rows: int) -> None:
    """Read the staged file's footer back: a truncated or wrong file never gets committed."""
    import pyarrow.parquet as pq

    written = pq.read_metadata(path).num_rows
    if written != rows:
        raise DataPreparationError(f"{path}: wrote {written} rows, expected {rows}")


def prepare_dataset(
    name: DatasetName,
    out_dir: str | os.PathLike[str],
    source: str | os.PathLike[str] | None = None,
    *,
    batch_size: int | None = None,
    progress: Callable[[str], None] | None = None,
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

    Raises:
        RecipeConfigError: unknown name, unusable source, or an out_dir that cannot be created.
        DataPreparationError: the hub cannot be reached, a row cannot be converted, a write fails.
    """
    spec = get_spec(name)
    say = progress or _stderr
    out = Path(out_dir).expanduser()
    targets = {split: out / f"{split}.parquet" for split in SPLITS}

    raw = load_source(spec, source, say)
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
            for split, target in targets.items():
                converted = convert_split(spec, raw[split], split)
                say(f"{spec.name} {split}: writing {len(converted)} rows")
                staged = files.stage(target, _parquet_writer(converted, batch_size))
                _check_written(staged, len(converted))
                written.append(PreparedFile(split, target, len(converted), staged.stat().st_size))
            files.commit()
    except OSError as exc:
        raise DataPreparationError(f"{spec.name}: writing to {out} failed ({describe_exception(exc)})") from None
    return PreparedData(dataset=spec.name, data_source=spec.hub_id, out_dir=out, files=tuple(written))
