"""What verl 0.9.1 resumes from: the step its tracker file names, read as verl reads it, and never hanging.

The drift guard (recipe.plan) compares the record of that step, and the resume guard
(recipe.run.resume_guard) checks its Hugging Face export; both read the tracker here.
"""

from __future__ import annotations

import os
from pathlib import Path

from recipe.read_back import FileRefused, open_regular, read_bounded

#: verl 0.9.1's tracker of the newest save, in trainer.default_local_dir (checkpoint_manager.py):
#: present, verl resumes.
TRACKER_NAME = "latest_checkpointed_iteration.txt"
#: A tracker larger than this holds no step number the guard will read.
MAX_TRACKER_BYTES = 1 << 20


class ResumeCheckError(Exception):
    """The guard cannot tell what verl would resume from: it refuses."""


def tracked_step_dir(root: Path) -> tuple[Path, int] | None:
    """The step directory verl 0.9.1's `find_latest_ckpt_path(root)` returns, and its step; None where verl trains afresh.

    Mirrors verl (verl/utils/checkpoint/checkpoint_manager.py): no tracker -> None; else
    `int(open(tracker, "rb").read().decode())` (so `040`, ` 40\n`, `4_0` and `+40` all mean 40)
    and `os.path.join(root, f"global_step_{n}")`, None when that path does not exist. Where
    verl would raise (undecodable or non-integer text, a directory) or hang (a FIFO: verl's open
    waits for a writer), this raises ResumeCheckError; it never opens anything in a blocking way.
    """
    tracker = os.path.join(root, TRACKER_NAME)
    if not os.path.exists(tracker):
        return None
    try:
        fd, _ = open_regular(Path(tracker), MAX_TRACKER_BYTES)
    except FileRefused as error:
        raise ResumeCheckError(f"{error}: not a step number (verl would fail or wait forever on it)") from None
    except OSError as error:
        raise ResumeCheckError(f"{tracker} cannot be opened ({error.strerror})") from None
    try:
        data = read_bounded(fd, MAX_TRACKER_BYTES)
    except (OSError, FileRefused) as error:
        raise ResumeCheckError(f"{tracker} cannot be read ({getattr(error, 'strerror', None) or error})") from None
    finally:
        os.close(fd)
    try:
        iteration = int(data.decode())
    except (UnicodeDecodeError, ValueError):
        # Said as text (a byte string's b'' reads as noise); an empty tracker, as the empty file it is.
        shown = repr(data[:40].decode("utf-8", errors="replace")) if data.strip() else "nothing but blanks" if data else "nothing"
        raise ResumeCheckError(
            f"{tracker} holds {shown}, no step number: verl reads it with int(f.read().decode()) and would fail on it"
        ) from None
    step_dir = os.path.join(root, f"global_step_{iteration}")
    if not os.path.exists(step_dir):
        return None  # verl: "Checkpoint does not exist", training from scratch
    return Path(step_dir), iteration
