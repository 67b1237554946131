"""The bench profile (PROFILE=bench): the real model on the real layout for a few steps of fixed synthetic prompts.

It answers two questions before a long run: tokens per second per device on this layout, and
the measured memory against `plan`'s estimate (recipe.run.report, printed at the end). The
parts:
- profile: its settings and Hydra overrides (steps, fixed response lengths, no validation,
  no checkpoint unless asked);
- data: the synthetic prompts, each with its own image, in geo3k's row layout, written by `run`
  under CHECKPOINT_DIR (no download).
Importing this package imports neither Pillow nor datasets.
"""

from recipe.bench.data import row_counts, write_bench_data
from recipe.bench.profile import (
    BENCH_SETTINGS,
    BENCH_STEPS,
    bench_data_dir,
    bench_data_note,
    bench_overrides,
    bench_rows,
)

__all__ = ["BENCH_SETTINGS", "BENCH_STEPS", "bench_data_dir", "bench_data_note", "bench_overrides", "bench_rows",
           "row_counts", "write_bench_data"]  # fmt: skip
