"""Bounded hashing and the hash cache by direct calls: what is hashed, what is refused with which line, what is cached.

docs/reproducibility.md ("Hashing is bounded"): a data file is hashed up to 64 GiB, a model file up to 1 GiB, and
nothing past the bound is read; anything not a regular file is refused by name. Data hashes are
cached in $XDG_CACHE_HOME/grpo-recipe/sha256.json, keyed by path, size, mtime, ctime, inode and
device, used only while the folder is this user's with mode 0700 and the file is this user's
and regular; a file changed within the last second is not cached. test_provenance.py and
test_record_hostile.py reach this through plan; this file pins it fast: the clock is moved
instead of waited for, sparse files stand for large ones, and digests come from hashlib.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recipe import digests
from recipe.digests import (
    CACHE_MAX_BYTES,
    CHUNK,
    MAX_DATA_BYTES,
    MAX_MODEL_FILE_BYTES,
    RACY_NS,
    FileRefused,
    cache_dir,
    cached_digest,
    hash_cache_path,
    identity,
    open_regular,
    parquet_rows,
    read_bounded,
    sha256_file,
)

OTHER_UID = 4242
#: sha256 of b"abc" and of nothing (FIPS 180-2's test vectors).
ABC = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
NOTHING = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _sparse(path: Path, size: int) -> Path:
    with open(path, "wb") as handle:
        handle.truncate(size)  # nothing on disk, and nothing read to refuse it
    return path


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counting open files needs /proc")


def test_the_bounds_are_the_documented_ones() -> None:
    # docs/reproducibility.md: data up to 64 GiB, a model file up to 1 GiB, "a file changed within the last second is not cached".
    assert (MAX_DATA_BYTES, MAX_MODEL_FILE_BYTES, RACY_NS) == (64 * 2**30, 2**30, 10**9)


# --- open_regular: a regular file within its bound, or a refusal naming it -----------------------


@pytest.mark.parametrize(
    ("size", "limit", "shown"),
    [
        (1, 0, "1 B, above the 0 B bound"),
        (1024, 1023, "1.0 KiB, above the 1023 B bound"),
        (1536, 1024, "1.5 KiB, above the 1.0 KiB bound"),
        ((1 << 20) - 1, 1 << 10, "1024.0 KiB, above the 1.0 KiB bound"),
        ((1 << 20) + 1, 1 << 20, "1.0 MiB, above the 1.0 MiB bound"),
        (5 << 29, 1 << 30, "2.5 GiB, above the 1.0 GiB bound"),
        (2 << 40, MAX_DATA_BYTES, "2.0 TiB, above the 64.0 GiB bound"),
        (3 << 42, 1 << 40, "12.0 TiB, above the 1.0 TiB bound"),  # ext4 allows up to 16 TiB
    ],
)  # fmt: skip
def test_a_file_above_its_bound_is_refused_with_both_sizes_in_binary_units(
    tmp_path: Path, size: int, limit: int, shown: str
) -> None:
    path = _sparse(tmp_path / "big", size)
    with pytest.raises(FileRefused) as caught:
        open_regular(path, limit)
    assert str(caught.value) == f"{path}: {shown}"


@pytest.mark.parametrize("size", [0, 1, 4096])
def test_a_file_of_exactly_its_bound_is_opened_with_its_stat(tmp_path: Path, size: int) -> None:
    path = _write(tmp_path / "f", b"x" * size)
    fd, info = open_regular(path, size)
    try:
        assert info.st_size == size and info.st_ino == path.stat().st_ino
        assert os.read(fd, size + 1) == b"x" * size
        assert not os.get_inheritable(fd)  # a child process (the trainer) does not get it
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    "plant",
    [pytest.param(lambda path: path.mkdir(), id="directory"),
     pytest.param(lambda path: path.symlink_to("/dev/zero"), id="link-to-dev-zero"),
     pytest.param(lambda path: path.symlink_to("/dev/null"), id="link-to-dev-null")],
)  # fmt: skip
def test_a_special_file_is_refused_as_not_regular(tmp_path: Path, plant: Callable[[Path], None]) -> None:
    path = tmp_path / "f"
    plant(path)
    with pytest.raises(FileRefused) as caught:
        open_regular(path, MAX_DATA_BYTES)
    assert str(caught.value) == f"{path}: not a regular file"


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    outcome: list[BaseException] = []

    def attempt() -> None:
        try:
            os.close(open_regular(path, MAX_DATA_BYTES)[0])
        except BaseException as error:  # noqa: BLE001 - inspected in the test's thread
            outcome.append(error)

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(5)
    blocked = worker.is_alive()
    if blocked:  # free the blocked open by being its writer, then fail
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(5)
    assert not blocked, "opening a FIFO waited for a writer"
    assert [str(error) for error in outcome] == [f"{path}: not a regular file"]


def test_a_link_is_followed_unless_asked_not_to(tmp_path: Path) -> None:
    real = _write(tmp_path / "real", b"abc")
    (tmp_path / "link").symlink_to(real)
    fd, info = open_regular(tmp_path / "link", 3)
    os.close(fd)
    assert info.st_ino == real.stat().st_ino
    with pytest.raises(OSError):  # ELOOP: the cache file is never read through a link
        open_regular(tmp_path / "link", 3, follow=False)
    fd, _ = open_regular(real, 3, follow=False)
    os.close(fd)


@needs_proc
def test_a_refused_file_leaves_no_file_open(tmp_path: Path) -> None:
    big = _sparse(tmp_path / "big", 10)
    (tmp_path / "dir").mkdir()
    before = _open_fds()
    for path in (big, tmp_path / "dir") * 3:
        with pytest.raises(FileRefused):
            open_regular(path, 5)
    assert _open_fds() == before


# --- read_bounded: all of it, or a refusal after at most one byte past the bound ----------------


@pytest.mark.parametrize("size", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 7])
def test_a_file_within_the_bound_is_read_whole(tmp_path: Path, size: int) -> None:
    data = os.urandom(size)
    path = _write(tmp_path / "f", data)
    with open(path, "rb") as handle:
        assert read_bounded(handle.fileno(), size) == data


@pytest.mark.parametrize(("size", "limit"), [(1, 0), (11, 10), (CHUNK + 1, CHUNK), (3 * CHUNK, 2 * CHUNK + 3)])
def test_a_file_past_the_bound_is_refused_having_read_one_byte_more_at_most(tmp_path: Path, size: int, limit: int) -> None:
    path = _write(tmp_path / "f", b"y" * size)
    with open(path, "rb") as handle:
        with pytest.raises(FileRefused) as caught:
            read_bounded(handle.fileno(), limit)
        assert handle.tell() == limit + 1  # the one byte that shows the file holds more
    assert str(caught.value) == f"more than {digests._size_text(limit)}"


# --- sha256_file -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("data", "digest"), [(b"abc", ABC), (b"", NOTHING)])
def test_the_digest_is_sha256_of_the_content(tmp_path: Path, data: bytes, digest: str) -> None:
    assert sha256_file(_write(tmp_path / "f", data)) == digest


@settings(max_examples=10, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(size=st.sampled_from([CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 5]), seed=st.integers(0, 255))
def test_a_file_of_several_chunks_is_hashed_whole(tmp_path_factory: pytest.TempPathFactory, size: int, seed: int) -> None:
    data = bytes((seed + i) % 251 for i in range(256)) * (size // 256) + b"t" * (size % 256)
    path = _write(tmp_path_factory.mktemp("h") / "f", data)
    assert sha256_file(path, size) == hashlib.sha256(data).hexdigest()


def test_a_data_file_past_64_gib_is_refused_without_reading_it(tmp_path: Path) -> None:
    path = _sparse(tmp_path / "train.parquet", MAX_DATA_BYTES + 1)
    with pytest.raises(FileRefused) as caught:
        sha256_file(path)
    assert str(caught.value) == f"{path}: 64.0 GiB, above the 64.0 GiB bound"


def test_a_file_that_grows_while_it_is_hashed_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bound holds even for a file appended to after its size was checked (a writer still at work)."""
    path = _write(tmp_path / "f", b"a" * 100)
    checked = digests.open_regular

    def then_grows(*args: Any, **kwargs: Any) -> tuple[int, os.stat_result]:
        opened = checked(*args, **kwargs)
        with open(path, "ab") as handle:
            handle.write(b"b" * 2000)
        return opened

    monkeypatch.setattr(digests, "open_regular", then_grows)
    with pytest.raises(FileRefused) as caught:
        sha256_file(path, 1024)
    assert str(caught.value) == f"{path}: grew past the 1.0 KiB that is hashed while it was read"


def test_a_file_that_grows_within_its_bound_is_hashed_as_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path / "f", b"a" * 100)
    checked = digests.open_regular

    def then_grows(*args: Any, **kwargs: Any) -> tuple[int, os.stat_result]:
        opened = checked(*args, **kwargs)
        with open(path, "ab") as handle:
            handle.write(b"b" * 24)
        return opened

    monkeypatch.setattr(digests, "open_regular", then_grows)
    assert sha256_file(path, 124) == hashlib.sha256(b"a" * 100 + b"b" * 24).hexdigest()


def test_a_file_that_grows_past_its_bound_over_several_reads_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each read is within the bound; together they are not (a writer appending while a large file is hashed)."""
    path = _write(tmp_path / "f", b"a" * CHUNK)
    checked = digests.open_regular

    def then_grows(*args: Any, **kwargs: Any) -> tuple[int, os.stat_result]:
        opened = checked(*args, **kwargs)
        with open(path, "ab") as handle:
            handle.write(b"b" * 20)
        return opened

    monkeypatch.setattr(digests, "open_regular", then_grows)
    with pytest.raises(FileRefused) as caught:
        sha256_file(path, CHUNK + 10)
    assert str(caught.value) == f"{path}: grew past the 1.0 MiB that is hashed while it was read"


@needs_proc
def test_hashing_leaves_no_file_open(tmp_path: Path) -> None:
    path = _write(tmp_path / "f", b"abc")
    before = _open_fds()
    for _ in range(3):
        sha256_file(path)
    assert _open_fds() == before


# --- parquet_rows -----------------------------------------------------------------------------------


def test_the_rows_of_a_parquet_file_come_from_its_footer(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"n": list(range(7))}), tmp_path / "t.parquet")
    rows = parquet_rows(tmp_path / "t.parquet")
    assert rows == 7 and type(rows) is int


def test_a_file_that_is_not_parquet_has_no_row_count(tmp_path: Path) -> None:
    assert parquet_rows(_write(tmp_path / "t.jsonl", b'{"n": 1}\n')) is None


def test_without_pyarrow_there_is_no_row_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)  # `import pyarrow.parquet` raises ImportError
    assert parquet_rows(_write(tmp_path / "t.parquet", b"PAR1")) is None


# --- where the cache lives ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("environ", "under_home"),
    [({}, True), ({"XDG_CACHE_HOME": ""}, True), ({"XDG_CACHE_HOME": "relative/cache"}, True),
     ({"XDG_CACHE_HOME": "/xdg/cache"}, False)],
)  # fmt: skip
def test_the_cache_is_under_xdg_cache_home_when_absolute_else_under_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, environ: dict[str, str], under_home: bool
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    folder = tmp_path / "home" / ".cache" / "grpo-recipe" if under_home else Path("/xdg/cache/grpo-recipe")
    assert (cache_dir(environ), hash_cache_path(environ)) == (folder, folder / "sha256.json")


def test_the_cache_key_is_the_resolved_path_and_every_stat_field(tmp_path: Path) -> None:
    real = _write(tmp_path / "real.parquet", b"x")
    (tmp_path / "link.parquet").symlink_to(real)
    info = SimpleNamespace(st_size=1, st_mtime_ns=2, st_ctime_ns=3, st_ino=4, st_dev=5)
    assert identity(tmp_path / "link.parquet", info) == f"{real}|1|2|3|4|5"  # type: ignore[arg-type]


# --- cached_digest: believed only as far as its evidence goes -------------------------------------


@pytest.fixture
def environ(tmp_path: Path) -> dict[str, str]:
    return {"XDG_CACHE_HOME": str(tmp_path / "xdg")}


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Callable[[Path, int], None]:
    """Set "now" to a file's ctime plus some nanoseconds, instead of waiting out the racy second."""

    def set_age(path: Path, age_ns: int) -> None:
        now = os.stat(path).st_ctime_ns + age_ns
        monkeypatch.setattr(time, "time_ns", lambda: now)

    return set_age


def _cache(environ: dict[str, str]) -> Any:
    return json.loads(hash_cache_path(environ).read_text())


def _aged(path: Path, clock: Callable[[Path, int], None]) -> Path:
    clock(path, RACY_NS)
    return path


def test_a_digest_is_cached_under_the_files_identity(tmp_path: Path, environ: dict[str, str], clock: Any) -> None:
    data = _aged(_write(tmp_path / "train.jsonl", b"abc"), clock)
    assert cached_digest(data, environ) == (ABC, None)
    assert _cache(environ) == {identity(data, os.stat(data)): {"sha256": ABC, "rows": None}}


def test_the_rows_of_a_parquet_file_are_cached_beside_its_digest(tmp_path: Path, environ: dict[str, str], clock: Any) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "train.parquet"
    pq.write_table(pa.table({"n": [1, 2, 3]}), path)
    _aged(path, clock)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert cached_digest(path, environ) == (digest, 3)
    assert list(_cache(environ).values()) == [{"sha256": digest, "rows": 3}]
    assert cached_digest(path, environ) == (digest, 3)


def _forge(environ: dict[str, str], entry: Any) -> None:
    """Make every entry of the cache say `entry`."""
    cache = _cache(environ)
    hash_cache_path(environ).write_text(json.dumps({key: entry for key in cache}))


@pytest.mark.parametrize("rows", [None, 0, 12])
def test_a_believable_entry_is_used_without_hashing_again(
    tmp_path: Path, environ: dict[str, str], clock: Any, rows: int | None
) -> None:
    data = _aged(_write(tmp_path / "train.jsonl", b"abc"), clock)
    cached_digest(data, environ)
    _forge(environ, {"sha256": "f" * 64, "rows": rows})
    assert cached_digest(data, environ) == ("f" * 64, rows)


@pytest.mark.parametrize(
    "entry",
    [None, "f" * 64, ["f" * 64], {}, {"sha256": None}, {"sha256": 7}, {"sha256": "f" * 63}, {"sha256": "f" * 65},
     {"sha256": "f" * 64, "rows": "3"}, {"sha256": "f" * 64, "rows": 3.0}, {"sha256": "f" * 64, "rows": True},
     {"sha256": "f" * 64, "rows": [3]}],
    ids=repr,
)  # fmt: skip
def test_an_entry_that_is_not_a_digest_is_not_believed(tmp_path: Path, environ: dict[str, str], clock: Any, entry: Any) -> None:
    data = _aged(_write(tmp_path / "train.jsonl", b"abc"), clock)
    cached_digest(data, environ)
    _forge(environ, entry)
    assert cached_digest(data, environ) == (ABC, None)
    assert list(_cache(environ).values()) == [{"sha256": ABC, "rows": None}]  # and the lie is replaced


def test_an_entry_without_rows_counts_as_no_row_count(tmp_path: Path, environ: dict[str, str], clock: Any) -> None:
    data = _aged(_write(tmp_path / "train.jsonl", b"abc"), clock)
    cached_digest(data, environ)
    _forge(environ, {"sha256": "f" * 64})
    assert cached_digest(data, environ) == ("f" * 64, None)


@pytest.mark.parametrize(("age_ns", "cached"), [(0, False), (RACY_NS - 1, False), (RACY_NS, True), (10 * RACY_NS, True)])
def test_a_file_changed_within_the_last_second_is_hashed_but_not_cached(
    tmp_path: Path, environ: dict[str, str], clock: Any, age_ns: int, cached: bool
) -> None:
    """Its ctime could still repeat: a rewrite within the filesystem's clock tick keeps it (git's racy files)."""
    data = _write(tmp_path / "train.jsonl", b"abc")
    clock(data, age_ns)
    assert cached_digest(data, environ) == (ABC, None)
    assert hash_cache_path(environ).exists() == cached
    assert cache_dir(environ).exists() == cached  # looking the file up creates nothing


def test_a_changed_file_replaces_its_own_entry_and_keeps_the_others(tmp_path: Path, environ: dict[str, str], clock: Any) -> None:
    first = _aged(_write(tmp_path / "a.jsonl", b"abc"), clock)
    second = _aged(_write(tmp_path / "b.jsonl", b""), clock)
    cached_digest(first, environ)
    cached_digest(second, environ)
    _write(first, b"abcd")
    _aged(first, clock)
    assert cached_digest(first, environ)[0] == hashlib.sha256(b"abcd").hexdigest()
    assert _cache(environ) == {
        identity(first, os.stat(first)): {"sha256": hashlib.sha256(b"abcd").hexdigest(), "rows": None},
        identity(second, os.stat(second)): {"sha256": NOTHING, "rows": None},
    }


@pytest.mark.parametrize("xdg", ["home/user/.xdg-cache", "existing"])
def test_the_cache_folder_is_made_private_with_its_parents(tmp_path: Path, clock: Any, xdg: str) -> None:
    """A fresh home has no XDG_CACHE_HOME yet, nor its parents; a used one has it but not our folder."""
    (tmp_path / "existing").mkdir()
    environ = {"XDG_CACHE_HOME": str(tmp_path / xdg)}
    data = _aged(_write(tmp_path / "train.jsonl", b"abc"), clock)
    old = os.umask(0)
    try:
        cached_digest(data, environ)
    finally:
        os.umask(old)
    info = os.lstat(cache_dir(environ))
    assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.geteuid()
    assert list(_cache(environ).values()) == [{"sha256": ABC, "rows": None}]


def test_an_existing_private_folder_is_used(tmp_path: Path, environ: dict[str, str], clock: Any) -> None:
    cache_dir(environ).mkdir(parents=True, mode=0o700)
    data = _aged(_write(tmp_path / "train.jsonl", b"abc"), clock)
    cached_digest(data, environ)
    assert list(_cache(environ).values()) == [{"sha256": ABC, "rows": None}]


@pytest.mark.parametrize("mode", [0o701, 0o702, 0o704, 0o710, 0o720, 0o740, 0o755, 0o777])
def test_a_folder_others_may_enter_is_neither_read_nor_written(
    tmp_path: Path, environ: dict[str, str], clock: Any, mode: int
) -> None:
    data = _aged(_write(tmp_path / "train.jsonl", b"abc"), clock)
    cached_digest(data, environ)
    _forge(environ, {"sha256": "f" * 64, "rows": None})
    cache_dir(environ).chmod(mode)
    before = hash_cache_path(environ).read_bytes()
    assert cached_digest(data, environ) == (ABC, None)  # the forged entry is not believed
    assert hash_cache_path(environ).read_bytes() == before  # nor is the cache rewritten there


def _folder_of_another_user(environ: dict[str, str]) -> None:
    os.chown(cache_dir(environ), OTHER_UID, -1)


def _file_of_another_user(environ: dict[str, str]) -> None:
    os.chown(hash_cache_path(environ), OTHER_UID, -1)


def _folder_is_a_link(environ: dict[str, str]) -> None:
    folder = cache_dir(environ)
    folder.rename(folder.with_name("elsewhere"))
    folder.symlink_to(folder.with_name("elsewhere"))


def _file_is_a_link(environ: dict[str, str]) -> None:
    cache = hash_cache_path(environ)
    cache.rename(cache.with_name("forged.json"))
    cache.symlink_to(cache.with_name("forged.json"))


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
@pytest.mark.parametrize("make_hostile", [_folder_of_another_user, _file_of_another_user, _folder_is_a_link, _file_is_a_link])
def test_a_cache_others_could_have_written_is_not_believed(
    tmp_path: Path, environ: dict[str, str], clock: Any, make_hostile: Callable[[dict[str, str]], None]
) -> None:
    data = _aged(_write(tmp_path / "train.jsonl", b"abc"), clock)
    cached_digest(data, environ)
    _forge(environ, {"sha256": "f" * 64, "rows": None})
    assert cached_digest(data, environ) == ("f" * 64, None)  # the premise: a private cache is believed
    make_hostile(environ)
    assert cached_digest(data, environ) == (ABC, None)


@pytest.mark.parametrize(
    "content",
    [b"[]", b'"text"', b"null", b"{", b"\xff\xfe{", b"[" * 100_000 + b"]" * 100_000],
    ids=["list", "string", "null", "truncated", "not-utf8", "deep"],
)
def test_a_cache_file_that_is_not_one_json_object_is_an_empty_cache(
    tmp_path: Path, environ: dict[str, str], clock: Any, content: bytes
) -> None:
    data = _aged(_write(tmp_path / "train.jsonl", b"abc"), clock)
    cache_dir(environ).mkdir(parents=True, mode=0o700)
    hash_cache_path(environ).write_bytes(content)
    assert cached_digest(data, environ) == (ABC, None)
    assert list(_cache(environ).values()) == [{"sha256": ABC, "rows": None}]  # written afresh


@pytest.mark.parametrize(("padding", "believed"), [(0, True), (1, False)])
def test_a_cache_file_past_4_mib_is_an_empty_cache(
    tmp_path: Path, environ: dict[str, str], clock: Any, padding: int, believed: bool
) -> None:
    data = _aged(_write(tmp_path / "train.jsonl", b"abc"), clock)
    cached_digest(data, environ)
    _forge(environ, {"sha256": "f" * 64, "rows": None})
    text = hash_cache_path(environ).read_bytes()
    hash_cache_path(environ).write_bytes(text + b" " * (CACHE_MAX_BYTES - len(text) + padding))
    assert CACHE_MAX_BYTES == 4 << 20
    assert cached_digest(data, environ) == (("f" * 64) if believed else ABC, None)


@pytest.mark.parametrize(
    "plant",
    [pytest.param(lambda cache: os.mkfifo(cache), id="fifo"), pytest.param(lambda cache: cache.mkdir(), id="directory")],
)  # fmt: skip
def test_a_special_cache_file_is_an_empty_cache_at_once(
    tmp_path: Path, environ: dict[str, str], clock: Any, plant: Callable[[Path], None]
) -> None:
    data = _aged(_write(tmp_path / "train.jsonl", b"abc"), clock)
    cache_dir(environ).mkdir(parents=True, mode=0o700)
    plant(hash_cache_path(environ))
    assert cached_digest(data, environ) == (ABC, None)


def test_a_cache_that_cannot_be_written_is_skipped_silently(tmp_path: Path, environ: dict[str, str], clock: Any) -> None:
    """A directory where the cache file goes: the rename over it fails, and hashing still answers."""
    data = _aged(_write(tmp_path / "train.jsonl", b"abc"), clock)
    cache_dir(environ).mkdir(parents=True, mode=0o700)
    (hash_cache_path(environ) / "keep").mkdir(parents=True)
    assert cached_digest(data, environ) == (ABC, None)
    assert hash_cache_path(environ).is_dir()


def test_a_cache_folder_that_cannot_be_made_is_no_cache(tmp_path: Path, clock: Any) -> None:
    _write(tmp_path / "xdg", b"a file where the folder's parent goes")
    data = _aged(_write(tmp_path / "train.jsonl", b"abc"), clock)
    assert cached_digest(data, {"XDG_CACHE_HOME": str(tmp_path / "xdg")}) == (ABC, None)
    assert (tmp_path / "xdg").read_bytes() == b"a file where the folder's parent goes"


def test_a_cache_folder_that_is_a_file_is_no_cache(tmp_path: Path, environ: dict[str, str], clock: Any) -> None:
    cache_dir(environ).parent.mkdir()
    _write(cache_dir(environ), b"not a folder")
    data = _aged(_write(tmp_path / "train.jsonl", b"abc"), clock)
    assert cached_digest(data, environ) == (ABC, None)
    assert cache_dir(environ).read_bytes() == b"not a folder"


@pytest.mark.parametrize("limit", [2, 0])
def test_a_file_above_the_callers_bound_is_refused_before_the_cache_is_asked(
    tmp_path: Path, environ: dict[str, str], limit: int
) -> None:
    data = _write(tmp_path / "train.jsonl", b"abc")
    with pytest.raises(FileRefused) as caught:
        cached_digest(data, environ, limit)
    assert str(caught.value) == f"{data}: 3 B, above the {limit} B bound"
    assert not cache_dir(environ).exists()


def test_a_file_that_grows_past_the_callers_bound_after_its_check_is_refused(
    tmp_path: Path, environ: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model file's bound (1 GiB) holds for the hashing too, not only for the first look at its size."""
    data = _write(tmp_path / "config.json", b"{}")
    checked = digests.open_regular
    looks: list[int] = []

    def grows_after_the_first_look(*args: Any, **kwargs: Any) -> tuple[int, os.stat_result]:
        opened = checked(*args, **kwargs)
        if not looks:
            _write(data, b"{" + b" " * 30 + b"}")
        looks.append(1)
        return opened

    monkeypatch.setattr(digests, "open_regular", grows_after_the_first_look)
    with pytest.raises(FileRefused) as caught:
        cached_digest(data, environ, 10)
    assert str(caught.value) == f"{data}: 32 B, above the 10 B bound"


def test_a_data_file_past_64_gib_is_refused_by_default(tmp_path: Path, environ: dict[str, str]) -> None:
    data = _sparse(tmp_path / "train.parquet", MAX_DATA_BYTES + 1)
    with pytest.raises(FileRefused) as caught:
        cached_digest(data, environ)
    assert str(caught.value) == f"{data}: 64.0 GiB, above the 64.0 GiB bound"


@needs_proc
def test_the_cache_leaves_no_file_open(tmp_path: Path, environ: dict[str, str], clock: Any) -> None:
    data = _aged(_write(tmp_path / "train.jsonl", b"abc"), clock)
    cached_digest(data, environ)
    before = _open_fds()
    for content in (b"{}", b"[", b"[]"):  # read, refused by the parser, not an object
        hash_cache_path(environ).write_bytes(content)
        cached_digest(data, environ)
    cached_digest(data, environ)  # and believed
    assert _open_fds() == before


@pytest.mark.parametrize("limit", [0, 1, 2, (1 << 20) - 1, 1 << 20, (1 << 20) + 1])  # around read_back's CHUNK too
def test_read_file_takes_a_file_of_exactly_its_bound_and_refuses_one_byte_more(tmp_path: Path, limit: int) -> None:
    """Issue 52: the bound itself, named (read_back.read_file and read_json read up to it, and no further)."""
    from recipe.read_back import read_file, read_json

    exact = _write(tmp_path / "exact", b"7" * limit)
    assert read_file(exact, limit) == b"7" * limit
    over = _write(tmp_path / "over", b"7" * (limit + 1))
    with pytest.raises(FileRefused, match="above the"):
        read_file(over, limit)
    if 0 < limit < 100:  # a JSON number of `limit` digits, read at its bound
        assert read_json(exact, limit) == int("7" * limit)
