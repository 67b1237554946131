"""What atomic writes clean up: stale temporary files by age and place, and a failed writer's leftovers at once."""

from __future__ import annotations

import gc
import os
import time
from pathlib import Path
from typing import BinaryIO

import pytest

from recipe import atomic
from recipe.atomic import AtomicFileSet, remove_stale_temps


def _temp(folder: Path, target: str, age_s: float) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f".{target}.abc123.tmp"
    path.write_bytes(b"half")
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


def test_by_default_a_temp_just_over_an_hour_old_is_stale(tmp_path: Path) -> None:
    stale, fresh = _temp(tmp_path / "a", "train.parquet", 3600.5), _temp(tmp_path / "b", "train.parquet", 3599.5)
    assert remove_stale_temps([tmp_path / "a" / "train.parquet", tmp_path / "b" / "train.parquet"]) == [stale]
    assert fresh.exists()


def test_a_temp_exactly_as_old_as_the_bound_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only temps *older* than `older_than_s` go."""
    now = 2_000_000_000.0
    monkeypatch.setattr(atomic.time, "time", lambda: now)
    temp = tmp_path / ".train.parquet.abc123.tmp"
    temp.write_bytes(b"half")
    os.utime(temp, (now - 600.0, now - 600.0))
    assert remove_stale_temps([tmp_path / "train.parquet"], older_than_s=600.0) == [] and temp.exists()
    assert remove_stale_temps([tmp_path / "train.parquet"], older_than_s=599.0) == [temp]


def test_a_target_whose_folder_is_gone_does_not_stop_the_sweep_of_the_others(tmp_path: Path) -> None:
    stale = _temp(tmp_path / "out", "test.parquet", 7200)
    assert remove_stale_temps([tmp_path / "gone" / "train.parquet", tmp_path / "out" / "test.parquet"]) == [stale]
    assert not stale.exists()


class _Finaliser:
    """What pyarrow's ParquetWriter does when it goes: write a last piece to its file."""

    def __init__(self, handle: BinaryIO, closed_when_finalised: list[bool]) -> None:
        self.handle, self.closed_when_finalised = handle, closed_when_finalised

    def __del__(self) -> None:
        self.closed_when_finalised.append(self.handle.closed)
        if not self.handle.closed:
            self.handle.write(b"footer")


def test_a_failed_writers_objects_go_while_its_file_is_still_open(tmp_path: Path) -> None:
    """A writer object the failure leaves in the traceback is freed before the file closes: no "Exception ignored"."""
    closed_when_finalised: list[bool] = []

    def write(handle: BinaryIO) -> None:
        writer = _Finaliser(handle, closed_when_finalised)
        writer.handle.write(b"rows")
        raise OSError("disk full")

    gc.disable()  # the order comes from reference counts alone, as in CPython without a cycle collection
    try:
        with pytest.raises(OSError, match="disk full"), AtomicFileSet() as files:
            files.stage(tmp_path / "train.parquet", write)
        finalised_before_the_exception_was_dropped = list(closed_when_finalised)
    finally:
        gc.enable()
        gc.collect()
    assert finalised_before_the_exception_was_dropped == [False]
    assert list(tmp_path.iterdir()) == []
