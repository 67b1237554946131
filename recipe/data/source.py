"""Load a dataset's raw splits: from the Hugging Face hub, or from a local copy.

The hub is reached through `datasets`/`huggingface_hub`, which read HF_TOKEN, HF_ENDPOINT
(a mirror), HF_HOME (the cache) and HF_HUB_OFFLINE=1 (cache only) from the environment
themselves; this module never reads or prints the first two, and removes them from any
message it passes on.

A local source is a directory holding either
- `DatasetDict.save_to_disk()` output (it has `dataset_dict.json`), or
- a download of the hub repository (`hf download <id> --repo-type dataset --local-dir DIR`)
  or any folder `datasets.load_dataset(DIR)` reads (parquet/json/csv files per split).

A local folder is checked before `datasets` opens anything in it, and its dataset files before
they are read (recipe/data/guard.py): a hostile folder is refused, not followed.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from recipe.data.errors import DataPreparationError, SourceDataError
from recipe.data.guard import (
    SourceFolder,
    check_data_files,
    check_saved_dataset,
    check_tree,
    printable,
    shown,
)
from recipe.data.specs import SPLITS, DatasetSpec
from recipe.errors import RecipeConfigError

if TYPE_CHECKING:
    import datasets

#: Environment values that must never appear in anything this package prints.
_HIDDEN_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_ENDPOINT")


def redact(text: str) -> str:
    """`text` with the values of HF_TOKEN and HF_ENDPOINT (when set) replaced by `**********`."""
    for name in _HIDDEN_ENV:
        value = os.environ.get(name)
        if value and len(value) >= 4:  # a 1-3 character value would blank out ordinary words
            text = text.replace(value, "**********")
    return text


def describe_exception(exc: BaseException, limit: int = 300) -> str:
    """One redacted line naming the exception: `Type: first line of its message`."""
    lines = str(exc).strip().splitlines()
    first = lines[0] if lines else ""
    message = redact(f"{type(exc).__name__}: {first}" if first else type(exc).__name__)
    return message if len(message) <= limit else message[: limit - 3] + "..."


class _RedactFilter(logging.Filter):
    """Rewrites a log record whose text contains HF_TOKEN's or HF_ENDPOINT's value."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True


#: Loggers whose handlers print what `datasets` and `huggingface_hub` log (their own, and the root's).
_LIBRARY_LOGGERS = ("huggingface_hub", "datasets", "")


@contextmanager
def redacted_library_logs() -> Iterator[None]:
    """While active, log lines printed by the hub libraries never show HF_TOKEN or HF_ENDPOINT.

    huggingface_hub warns on every retry with the full URL (`... requesting HEAD
    <HF_ENDPOINT>/datasets/...`). The filter sits on the handlers, which see the records of
    every child logger that propagates to them.
    """
    handlers = {handler for name in _LIBRARY_LOGGERS for handler in logging.getLogger(name).handlers}
    if logging.lastResort is not None:
        handlers.add(logging.lastResort)
    log_filter = _RedactFilter()
    for handler in handlers:
        handler.addFilter(log_filter)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(log_filter)


#: Seconds the hub's host may take to accept a connection before prepare-data says it is unreachable.
HUB_PROBE_TIMEOUT_S = 5.0
DEFAULT_HF_ENDPOINT = "https://huggingface.co"
_PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def hub_unreachable(environ: Mapping[str, str], timeout_s: float = HUB_PROBE_TIMEOUT_S) -> str | None:
    """Why the hub cannot be reached (one phrase), or None when a connection opens or cannot be judged.

    Without it, huggingface_hub retries each request with a warning line apiece (24 lines and
    25 s on a machine with no network) before failing. Not judged: HF_HUB_OFFLINE (cache only,
    no network wanted) and a proxy (only the proxy can say).
    """
    if environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}:
        return None
    if any(environ.get(name) for name in _PROXY_VARIABLES):
        return None
    endpoint = environ.get("HF_ENDPOINT") or DEFAULT_HF_ENDPOINT
    # The endpoint's value is never printed (it may carry credentials): "the hub" names it.
    try:
        parts = urlsplit(endpoint)
        host, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return "HF_ENDPOINT is not a URL"
    if not host:
        return "HF_ENDPOINT is not a URL"
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as exc:
        return f"no connection to the hub's host within {timeout_s:g} s ({type(exc).__name__})"


def _load_hub(spec: DatasetSpec) -> datasets.DatasetDict:
    import datasets  # lazy: heavy; and configures log handlers, so before redacted_library_logs()

    unreachable = hub_unreachable(os.environ)
    if unreachable:
        raise DataPreparationError(
            f"{spec.name}: cannot reach the Hugging Face hub: {unreachable}; without a network use a copy already "
            "in HF_HOME with HF_HUB_OFFLINE=1, or pass --source with a local copy; set HF_ENDPOINT for a mirror"
        )

    try:
        with redacted_library_logs():
            loaded = datasets.load_dataset(spec.hub_id, spec.hub_config)
    except Exception as exc:  # network, auth, missing cache: all end the command the same way
        if datasets.config.HF_HUB_OFFLINE:  # datasets' own reading of HF_HUB_OFFLINE / HF_DATASETS_OFFLINE
            # Offline, the cache was the only place to look: a mirror or a token cannot help.
            raise DataPreparationError(
                f"{spec.name}: {spec.hub_id} is not in the cache, and offline mode (HF_HUB_OFFLINE) keeps the hub out: "
                f"datasets looked in {datasets.config.HF_DATASETS_CACHE} (set by HF_HOME); load it once where the hub "
                "is reachable with the same HF_HOME, or pass --source with a local copy"
            ) from None
        raise DataPreparationError(
            f"{spec.name}: cannot load {spec.hub_id} from the Hugging Face hub ({describe_exception(exc)}); "
            "set HF_ENDPOINT to reach a mirror, HF_TOKEN if the hub asks for one, "
            "or pass --source with a local copy"
        ) from None
    return loaded  # type: ignore[return-value]  # with no split argument it is a DatasetDict


@dataclass(frozen=True)
class LoadedSource:
    """A dataset's raw splits and where they came from."""

    splits: datasets.DatasetDict
    folder: SourceFolder | None
    """The local source folder (image paths may point into it); None for the hub."""
    label: str
    """How messages name the source: `--source=PATH` or the hub id."""


def _refuse(problems: list[str]) -> None:
    if problems:
        raise SourceDataError(problems)


def _load_folder(spec: DatasetSpec, folder: SourceFolder, label: str) -> datasets.DatasetDict:
    """`datasets.load_dataset(folder)`, with the files it resolved checked before any is read."""
    import datasets  # lazy: datasets is heavy or absent where this module is imported; loaded only here

    path = str(folder.path)
    # A download of the hub repository keeps the hub's configs (gsm8k: main, socratic);
    # a plain folder of split files has only `default`.
    config = spec.hub_config if spec.hub_config in datasets.get_dataset_config_names(path) else None
    # What `datasets.load_dataset` does, split in two so the data files can be checked in between.
    builder = datasets.load_dataset_builder(path, config)
    _refuse(check_data_files(builder.config.data_files or {}, folder, label))
    builder.download_and_prepare()
    empty = [str(split) for split, info in builder.info.splits.items() if not info.num_examples]
    _refuse([f"{label}: split {shown(split)} has no rows" for split in empty])
    return builder.as_dataset()  # type: ignore[return-value]  # no split argument: a DatasetDict


def _load_local(spec: DatasetSpec, path: Path, label: str) -> tuple[datasets.DatasetDict, SourceFolder]:
    import datasets  # lazy: datasets is heavy or absent where this module is imported; loaded only here

    if not path.exists():
        raise RecipeConfigError([f"{label}: no such directory"])
    if not path.is_dir():
        raise RecipeConfigError([f"{label}: must be a directory (save_to_disk output or a download of {spec.hub_id})"])
    folder = SourceFolder.of(path)
    _refuse(check_tree(folder, label))  # before anything in it is opened: a FIFO README would block
    try:
        if (path / "dataset_dict.json").is_file():
            _refuse(check_saved_dataset(folder, label))
            loaded = datasets.load_from_disk(str(path))
        else:
            loaded = _load_folder(spec, folder, label)
    except SourceDataError:
        raise
    except Exception as exc:  # whatever `datasets` says, the folder is not a readable dataset
        raise RecipeConfigError([f"{label}: cannot be read as a dataset ({describe_exception(exc)})"]) from None
    if not isinstance(loaded, datasets.DatasetDict):
        raise RecipeConfigError([f"{label}: holds a single split; need splits {', '.join(SPLITS)}"])
    return loaded, folder


def _feature_name(feature: object) -> str:
    """`int64` for a plain value type, the feature's repr otherwise; one printable line either way."""
    dtype = getattr(feature, "dtype", None)
    name = dtype if type(feature).__name__ == "Value" and isinstance(dtype, str) else repr(feature)
    return name if name.isprintable() and len(name) <= 120 else shown(name)


def check_source(spec: DatasetSpec, loaded: datasets.DatasetDict, label: str) -> None:
    """Raise RecipeConfigError naming every missing split and column, wrong column type and empty split at once."""
    problems: list[str] = []
    for split in SPLITS:
        if split not in loaded:
            found = ", ".join(printable(str(name)) for name in sorted(loaded)) or "none"
            problems.append(f"{label}: has no split {split!r} (found: {found})")
            continue
        columns = loaded[split].column_names
        missing = [column for column in spec.columns if column not in columns]
        if missing:
            problems.append(
                f"{label}: split {split!r} lacks column(s) {', '.join(missing)} "
                f"({spec.name} needs {', '.join(spec.columns)})"
            )
        for column in spec.text_columns:
            if column in columns:
                feature = loaded[split].features[column]
                if _feature_name(feature) not in ("string", "large_string"):
                    problems.append(
                        f"{label}: split {split!r} column {column} is {_feature_name(feature)}; "
                        "it must be text (string)"
                    )
        if not missing and loaded[split].num_rows == 0:
            problems.append(f"{label}: split {split!r} has no rows")
    if problems:
        raise RecipeConfigError(problems)


def load_source(spec: DatasetSpec, source: str | os.PathLike[str] | None, say: Callable[[str], None]) -> LoadedSource:
    """Load `spec`'s raw splits from the hub (`source` None) or the local directory `source`.

    Raises RecipeConfigError for a source the user can fix (SourceDataError where its content
    is refused), DataPreparationError when the hub cannot be reached.
    """
    folder = None
    if source is None:
        say(f"loading {spec.hub_id} from the Hugging Face hub (cached in HF_HOME)")
        loaded = _load_hub(spec)
        label = spec.hub_id
    else:
        path = Path(source).expanduser()
        label = f"--source={source}"
        say(f"loading {spec.name} from {path}")
        loaded, folder = _load_local(spec, path, label)
    check_source(spec, loaded, label)
    return LoadedSource(loaded, folder, label)
