"""Names one slip from a name that is read: the typo check behind `did you mean` for variables and config keys.

A slip is one letter inserted or dropped, or two neighbours swapped (one step of the optimal string
alignment distance of Damerau-Levenshtein): HF_TOKNE for HF_TOKEN, lrr for lr; a wrong case alone
is one too (Trainer for trainer). One letter changed is not: real names often differ so
(RAY_NODE_IP and RAY_NODE_ID, NCCL's CPU and GPU pairs). Measured over recipe/env_names.json,
this calls 0.3 % of the libraries' real names a typo when each is left out of the list in turn
(4 of 1,315: RAY_TMPDIR and RAY_TEMPDIR, NCCL_ALL and NCCL_CALL); with a changed letter counted
too, 1.6 %; the ratio cutoff of recipe.env_warnings alone, 6 %.
"""

from __future__ import annotations

from collections.abc import Iterable


def slips(a: str, b: str, limit: int = 1) -> int:
    """The optimal string alignment distance of `a` and `b`, or `limit` + 1 once it is past `limit`."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    previous2: list[int] = []
    previous = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        row = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            row[j] = min(previous[j] + 1, row[j - 1] + 1, previous[j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                row[j] = min(row[j], previous2[j - 2] + 1)
        if min(row) > limit:
            return limit + 1
        previous2, previous = previous, row
    return min(previous[len(b)], limit + 1)


#: Shorter names are not called a slip of another (`lo` is no typo of `lr`), unless only their case differs.
MIN_SLIP_LENGTH = 3


def one_slip_from(name: str, candidates: Iterable[str]) -> str | None:
    """The candidate `name` is one slip from (its case alone first), or None; the first in sorted order of a tie."""
    known = sorted(set(candidates))
    if name in known:
        return None
    same_letters = [c for c in known if c.lower() == name.lower()]
    if same_letters:
        return same_letters[0]
    if len(name) < MIN_SLIP_LENGTH:
        return None
    return next((c for c in known if slips(name, c) <= 1 and not _one_letter_changed(name, c)), None)


def _one_letter_changed(a: str, b: str) -> bool:
    """Same length, one position differs: often two real names (RAY_NODE_IP, RAY_NODE_ID; NCCL's CPU and GPU ones)."""
    return len(a) == len(b) and sum(x != y for x, y in zip(a, b)) == 1
