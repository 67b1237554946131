"""The error raised when data cannot be prepared for a reason that is not a bad setting."""

from __future__ import annotations


class DataPreparationError(RuntimeError):
    """Loading or converting a dataset failed (hub unreachable, a malformed row, a write error).

    Bad input the user can fix by changing an argument (an unknown dataset, a --source that is
    not there or lacks a column) raises `recipe.errors.RecipeConfigError` instead. The message is
    one line and never contains HF_TOKEN or HF_ENDPOINT.
    """
