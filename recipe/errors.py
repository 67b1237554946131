"""The one error type for bad input, reported as one line per problem."""

from __future__ import annotations


class RecipeConfigError(Exception):
    """Bad settings or layout: every problem found, each naming variable, value and rule.

    The CLI prints one line per problem on stderr and exits with code 2.
    """

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


def report_errors(command: str, problems: list[str], exit_code: int, as_json: bool) -> int:
    """Print one `error: ` line per problem on stderr and, with --json, one JSON document on stdout; return exit_code.

    A caller that asked for JSON reads stdout alone: a failure is a document too
    ({"schema_version": 1, "command", "status": "error", "exit_code", "errors"}), never nothing.
    """
    import json
    import sys

    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if as_json:
        document = {"schema_version": 1, "command": command, "status": "error", "exit_code": exit_code, "errors": problems}
        print(json.dumps(document, indent=2))
    return exit_code
