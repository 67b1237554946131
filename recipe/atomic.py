"""Write files so that a reader sees either the old complete file or the new complete one.

Each file is written to a hidden temporary file in the target's own directory (so the final
rename stays on one filesystem), flushed and fsync'ed, then moved over the target with
`os.replace`, which is atomic on POSIX; the directory is fsync'ed so the rename survives a
power loss. On any exception, KeyboardInterrupt included, the temporary files are removed and
the targets are left as they were.
"""

from __future__ import annotations

import os
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

#: Temporary files are `.<target name>.<random>.tmp`: hidden, and never ending in `.parquet`.
_TMP_SUFFIX = ".tmp"


def _temp_prefix(target: Path) -> str:
    return f".{target.name}."


def _default_mode() -> int:
    """rw for everyone the umask allows, like `open()`; mkstemp alone would leave 0600."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _fsync_dir(directory: Path) -> None:
    """Persist a rename in `directory` (not supported on every platform or filesystem)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_stale_temps(targets: Iterable[Path], older_than_s: float = 3600.0) -> list[Path]:
    """Remove temporary files an earlier, killed run left beside `targets`; return what was removed.

    A SIGKILL (or a power loss) leaves no chance to clean up. Only files older than
    `older_than_s` go, so a run writing the same targets at the same moment keeps its own.
    """
    removed: list[Path] = []
    cutoff = time.time() - older_than_s
    for target in targets:
        if not target.parent.is_dir():
            continue
        for leftover in target.parent.glob(f"{_temp_prefix(target)}*{_TMP_SUFFIX}"):
            try:
                if leftover.stat().st_mtime < cutoff:
                    leftover.unlink()
                    removed.append(leftover)
            except FileNotFoundError:
                pass
    return removed


class AtomicFileSet:
    """Stage several files, then put them all in place at once (or none of them).

    Use as a context manager: `stage()` each file, then `commit()`. Leaving the block without
    `commit()`, by an exception or otherwise, removes every staged file. The renames in
    `commit()` are each atomic; together they are as close as POSIX allows to one step.
    """

    def __init__(self) -> None:
        self._staged: list[tuple[Path, Path]] = []

    def __enter__(self) -> AtomicFileSet:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.abort()

    def stage(self, target: Path, write: Callable[[BinaryIO], object]) -> Path:
        """Write `target`'s new content into a temporary file beside it; return the temporary path.

        `write` gets the open binary file. The returned file is complete and synced, for the
        caller to check before `commit()`. On an exception the temporary file is removed and
        the exception propagates.
        """
        target = Path(target)
        fd, name = tempfile.mkstemp(dir=target.parent, prefix=_temp_prefix(target), suffix=_TMP_SUFFIX)
        temp = Path(name)
        # Registered before anything is written, so abort() removes it whatever happens next.
        self._staged.append((temp, target))
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), _default_mode())
            try:
                write(handle)
            except BaseException as exc:
                # A writer object that the failure leaves behind (pyarrow's ParquetWriter) lives
                # on in the traceback's frames; its finaliser would write to this file after it is
                # closed and print "Exception ignored ...". Free it now, while the file is open.
                traceback.clear_frames(exc.__traceback__)
                raise
            handle.flush()
            os.fsync(handle.fileno())
        return temp

    def commit(self) -> None:
        """Move every staged file over its target."""
        directories = set()
        while self._staged:
            temp, target = self._staged[0]
            os.replace(temp, target)
            self._staged.pop(0)
            directories.add(target.parent)
        for directory in directories:
            _fsync_dir(directory)

    def abort(self) -> None:
        """Remove every staged file that was not committed; targets stay untouched."""
        while self._staged:
            temp, _ = self._staged.pop()
            temp.unlink(missing_ok=True)


def atomic_write(target: Path, write: Callable[[BinaryIO], object]) -> int:
    """Write one file atomically (see the module docstring); return its size in bytes."""
    with AtomicFileSet() as files:
        size = files.stage(target, write).stat().st_size
        files.commit()
    return size
