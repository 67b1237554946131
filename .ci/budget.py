"""CI's time budget (.ci/budget.toml): the table docs/testing.md shows, and each phase's time beside its budget.

    python .ci/budget.py markdown            # the budget table, as docs/testing.md has it
    python .ci/budget.py report TIMES        # TIMES: lines "phase name<TAB>seconds", as .ci/run writes them
    python .ci/budget.py files JUNIT_XML     # where a pytest run's time went: the slowest test files

`report` warns about a phase or a total over its budget; it never fails a run (a slower machine is not a bug).
"""

from __future__ import annotations

import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

BUDGET_FILE = Path(__file__).with_name("budget.toml")


@dataclass(frozen=True)
class Row:
    """One phase of .ci/run (or room reserved for one to come), its budgets in minutes."""

    name: str
    warm: float
    cold: float
    reserved: bool = False


@dataclass(frozen=True)
class Budget:
    """The rows in .ci/run's order, the reserved rows after them, and the totals they must fit in."""

    rows: tuple[Row, ...]
    total_warm: float
    total_cold: float

    @property
    def phases(self) -> tuple[Row, ...]:
        return tuple(row for row in self.rows if not row.reserved)


def load(path: Path = BUDGET_FILE) -> Budget:
    """The budget file, read."""
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    rows = [Row(p["name"], float(p["warm"]), float(p["cold"])) for p in data["phase"]]
    rows += [Row(r["name"], float(r["warm"]), float(r["cold"]), reserved=True) for r in data.get("reserved", [])]
    return Budget(tuple(rows), float(data["totals"]["warm"]), float(data["totals"]["cold"]))


def _minutes(value: float) -> str:
    return f"{value:g}"


def markdown(budget: Budget) -> str:
    """The budget as a Markdown table: a row per phase, the reserved rows, the sum and the limit."""
    lines = ["| phase of `.ci/run` | warm (min) | cold (min) |", "| --- | ---: | ---: |"]
    for row in budget.rows:
        name = f"reserved: {row.name}" if row.reserved else f"`{row.name}`"
        lines.append(f"| {name} | {_minutes(row.warm)} | {_minutes(row.cold)} |")
    warm = sum(row.warm for row in budget.rows)
    cold = sum(row.cold for row in budget.rows)
    lines.append(f"| sum of the rows | {_minutes(warm)} | {_minutes(cold)} |")
    lines.append(f"| limit | {_minutes(budget.total_warm)} | {_minutes(budget.total_cold)} |")
    return "\n".join(lines)


def report(budget: Budget, times: dict[str, float]) -> tuple[list[str], list[str]]:
    """(the table of each phase's time beside its budgets, the warnings): a phase run but not budgeted is a warning."""
    lines = [f"{'phase':<38} {'took':>8} {'warm':>6} {'cold':>6}"]
    warnings = []
    for row in budget.phases:
        if row.name not in times:
            continue
        seconds = times[row.name]
        minutes = seconds / 60
        mark = " over the cold budget" if minutes > row.cold else " over the warm budget" if minutes > row.warm else ""
        lines.append(f"{row.name:<38} {minutes:6.1f} m {_minutes(row.warm):>6} {_minutes(row.cold):>6}{mark}")
        if mark:
            warnings.append(f"{row.name}: {minutes:.1f} min,{mark} ({_minutes(row.warm)} warm, {_minutes(row.cold)} cold)")
    for name in times.keys() - {row.name for row in budget.phases}:
        warnings.append(f"{name}: a phase of .ci/run with no row in .ci/budget.toml")
    total = sum(times.values()) / 60
    room = sum(row.warm for row in budget.rows if row.reserved), sum(row.cold for row in budget.rows if row.reserved)
    lines.append(f"{'total':<38} {total:6.1f} m {_minutes(budget.total_warm - room[0]):>6} "
                 f"{_minutes(budget.total_cold - room[1]):>6}  (the limits less the reserved rows)")
    if total > budget.total_cold - room[1]:
        warnings.append(f"total: {total:.1f} min, over the cold limit less the reserved rows")
    return lines, warnings


def read_times(path: Path) -> dict[str, float]:
    """Phase name -> seconds, from lines "name<TAB>seconds"."""
    times = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        name, _, seconds = line.rpartition("\t")
        times[name] = float(seconds)
    return times


def slowest_test_files(junit_xml: Path, top: int = 15) -> list[str]:
    """The TOP test files by the time their tests took (summed: under pytest-xdist, time of all workers), as lines."""
    import xml.etree.ElementTree as ElementTree
    from collections import Counter

    seconds: Counter[str] = Counter()
    count: Counter[str] = Counter()
    for case in ElementTree.parse(junit_xml).getroot().iter("testcase"):
        # classname is the dotted module path, then the class (capitalised) where the test is a method
        module = ".".join(part for part in case.get("classname", "").split(".") if not part[:1].isupper())
        name = module.replace(".", "/") + ".py"
        seconds[name] += float(case.get("time") or 0)
        count[name] += 1
    total = sum(seconds.values())
    lines = [f"{'test file':<58} {'tests':>6} {'seconds':>8} {'share':>6}"]
    for name, spent in seconds.most_common(top):
        lines.append(f"{name:<58} {count[name]:6d} {spent:8.1f} {spent / total:6.1%}")
    lines.append(f"{'all ' + str(len(seconds)) + ' files':<58} {sum(count.values()):6d} {total:8.1f}")
    return lines


def main(argv: list[str]) -> int:
    budget = load()
    if argv[:1] == ["markdown"]:
        print(markdown(budget))
        return 0
    if argv[:1] == ["report"] and len(argv) == 2:
        lines, warnings = report(budget, read_times(Path(argv[1])))
        for line in lines:
            print(f"[ci]   {line}")
        for warning in warnings:
            print(f"[ci] WARNING (budget): {warning}")
        return 0
    if argv[:1] == ["files"] and len(argv) == 2:
        for line in slowest_test_files(Path(argv[1])):
            print(f"[ci]   {line}")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
