"""Data preparation: Hugging Face datasets -> the parquet files verl's RL trainer reads.

`prepare_dataset("geo3k", out_dir)` writes `out_dir/train.parquet` and `out_dir/test.parquet`.
Importing this package is cheap: `datasets` and `pyarrow` load only when data is prepared.
"""

from recipe.data.errors import DataPreparationError
from recipe.data.prepare import PreparedData, PreparedFile, prepare_dataset
from recipe.data.specs import SPECS, SPLITS, DatasetName

__all__ = [
    "SPECS",
    "SPLITS",
    "DataPreparationError",
    "DatasetName",
    "PreparedData",
    "PreparedFile",
    "prepare_dataset",
]
