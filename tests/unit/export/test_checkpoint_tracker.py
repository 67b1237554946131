"""The step verl 0.9.1 resumes from, read from its tracker file the way verl reads it, by direct calls.

`tracked_step_dir(root)` mirrors verl's `find_latest_ckpt_path(root)`: no tracker is a fresh
start (None), `int(f.read().decode())` of the tracker names `global_step_N`, a named step that
is not there is a fresh start too. Whatever verl would fail or hang on is a ResumeCheckError
whose one line names the tracker and why. test_resume_guard_hostile.py compares the reading
with verl's own function and runs the guard end to end; this file pins each outcome and each
message here, fast, without verl.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recipe import checkpoint_tracker
from recipe.checkpoint_tracker import MAX_TRACKER_BYTES, TRACKER_NAME, ResumeCheckError, tracked_step_dir
from recipe.digests import FileRefused


def _root(tmp_path: Path, tracker: bytes | None, *steps: int) -> Path:
    root = tmp_path / "ck"
    root.mkdir()
    for step in steps:
        (root / f"global_step_{step}").mkdir()
    if tracker is not None:
        (root / TRACKER_NAME).write_bytes(tracker)
    return root


def _refusal(root: Path) -> str:
    with pytest.raises(ResumeCheckError) as caught:
        tracked_step_dir(root)
    return str(caught.value)


def test_the_tracker_is_verls_file_name() -> None:
    # verl/utils/checkpoint/checkpoint_manager.py: get_checkpoint_tracker_filename
    assert TRACKER_NAME == "latest_checkpointed_iteration.txt"


def test_no_tracker_is_a_fresh_start(tmp_path: Path) -> None:
    assert tracked_step_dir(_root(tmp_path, None, 1)) is None


def test_a_tracker_that_is_a_dangling_link_is_a_fresh_start_like_verl(tmp_path: Path) -> None:
    # verl asks os.path.exists, which follows the link: nothing there, so it trains afresh.
    root = _root(tmp_path, None, 1)
    (root / TRACKER_NAME).symlink_to(root / "gone")
    assert tracked_step_dir(root) is None


def test_the_named_step_and_its_number_are_returned(tmp_path: Path) -> None:
    root = _root(tmp_path, b"40", 4, 40)
    assert tracked_step_dir(root) == (root / "global_step_40", 40)


# int() takes surrounding whitespace, leading zeros, a sign and underscores between digits.
@pytest.mark.parametrize("text", [b"040", b" 40\n", b"4_0", b"+40", b"\t40 ", b"0040"])
def test_every_spelling_int_accepts_names_the_same_step(tmp_path: Path, text: bytes) -> None:
    root = _root(tmp_path, text, 40)
    assert tracked_step_dir(root) == (root / "global_step_40", 40)


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(step=st.integers(0, 10**6), zeros=st.integers(0, 3), space=st.sampled_from(["", " ", "\n", "\t \n"]))
def test_any_step_number_is_read_as_verl_reads_it(
    tmp_path_factory: pytest.TempPathFactory, step: int, zeros: int, space: str
) -> None:
    root = tmp_path_factory.mktemp("ck")
    (root / f"global_step_{step}").mkdir()
    (root / TRACKER_NAME).write_bytes(f"{space}{'0' * zeros}{step}{space}".encode())
    assert tracked_step_dir(root) == (root / f"global_step_{step}", step)


def test_a_tracker_naming_a_missing_step_is_a_fresh_start_like_verl(tmp_path: Path) -> None:
    # verl: "Checkpoint does not exist", and it trains from scratch.
    assert tracked_step_dir(_root(tmp_path, b"41", 40)) is None


@pytest.mark.parametrize(
    ("text", "shown"),
    [(b"", "nothing"), (b" \n", "nothing but blanks"), (b"forty", "'forty'"), (b"\xff", "'\ufffd'"),
     (b"4.0", "'4.0'"), (b"4 0", "'4 0'"), (b"4\x1b[2J", "'4\\x1b[2J'")],
)  # fmt: skip
def test_a_tracker_verl_cannot_read_is_refused_naming_what_it_holds(tmp_path: Path, text: bytes, shown: str) -> None:
    """As text, a control character escaped, never as a byte string's b'...' (issue 54: the resume line reads well)."""
    root = _root(tmp_path, text, 4, 40)
    tracker = root / TRACKER_NAME
    assert _refusal(root) == (f"{tracker} holds {shown}, no step number: verl reads it with int(f.read().decode()) "
                              "and would fail on it")


def test_a_long_unreadable_tracker_is_shown_by_its_first_40_bytes(tmp_path: Path) -> None:
    """The line stays one short line however much the tracker holds."""
    root = _root(tmp_path, b"0123456789" * 4 + b"x" * 100)
    shown = repr("0123456789" * 4)
    assert _refusal(root) == (f"{root / TRACKER_NAME} holds {shown}, no step number: verl reads it with "
                              "int(f.read().decode()) and would fail on it")


@pytest.mark.parametrize(
    "plant",
    [pytest.param(lambda path: os.mkfifo(path), id="fifo"), pytest.param(lambda path: path.mkdir(), id="directory"),
     pytest.param(lambda path: path.symlink_to("/dev/zero"), id="link-to-dev-zero")],
)  # fmt: skip
def test_a_special_tracker_is_refused_without_blocking(tmp_path: Path, plant: Callable[[Path], None]) -> None:
    # A FIFO would block verl's open() until a writer comes: O_NONBLOCK here, so this returns at once.
    root = _root(tmp_path, None, 1)
    plant(root / TRACKER_NAME)
    tracker = root / TRACKER_NAME
    assert _refusal(root) == f"{tracker}: not a regular file: not a step number (verl would fail or wait forever on it)"


def test_a_tracker_of_exactly_the_bound_is_read(tmp_path: Path) -> None:
    # Whitespace pads it to MAX_TRACKER_BYTES; int() ignores it.
    root = _root(tmp_path, b" " * (MAX_TRACKER_BYTES - 1) + b"7", 7)
    assert tracked_step_dir(root) == (root / "global_step_7", 7)


def test_a_tracker_past_the_bound_is_refused_by_its_size(tmp_path: Path) -> None:
    root = _root(tmp_path, b" " * MAX_TRACKER_BYTES + b"7", 7)
    tracker = root / TRACKER_NAME
    assert MAX_TRACKER_BYTES == 1 << 20
    assert _refusal(root) == (
        f"{tracker}: 1.0 MiB, above the 1.0 MiB bound: not a step number (verl would fail or wait forever on it)"
    )


@pytest.mark.parametrize(
    ("where", "error", "shown"),
    [("open_regular", PermissionError(13, "Permission denied"), "cannot be opened (Permission denied)"),
     ("read_bounded", OSError(5, "Input/output error"), "cannot be read (Input/output error)"),
     # The file grew past the bound between the check and the read: FileRefused has no strerror.
     ("read_bounded", FileRefused("more than 1.0 MiB"), "cannot be read (more than 1.0 MiB)")],
)  # fmt: skip
def test_a_tracker_the_os_will_not_give_is_one_line_naming_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str, error: Exception, shown: str
) -> None:
    """Root opens any file here, so the OS's refusals are made by replacing the call that would get them."""
    root = _root(tmp_path, b"1", 1)

    def refuse(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr(checkpoint_tracker, where, refuse)
    assert _refusal(root) == f"{root / TRACKER_NAME} {shown}"


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counting open files needs /proc")
@pytest.mark.parametrize("tracker", [b"40", b"forty"])
def test_reading_the_tracker_leaves_no_file_open(tmp_path: Path, tracker: bytes) -> None:
    """plan and the resume guard read the tracker on every call of a long-lived process."""
    root = _root(tmp_path, tracker, 40)
    before = _open_fds()
    for _ in range(5):
        try:
            tracked_step_dir(root)
        except ResumeCheckError:
            pass
    assert _open_fds() == before
