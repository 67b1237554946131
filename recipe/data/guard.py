"""What prepare-data agrees to read from a source, and the refusals for everything else.

A dataset is input from elsewhere: its rows and files may be hostile. A row's image may carry a
`path` and no bytes (`/proc/self/environ` would copy the environment, HF_TOKEN included, into
the parquet; `/dev/zero` never ends; a FIFO blocks forever); a folder's README may point
`datasets` at files outside it; a `save_to_disk` folder names its files in JSON. The rules:

- The source folder holds only regular files, folders, and symlinks to them that stay inside
  it (checked before `datasets` opens anything). A Hugging Face cache snapshot
  (`<repo>/snapshots/<rev>`) may link into its own repository folder (`<repo>/blobs`).
- The dataset's files (a README's `data_files`, a `save_to_disk` folder's split and file
  names) are plain names inside the folder.
- An image path is resolved (symlinks included) against the source folder and read only if it
  stays inside it, is a regular file (checked with stat before opening, and again on the open
  descriptor, opened non-blocking and without following a last symlink) and is no larger than
  the cap. Rows from the hub must carry their bytes: there is no folder to read from.
- Every image decodes, with PIL restricted to plain raster formats (PIL hands EPS to
  Ghostscript), within a pixel limit; text columns are strings, not empty, not huge.

Messages name the row or file and the rule, escape whatever the source holds (a path with a
newline cannot forge a second line) and never show a file's content.
"""

from __future__ import annotations

import io
import json
import os
import stat
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipe.data.errors import RowError

#: Largest image accepted, embedded or read from a path (`prepare-data --max-image-mib`).
DEFAULT_MAX_IMAGE_BYTES = 64 * 2**20
#: Largest image in pixels: PIL's own decompression-bomb threshold (`PIL.Image.MAX_IMAGE_PIXELS`).
MAX_IMAGE_PIXELS = 89_478_485
#: Formats PIL may decode: plain raster formats that need no external program.
IMAGE_FORMATS = ("PNG", "JPEG", "GIF", "BMP", "WEBP", "TIFF")
#: Longest text value (problem, question, answer), in characters: far above any prompt length.
MAX_TEXT_CHARS = 65_536
#: Refused rows listed before the rest are only counted.
MAX_SHOWN_PROBLEMS = 20
#: Entries a source folder may hold (a dataset download holds a few dozen).
MAX_SOURCE_ENTRIES = 100_000
#: Largest JSON file of a `save_to_disk` folder read.
MAX_JSON_BYTES = 16 * 2**20
#: Files `datasets` reads whole into memory (the dataset card, a saved dataset's metadata): each at
#: most MAX_JSON_BYTES, where a 4 GiB sparse README.md took 8.5 GB of memory to load.
READ_WHOLE = ("readme.md", "dataset_info.json", "dataset_infos.json", "dataset_dict.json", "state.json")

_FOLDER_RULE = "the source folder may hold only regular files, folders, and symlinks to them inside it"
_IMAGE_RULE = "an image path must name a regular file inside --source"


def shown(value: object, limit: int = 120) -> str:
    """`value` as a Python literal, cut to `limit` characters: one printable line whatever it holds."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 4] + "...'"


def printable(value: str, limit: int = 80) -> str:
    """`value` itself when it is a short printable line (a split name), else `shown(value)`."""
    return value if isinstance(value, str) and value.isprintable() and len(value) <= limit else shown(value, limit)


def _file_kind(mode: int) -> str:
    for test, kind in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISLNK, "a symlink"),
    ):
        if test(mode):
            return kind
    return "not a regular file"


@dataclass(frozen=True)
class SourceFolder:
    """A local source: the folder as given (relative paths start there) and the folder files may be in."""

    path: Path
    """The folder, absolute, as the user named it."""
    root: Path
    """Its real path; or, for a Hugging Face cache snapshot, the real path of the repository folder."""

    @classmethod
    def of(cls, path: str | os.PathLike[str]) -> SourceFolder:
        given = Path(os.path.abspath(path))
        real = Path(os.path.realpath(given))
        root = real
        # `hf download` without --local-dir: <cache>/datasets--<org>--<name>/snapshots/<rev>/<file>,
        # each file a symlink to ../../blobs/<hash> of the same repository folder.
        if real.parent.name == "snapshots" and (real.parent.parent / "blobs").is_dir():
            root = real.parent.parent
        return cls(given, root)

    def contains(self, real_path: str | os.PathLike[str]) -> bool:
        """Whether the resolved `real_path` lies inside the root."""
        real, root = os.fspath(real_path), os.fspath(self.root)
        return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


@dataclass(frozen=True)
class ImagePolicy:
    """Where image paths may point and how large an image may be."""

    folder: SourceFolder | None = None
    """The local source folder; None for the hub, whose rows must carry their image bytes."""
    max_bytes: int = DEFAULT_MAX_IMAGE_BYTES


def check_tree(folder: SourceFolder, label: str) -> list[str]:
    """Every entry of the source folder that is not a regular file, a folder or a symlink to one inside it."""
    problems: list[str] = []
    seen: set[tuple[int, int]] = set()
    count = 0

    def entry_problem(full: str) -> tuple[str | None, os.stat_result | None]:
        relative = shown(os.path.relpath(full, folder.path))
        try:
            mode = os.lstat(full).st_mode
            if stat.S_ISLNK(mode):
                if not folder.contains(os.path.realpath(full)):
                    problem = f"{label}: {relative} is a symlink that points outside the source folder; {_FOLDER_RULE}"
                    return problem, None
                try:
                    target = os.stat(full)
                except OSError:
                    return f"{label}: {relative} is a symlink that points to nothing; {_FOLDER_RULE}", None
                if not (stat.S_ISREG(target.st_mode) or stat.S_ISDIR(target.st_mode)):
                    kind = _file_kind(target.st_mode)
                    return f"{label}: {relative} is a symlink to {kind}; {_FOLDER_RULE}", None
                return None, target
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                return f"{label}: {relative} is {_file_kind(mode)}; {_FOLDER_RULE}", None
            return None, os.stat(full)
        except OSError as exc:
            return f"{label}: {relative} cannot be examined ({exc.strerror or type(exc).__name__})", None

    def unlisted(exc: OSError) -> None:
        where = shown(os.path.relpath(exc.filename, folder.path)) if exc.filename else "a folder"
        problems.append(f"{label}: {where} cannot be listed ({exc.strerror or type(exc).__name__})")

    top = os.stat(folder.path)
    seen.add((top.st_dev, top.st_ino))
    # Symlinked folders inside the root are walked too (each real folder once), so nothing a
    # link leads to escapes the check.
    for directory, subdirectories, files in os.walk(folder.path, followlinks=True, onerror=unlisted):
        kept = []
        for name in sorted(subdirectories) + sorted(files):
            count += 1
            if count > MAX_SOURCE_ENTRIES:
                problems.append(
                    f"{label}: holds more than {MAX_SOURCE_ENTRIES} entries; point --source at the dataset's own folder"
                )
                return problems
            full = os.path.join(directory, name)
            problem, target = entry_problem(full)
            if problem is None and target is not None and name.lower() in READ_WHOLE and target.st_size > MAX_JSON_BYTES:
                problem = (
                    f"{label}: {shown(os.path.relpath(full, folder.path))} is {target.st_size} bytes, which `datasets` "
                    f"reads whole; at most {MAX_JSON_BYTES}"
                )
            if problem is not None:
                problems.append(problem)
            elif name in subdirectories and target is not None and stat.S_ISDIR(target.st_mode):
                key = (target.st_dev, target.st_ino)
                if key not in seen:
                    seen.add(key)
                    kept.append(name)
        subdirectories[:] = kept
    return problems


def _read_json(path: Path, label: str, name: str) -> tuple[Any, str | None]:
    """The parsed JSON document, or a problem line."""
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            return None, f"{label}: {name} is over {MAX_JSON_BYTES} bytes"
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, f"{label}: {name} is missing"
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"{label}: {name} cannot be read ({type(exc).__name__})"
    try:
        return json.loads(text), None
    except RecursionError:
        return None, f"{label}: {name} cannot be parsed (nested too deeply)"
    except ValueError as exc:
        return None, f"{label}: {name} is not valid JSON ({shown(str(exc).splitlines()[0] if str(exc) else '', 100)})"


def _plain_name(name: object) -> bool:
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and "/" not in name
        and "\\" not in name
        and "\x00" not in name
        and "://" not in name
    )


def check_saved_dataset(folder: SourceFolder, label: str) -> list[str]:
    """`save_to_disk` output: split names and data file names are plain names inside the folder.

    `datasets.load_from_disk` joins them to the folder's path as they are: `../x` or `/etc`
    would read arrow files elsewhere. A split with no data file (an empty dataset saved) makes
    `load_from_disk` fail with IndexError: it is reported as a split with no rows.
    """
    document, problem = _read_json(folder.path / "dataset_dict.json", label, "dataset_dict.json")
    if problem is not None:
        return [problem]
    splits = document.get("splits") if isinstance(document, dict) else None
    if not isinstance(splits, list) or not all(isinstance(split, str) for split in splits):
        return [f"{label}: dataset_dict.json: 'splits' must be a list of split names"]
    problems: list[str] = []
    for split in splits:
        if not _plain_name(split):
            problems.append(f"{label}: dataset_dict.json: split name {shown(split)} is not a plain folder name")
            continue
        name = f"{split}/state.json"
        state, problem = _read_json(folder.path / split / "state.json", label, shown(name))
        if problem is not None:
            problems.append(problem)
            continue
        files = state.get("_data_files") if isinstance(state, dict) else None
        if not isinstance(files, list) or not all(isinstance(entry, dict) for entry in files):
            problems.append(f"{label}: {shown(name)}: '_data_files' must be a list of {{filename: ...}}")
            continue
        if not files:
            problems.append(f"{label}: split {shown(split)} has no rows")
        for entry in files:
            filename = entry.get("filename")
            if not _plain_name(filename):
                problems.append(
                    f"{label}: {shown(name)}: data file name {shown(filename)} is not a plain file name in the "
                    "split's folder"
                )
    return problems


def check_data_files(data_files: Mapping[str, Sequence[str]], folder: SourceFolder, label: str) -> list[str]:
    """The files `datasets` resolved for each split: local, regular, inside the folder, not all empty."""
    problems: list[str] = []
    for named_split, paths in data_files.items():
        split = str(named_split)
        sizes: list[int] = []
        for path in paths:
            where = f"data file {shown(path)} (split {shown(split)})"
            if "://" in path or "::" in path:
                problems.append(f"{label}: {where} is not a local file; the dataset's files must be inside --source")
                continue
            if not folder.contains(os.path.realpath(path)):
                problems.append(
                    f"{label}: {where} is outside the source folder; the dataset's files must be inside --source"
                )
                continue
            try:
                info = os.stat(path)
            except OSError as exc:
                problems.append(f"{label}: {where} cannot be read ({exc.strerror or type(exc).__name__})")
                continue
            if not stat.S_ISREG(info.st_mode):
                problems.append(f"{label}: {where} is {_file_kind(info.st_mode)}, not a regular file")
                continue
            sizes.append(info.st_size)
        if sizes and len(sizes) == len(paths) and not any(sizes):
            problems.append(f"{label}: split {shown(split)} has no rows")
    return problems


def check_text(value: Any, column: str) -> str:
    """`value` if it is usable text; RowError naming `column` and the rule otherwise."""
    if value is None:
        raise RowError(f"{column} is missing (null)")
    if not isinstance(value, str):
        raise RowError(f"{column} is {type(value).__name__}, not text")
    if len(value) > MAX_TEXT_CHARS:
        raise RowError(f"{column} is {len(value)} characters, over the limit of {MAX_TEXT_CHARS}")
    if not value.strip():
        raise RowError(f"{column} is empty")
    return value


def _size_problem(size: int, max_bytes: int) -> str:
    return f"is {size} bytes, over the limit of {max_bytes} bytes (--max-image-mib)"


def read_image_file(path: str, policy: ImagePolicy) -> bytes:
    """The bytes of the image file `path` names, read under the rules of the module docstring.

    A relative `path` starts at the source folder. Raises RowError (`path '...' <rule>`).
    """
    where = f"path {shown(path)}"
    folder = policy.folder
    if folder is None:
        raise RowError(
            f"{where} has no bytes; images from the hub must carry their bytes "
            "(download the repository and pass --source)"
        )
    if "\x00" in path:
        raise RowError(f"{where} is not a valid path (it contains a NUL character); {_IMAGE_RULE}")
    real = os.path.realpath(os.path.join(folder.path, path))
    if not folder.contains(real):
        raise RowError(f"{where} is outside the source folder; {_IMAGE_RULE}")
    try:
        before = os.stat(real)
    except FileNotFoundError:
        raise RowError(f"{where} names no such file in the source folder; {_IMAGE_RULE}") from None
    except OSError as exc:
        raise RowError(f"{where} cannot be read ({exc.strerror or type(exc).__name__}); {_IMAGE_RULE}") from None
    if not stat.S_ISREG(before.st_mode):
        raise RowError(f"{where} is not a regular file ({_file_kind(before.st_mode)}); {_IMAGE_RULE}")
    if before.st_size > policy.max_bytes:
        raise RowError(f"{where} {_size_problem(before.st_size, policy.max_bytes)}")
    # Non-blocking, so a FIFO swapped in after the stat cannot block; no last symlink followed.
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(real, flags)
    except OSError as exc:
        raise RowError(f"{where} cannot be read ({exc.strerror or type(exc).__name__}); {_IMAGE_RULE}") from None
    try:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode) or (opened.st_dev, opened.st_ino) != (before.st_dev, before.st_ino):
            raise RowError(f"{where} changed while it was opened; {_IMAGE_RULE}")
        descriptor_link = f"/proc/self/fd/{fd}"
        if os.path.islink(descriptor_link) and not folder.contains(os.readlink(descriptor_link)):
            raise RowError(f"{where} is outside the source folder; {_IMAGE_RULE}")
        chunks: list[bytes] = []
        remaining = policy.max_bytes + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 2**20))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
    except BlockingIOError:
        raise RowError(f"{where} cannot be read without blocking; {_IMAGE_RULE}") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > policy.max_bytes:
        raise RowError(f"{where} {_size_problem(len(data), policy.max_bytes)}")
    return data


def check_image(data: bytes, max_bytes: int) -> None:
    """RowError unless `data` is at most `max_bytes` and decodes as an image of an allowed format."""
    if len(data) > max_bytes:
        raise RowError(_size_problem(len(data), max_bytes))
    from PIL import Image  # lazy: PIL is heavy or absent where this module is imported; loaded only here

    formats = ", ".join(IMAGE_FORMATS[:-1]) + " or " + IMAGE_FORMATS[-1]
    try:
        with warnings.catch_warnings():
            # The pixel limit below is ours; PIL's warning (or error, at twice its limit) is not needed.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data), formats=IMAGE_FORMATS) as image:
                width, height = image.size
                if width * height > MAX_IMAGE_PIXELS:
                    raise RowError(f"is {width}x{height} pixels, over the limit of {MAX_IMAGE_PIXELS} pixels")
                image.verify()  # checksums and structure
            with Image.open(io.BytesIO(data), formats=IMAGE_FORMATS) as image:
                image.load()  # every pixel of the first frame, as verl will
    except RowError:
        raise
    except Image.DecompressionBombError:
        raise RowError(f"has more than {MAX_IMAGE_PIXELS} pixels, over the limit") from None
    except Exception as exc:  # PIL raises many types for bad data: all mean "not an image we take"
        unidentified = isinstance(exc, Image.UnidentifiedImageError)  # its message is only the BytesIO's repr
        detail = "" if unidentified else f" ({type(exc).__name__}: {shown(str(exc), 80)})"
        raise RowError(f"does not decode as a {formats} image{detail}") from None


def summarise(problems: list[str], limit: int = MAX_SHOWN_PROBLEMS) -> list[str]:
    """The first `limit` problems, then one line counting the rest."""
    if len(problems) <= limit:
        return problems
    rest = len(problems) - limit
    return [
        *problems[:limit],
        f"... and {rest} more refused rows ({len(problems)} in all; the first {limit} are shown)",
    ]
