"""The result of checking a Hugging Face export: what differs, and whether it is usable.

Status, from best to worst:
- complete: the shards hold exactly the tensors the HF model class expects, with
  the expected shapes, and the index (if any) lists exactly what the shards hold;
- lenient: every difference is allowed (a pattern the user gave, e.g. MTP layers, or
  one the HF class itself ignores on load), and nothing critical is missing;
- broken: anything else: a missing or mis-shaped tensor that is not allowed, a
  ghost index entry (HF loading crashes on it), an unreadable shard, or a critical
  part missing (embeddings, lm_head, a norm, or a whole layer), allowed or not.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

__all__ = ["EXIT_CODES", "ExportReport", "ShapeMismatch", "Status", "printable"]

Status = Literal["complete", "lenient", "broken"]

#: Exit code of `verify-export` per status: broken exports fail scripts and CI.
EXIT_CODES: dict[str, int] = {"complete": 0, "lenient": 0, "broken": 1}


def printable(text: str) -> str:
    """`text` safe to print on one line: each unprintable character (newline, carriage
    return, ESC of an ANSI sequence, U+2028, bidi controls, a lone surrogate) becomes
    its Python escape (`\\n`, `\\x1b`, `\\u2028`); everything else is kept as is.

    Tensor names come from the files being checked, so a name could otherwise forge
    report lines or terminal output. The JSON report keeps the exact names.
    """
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else ascii(char)[1:-1] for char in text)


@dataclass(frozen=True)
class ShapeMismatch:
    """A tensor whose shape on disk differs from what the HF class expects."""

    name: str
    expected: list[int]
    actual: list[int]


@dataclass(frozen=True)
class ExportReport:
    """What an exported HF checkpoint holds compared with what its model class expects.

    Every list is sorted and names exact tensors (on-disk names). `allowed` lists the
    differences excused by a pattern, each as "<name> (<pattern>)"; `critical` lists
    the reasons that make the export broken even where a pattern would allow it.
    """

    directory: str
    status: Status
    architecture: str
    expected_count: int
    present_count: int
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    shape_mismatches: list[ShapeMismatch] = field(default_factory=list)
    ghosts: list[str] = field(default_factory=list)
    unindexed: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    allowed: list[str] = field(default_factory=list)
    critical: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    reference: str | None = None

    @property
    def exit_code(self) -> int:
        """0 for complete or lenient, 1 for broken."""
        return EXIT_CODES[self.status]

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON: every field, shape mismatches as objects."""
        return asdict(self)

    def to_json(self) -> str:
        """One JSON document (sorted keys, two-space indent)."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def summary(self, limit: int = 20) -> str:
        """A human summary: the status first, then each kind of difference with its tensors.

        One report line per item: names and paths pass through `printable`.
        """
        headline = (
            f"HF export {printable(self.directory)}: {self.status.upper()} "
            f"({self.present_count} tensors present, {self.expected_count} expected by {printable(self.architecture)})"
        )
        lines = [headline]
        if self.reference:
            lines.append(f"  compared with reference checkpoint {printable(self.reference)}")

        def section(title: str, items: list[str]) -> None:
            if not items:
                return
            lines.append(f"  {title} ({len(items)}):")
            lines.extend(f"    - {printable(item)}" for item in items[:limit])
            if len(items) > limit:
                lines.append(f"    ... and {len(items) - limit} more (see --json)")

        section("errors", self.errors)
        section("critical", self.critical)
        section("missing (expected by the model class, in no shard)", self.missing)
        section(
            "shape mismatches",
            [f"{m.name}: expected {m.expected}, found {m.actual}" for m in self.shape_mismatches],
        )
        section("ghosts (listed in the index, not in the shard it names)", self.ghosts)
        section("unindexed (in a shard, not in the index: loaders skip them)", self.unindexed)
        section("unexpected (in a shard, not expected by the model class)", self.unexpected)
        section("dropped (in the reference checkpoint, not in the export)", self.dropped)
        section("allowed differences", self.allowed)
        if self.status == "complete":
            lines.append("  every expected tensor is present with the expected shape")
        elif self.status == "lenient":
            lines.append("  usable: every difference is allowed")
        else:
            lines.append("  NOT usable as a Hugging Face checkpoint: fix the export (see above)")
        return "\n".join(lines)
