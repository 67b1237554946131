"""Atomic writes: a reader sees the old complete file or the new one, never a part."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import pytest

from recipe.atomic import AtomicFileSet, atomic_write, remove_stale_temps


class Injected(Exception):
    """The failure a test throws into a write."""


def _write_then_fail(data: bytes) -> Callable[[BinaryIO], None]:
    """A writer that writes `data`, then fails."""

    def write(handle: BinaryIO) -> None:
        handle.write(data)
        raise Injected

    return write


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


def test_atomic_write_replaces_content_and_follows_the_umask(tmp_path: Path) -> None:
    target = tmp_path / "train.parquet"
    target.write_bytes(b"old")
    old_umask = os.umask(0o022)
    try:
        size = atomic_write(target, lambda f: f.write(b"new content"))
    finally:
        os.umask(old_umask)
    assert target.read_bytes() == b"new content"
    assert size == len(b"new content")
    # mkstemp alone would leave 0600: a file prepared as root must stay readable by the trainer's user.
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("error", [Injected("disk on fire"), KeyboardInterrupt()])
def test_failure_mid_write_keeps_the_old_file_and_leaves_no_temp(tmp_path: Path, error: BaseException) -> None:
    target = tmp_path / "train.parquet"
    target.write_bytes(b"complete earlier file")
    seen_partial: list[int] = []

    def write(handle: BinaryIO) -> None:
        handle.write(b"half of the new")
        handle.flush()
        seen_partial.append(os.fstat(handle.fileno()).st_size)
        raise error

    with pytest.raises(type(error)):
        atomic_write(target, write)
    assert seen_partial == [len(b"half of the new")]  # the failure really came mid-write
    assert target.read_bytes() == b"complete earlier file"
    assert _leftovers(tmp_path) == []


def test_failure_on_first_write_leaves_no_file(tmp_path: Path) -> None:
    target = tmp_path / "test.parquet"
    with pytest.raises(Injected):
        atomic_write(target, _write_then_fail(b"partial"))
    assert list(tmp_path.iterdir()) == []


def test_file_set_puts_nothing_in_place_unless_committed(tmp_path: Path) -> None:
    train, test = tmp_path / "train.parquet", tmp_path / "test.parquet"
    train.write_bytes(b"old train")
    with AtomicFileSet() as files:
        files.stage(train, lambda f: f.write(b"new train"))
        files.stage(test, lambda f: f.write(b"new test"))
    assert train.read_bytes() == b"old train"
    assert not test.exists()
    assert _leftovers(tmp_path) == []


def test_file_set_failure_in_second_file_keeps_both_old_files(tmp_path: Path) -> None:
    train, test = tmp_path / "train.parquet", tmp_path / "test.parquet"
    train.write_bytes(b"old train")
    test.write_bytes(b"old test")
    with pytest.raises(Injected), AtomicFileSet() as files:
        files.stage(train, lambda f: f.write(b"new train"))
        files.stage(test, _write_then_fail(b"new te"))
        files.commit()
    assert (train.read_bytes(), test.read_bytes()) == (b"old train", b"old test")
    assert _leftovers(tmp_path) == []


def test_file_set_commit_puts_all_in_place(tmp_path: Path) -> None:
    train, test = tmp_path / "train.parquet", tmp_path / "test.parquet"
    with AtomicFileSet() as files:
        staged = files.stage(train, lambda f: f.write(b"new train"))
        assert staged.parent == tmp_path and staged.name.startswith(".train.parquet.") and not train.exists()
        files.stage(test, lambda f: f.write(b"new test"))
        files.commit()
    assert (train.read_bytes(), test.read_bytes()) == (b"new train", b"new test")
    assert _leftovers(tmp_path) == []


def test_stale_temps_of_a_killed_run_are_removed_but_fresh_ones_kept(tmp_path: Path) -> None:
    target = tmp_path / "train.parquet"
    stale = tmp_path / ".train.parquet.abc123.tmp"
    fresh = tmp_path / ".train.parquet.def456.tmp"
    unrelated = tmp_path / ".other.parquet.abc.tmp"
    for path in (stale, fresh, unrelated):
        path.write_bytes(b"x")
    two_hours_ago = time.time() - 7200
    os.utime(stale, (two_hours_ago, two_hours_ago))
    os.utime(unrelated, (two_hours_ago, two_hours_ago))
    assert remove_stale_temps([target]) == [stale]
    assert not stale.exists() and fresh.exists() and unrelated.exists()


def test_the_temp_a_killed_stage_leaves_is_one_remove_stale_temps_finds(tmp_path: Path) -> None:
    """What stage() names its temporary file and what the clean-up looks for must agree, or a crash leaks files."""
    from recipe.atomic import AtomicFileSet

    target = tmp_path / "train.parquet"
    files = AtomicFileSet()
    temp = files.stage(target, lambda out: out.write(b"half"))  # then the process dies: no commit, no abort
    os.utime(temp, (time.time() - 7200, time.time() - 7200))
    assert remove_stale_temps([target]) == [temp] and not temp.exists()


def test_every_stale_temp_is_removed_whatever_comes_before_it(tmp_path: Path) -> None:
    target = tmp_path / "train.parquet"
    names = [tmp_path / f".train.parquet.{tag}.tmp" for tag in ("aaa", "bbb", "ccc", "ddd")]
    for at, path in enumerate(names):
        path.write_bytes(b"x")
        if at % 2:  # a fresh one between stale ones: the sweep goes on past it
            continue
        os.utime(path, (time.time() - 7200, time.time() - 7200))
    assert sorted(remove_stale_temps([target])) == [names[0], names[2]]


def test_abort_after_the_temp_is_gone_is_quiet(tmp_path: Path) -> None:
    """A clean-up of the folder (or another run's sweep) may remove the temporary file first."""
    from recipe.atomic import AtomicFileSet

    with AtomicFileSet() as files:
        files.stage(tmp_path / "a.json", lambda out: out.write(b"{}")).unlink()
    assert list(tmp_path.iterdir()) == []
