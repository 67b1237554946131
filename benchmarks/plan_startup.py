#!/usr/bin/env python3
"""Wall time of `entrypoint.py plan --json` against `python -c "import torch"`, in one process.

Upstream's launch script decides the device by importing torch_npu, which
imports torch first; ours must cost a small fraction of that. Prints the ratio
(target: at most 0.25) and exits 1 when it is above the target.

    python benchmarks/plan_startup.py [--repeat N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET = 0.25


def wall_time(argv: list[str], repeat: int) -> float:
    """Median wall time of running argv `repeat` times (one warm-up run first, for the page cache)."""
    subprocess.run(argv, check=True, capture_output=True, cwd=REPO)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True, cwd=REPO)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=7, help="runs of each command (median taken)")
    args = parser.parse_args()
    os.environ.pop("DEVICE", None)
    plan = wall_time([sys.executable, str(REPO / "entrypoint.py"), "plan", "--json"], args.repeat)
    torch = wall_time([sys.executable, "-c", "import torch"], args.repeat)
    ratio = plan / torch
    print(f"plan --json: {plan * 1000:.0f} ms   import torch: {torch * 1000:.0f} ms   ratio: {ratio:.3f} (target <= {TARGET})")
    return 0 if ratio <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
