"""The one error type for bad input, reported as one line per problem."""

from __future__ import annotations


class RecipeConfigError(Exception):
    """Bad settings or layout: every problem found, each naming variable, value and rule.

    The CLI prints one line per problem on stderr and exits with code 2.
    """

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))
