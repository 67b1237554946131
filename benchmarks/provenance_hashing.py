#!/usr/bin/env python3
"""What the run record's data hashing costs `plan`: `plan --json` with a 1 GB TRAIN_FILES against none.

`plan` hashes TRAIN_FILES and VAL_FILES whole (recipe.digests), and keeps each hash while
the file's size, mtime and ctime stay the same. This writes a file of SIZE_MB (default 1024) once and
times, in one process, `plan --json` (a) with no data files, the reference, (b) with the file
and an empty hash cache, (c) again with the cache filled. It prints the three times and the
ratios b/a and c/a; target: c/a at most 1.5 (a repeated plan costs about what it did without
data). b/a is what the first plan after new data costs.

    python benchmarks/provenance_hashing.py [--size-mb N] [--repeat N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET = 1.5
#: The recipe's settings and the variables that would move the cache, removed from the environment.
CLEARED_PREFIXES = ("TRAIN_FILES", "VAL_FILES", "DATA_DIR", "XDG_CACHE_HOME", "MODEL_PATH", "CHECKPOINT_DIR")


def plan_seconds(env: dict[str, str], repeat: int, before: object = None) -> float:
    """Median wall time of `entrypoint.py plan --json` (BEFORE, a callable, runs ahead of each)."""
    times = []
    for _ in range(repeat):
        if callable(before):
            before()
        start = time.perf_counter()
        subprocess.run([sys.executable, "entrypoint.py", "plan", "--json"], env=env, cwd=REPO, check=True,
                       capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    base = {k: v for k, v in os.environ.items() if not k.startswith(CLEARED_PREFIXES)}
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        cache = root / "cache"
        train = root / "train.parquet"
        block = os.urandom(1 << 20)
        with open(train, "wb") as out:
            for _ in range(args.size_mb):
                out.write(block)
        empty = base | {"TRAIN_FILES": str(root / "absent.parquet"), "VAL_FILES": str(root / "absent.parquet"),
                        "XDG_CACHE_HOME": str(cache)}
        with_data = empty | {"TRAIN_FILES": str(train)}
        plan_seconds(empty, 1)  # warm-up: imports in the page cache
        none = plan_seconds(empty, args.repeat)
        cold = plan_seconds(with_data, args.repeat, before=lambda: (cache / "grpo-recipe" / "sha256.json").unlink(missing_ok=True))
        warm = plan_seconds(with_data, args.repeat)
    print(
        f"plan --json: no data {none:.2f} s; {args.size_mb} MB TRAIN_FILES first time {cold:.2f} s "
        f"(x{cold / none:.1f}), again {warm:.2f} s (x{warm / none:.2f}; target <= {TARGET})"
    )
    return 0 if warm / none <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
