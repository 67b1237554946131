"""The errors of data preparation.

- `DataPreparationError` (exit 1): the data cannot be fetched or written (hub unreachable, disk
  full): trying again later may work.
- `SourceDataError` (exit 2): the source itself is refused (a row, a column, a file of the
  source folder): the same source fails the same way every time, so the CLI reports it like a
  bad setting and a Kubernetes Job does not retry it.
- `RowError`: one source row cannot be converted; the caller adds the dataset, split and row.
"""

from __future__ import annotations

from recipe.errors import RecipeConfigError


class DataPreparationError(RuntimeError):
    """Loading or writing a dataset failed (hub unreachable, a write error).

    Bad input the user can fix by changing an argument (an unknown dataset, a --source that is
    not there or lacks a column) raises `recipe.errors.RecipeConfigError` instead, and a source
    whose content is refused raises `SourceDataError`. The message is one line and never
    contains HF_TOKEN or HF_ENDPOINT.
    """


class SourceDataError(RecipeConfigError):
    """The source is refused: one problem per line, each naming the split and row (or the file)
    and the rule it breaks. Nothing was written. The CLI prints them and exits with code 2.
    """


class RowError(ValueError):
    """A source row that cannot be converted; the caller adds the dataset, split and row index."""
