"""The one error type for bad input, reported as one line per problem."""

from __future__ import annotations

import json
import sys


class RecipeConfigError(Exception):
    """Bad settings or layout: every problem found, each naming variable, value and rule.

    The CLI prints one line per problem on stderr and exits with code 2.
    """

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


#: The longest problem line printed: a value from a hostile file (a record, a config) can be megabytes.
MAX_LINE = 2000


def one_line(text: str) -> str:
    """`text` as one printable line of at most MAX_LINE characters (control characters escaped, the rest cut)."""
    # lazy: export.report is a room above errors, the lowest one
    from .export.report import printable

    shown = printable(text)
    return shown if len(shown) <= MAX_LINE else f"{shown[: MAX_LINE - 40]}... ({len(shown) - MAX_LINE + 40} more characters)"


def report_errors(command: str, problems: list[str], exit_code: int, as_json: bool) -> int:
    """Print one `error: ` line per problem on stderr and, with --json, one JSON document on stdout; return exit_code.

    A caller that asked for JSON reads stdout alone: a failure is a document too
    ({"schema_version": 1, "command", "status": "error", "exit_code", "errors"}), never nothing.
    Every line is one_line(): a problem may quote a hostile value, which must not forge lines.
    """
    lines = [one_line(problem) for problem in problems]
    for line in lines:
        print(f"error: {line}", file=sys.stderr)
    if as_json:
        document = {"schema_version": 1, "command": command, "status": "error", "exit_code": exit_code, "errors": lines}
        print(json.dumps(document, indent=2))
    return exit_code
