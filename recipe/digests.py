"""sha256 of the files a run record names, read within a bound, and the cache that spares re-reading them.

Every file hashed here is named by input (TRAIN_FILES, MODEL_PATH, a stored record, a
`prepare-data --source` tree), so it may be a FIFO, a link to /dev/zero or a 2 TiB sparse file.
A file is hashed only when it is a regular file of at most its bound; the bound is checked on
the open handle, and no more than that many bytes are ever read, so hashing takes at most about
1.3 s per GB of the bound (benchmarks/provenance_hashing.py). Anything else is a FileRefused
naming the file and the rule.

The cache maps a file's identity to its digest. It is trusted only as far as its evidence goes:
- the key holds the resolved path, size, mtime, ctime, inode and device: rewriting a file in
  place and restoring its mtime still moves its ctime, which no user can set back; a file whose
  ctime is under RACY_NS old is not cached at all, since a rewrite within the filesystem's
  clock tick would keep the same ctime (git's "racy" files);
- it lives in $XDG_CACHE_HOME/grpo-recipe (or ~/.cache/grpo-recipe), used only while that
  folder is a real directory owned by this user with no access for others (0700); created so;
- its file is read only when it is a regular file owned by this user, of at most
  CACHE_MAX_BYTES, and any unreadable, malformed or deep content is an empty cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from recipe.atomic import atomic_write
from recipe.read_back import CHUNK, FileRefused, _size_text, open_regular, read_bounded  # noqa: F401 - part of digests' API

#: Largest data file (TRAIN_FILES, VAL_FILES, a file of a --source tree) hashed: about 85 s once.
MAX_DATA_BYTES = 64 << 30
#: Largest model file hashed (config, tokenizer, the safetensors index; never the weights).
MAX_MODEL_FILE_BYTES = 1 << 30
#: Largest cache file read; beyond it the cache starts afresh.
CACHE_MAX_BYTES = 4 << 20
#: A file changed this recently (ns) is hashed but not cached: its ctime could still repeat.
RACY_NS = 1_000_000_000


def sha256_file(path: Path, limit: int = MAX_DATA_BYTES) -> str:
    """The sha256 of a regular file of at most `limit` bytes; FileRefused otherwise (OSError when unreadable)."""
    fd, _ = open_regular(path, limit)
    digest = hashlib.sha256()
    total = 0
    try:
        while chunk := os.read(fd, CHUNK):
            total += len(chunk)
            if total > limit:
                raise FileRefused(f"{path}: grew past the {_size_text(limit)} that is hashed while it was read")
            digest.update(chunk)
    finally:
        os.close(fd)
    return digest.hexdigest()


def parquet_rows(path: Path) -> int | None:
    """Rows of a parquet file from its footer; None when pyarrow is absent or cannot read it."""
    try:
        import pyarrow.parquet as pq  # lazy: pyarrow is heavy or absent where this module is imported; loaded only here

        return int(pq.read_metadata(path).num_rows)
    except Exception:  # noqa: BLE001 - a record is still made; the hash says what the file is
        return None


# --- the cache ------------------------------------------------------------------------------


def cache_dir(environ: Mapping[str, str]) -> Path:
    """$XDG_CACHE_HOME/grpo-recipe, or ~/.cache/grpo-recipe (an XDG_CACHE_HOME that is not absolute is ignored)."""
    base = environ.get("XDG_CACHE_HOME", "")
    return (Path(base) if os.path.isabs(base) else Path.home() / ".cache") / "grpo-recipe"


def hash_cache_path(environ: Mapping[str, str]) -> Path:
    """The cache file: sha256.json in cache_dir."""
    return cache_dir(environ) / "sha256.json"


def _private_dir(directory: Path, create: bool) -> bool:
    """Whether `directory` is a real directory of this user that no one else may enter (created 0700 if asked)."""
    if create:
        try:
            directory.parent.mkdir(parents=True, exist_ok=True)
            directory.mkdir(mode=0o700)
        except FileExistsError:
            pass
        except OSError:
            return False
    try:
        info = os.lstat(directory)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o077


def _load_cache(cache_file: Path) -> dict[str, Any]:
    """The cache's entries; empty when the folder or the file is not this user's own, or not one JSON object."""
    if not _private_dir(cache_file.parent, create=False):
        return {}
    try:
        fd, info = open_regular(cache_file, CACHE_MAX_BYTES, follow=False)
    except (OSError, FileRefused):
        return {}
    try:
        if info.st_uid != os.geteuid():
            return {}
        data = json.loads(read_bounded(fd, CACHE_MAX_BYTES))
    except (OSError, ValueError, RecursionError):
        return {}
    finally:
        os.close(fd)
    return data if isinstance(data, dict) else {}


def _store_cache(cache_file: Path, cache: Mapping[str, Any]) -> None:
    """Write the cache atomically into its private folder; silently not at all where that cannot be had."""
    if not _private_dir(cache_file.parent, create=True):
        return
    try:
        atomic_write(cache_file, lambda out: out.write(json.dumps(cache).encode("utf-8")))
    except OSError:
        pass


def identity(path: Path, info: os.stat_result) -> str:
    """The cache key: what must all stay the same for a file's digest to be reused."""
    return f"{path.resolve()}|{info.st_size}|{info.st_mtime_ns}|{info.st_ctime_ns}|{info.st_ino}|{info.st_dev}"


def cached_digest(path: Path, environ: Mapping[str, str], limit: int = MAX_DATA_BYTES) -> tuple[str, int | None]:
    """(sha256, parquet rows) of a regular file of at most `limit` bytes, reused while its identity stays the same.

    Hashing costs about 1.3 s per GB here and counting rows imports pyarrow; `plan` runs often.
    Raises FileRefused (not a regular file, above the bound) or OSError (unreadable).
    """
    fd, info = open_regular(path, limit)
    os.close(fd)
    key = identity(path, info)
    cache_file = hash_cache_path(environ)
    cache = _load_cache(cache_file)
    known = cache.get(key)
    if (
        isinstance(known, dict)
        and isinstance(known.get("sha256"), str)
        and len(known["sha256"]) == 64
        and (known.get("rows") is None or type(known.get("rows")) is int)
    ):
        return known["sha256"], known.get("rows")
    digest, rows = sha256_file(path, limit), parquet_rows(path)
    if time.time_ns() - info.st_ctime_ns < RACY_NS:
        return digest, rows
    resolved = key.partition("|")[0]
    cache = {k: v for k, v in cache.items() if k.partition("|")[0] != resolved} | {key: {"sha256": digest, "rows": rows}}
    _store_cache(cache_file, cache)
    return digest, rows
