"""A signal at any point of the start-up ends the program quietly: 130 for Ctrl-C, 143 for SIGTERM (issue 50, class 4).

The start-up of `plan` is mostly imports (pydantic, the recipe's modules: most of a second). The grid is over them,
not over the clock: a finder on sys.meta_path counts the imports of the real start-up and, at the Nth, sends the
process the signal, which Python handles at once. N takes about 20 values spread from the first import after the
entry point's first statement to the last of `plan`'s; where the signal lands, the program must end with the shell's
status, one line on stderr or none, never a traceback. The interpreter's own start, before that first statement,
is out of scope.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from .envtools import HANG_GUARD_S, REPO, entrypoint_env

#: How a start is written: the child's code after the counting finder is in place.
STARTS = {
    "entrypoint.py": (
        f"sys.argv = ['entrypoint.py', 'plan', '--json']; "
        f"runpy.run_path({str(REPO / 'entrypoint.py')!r}, run_name='__main__')"
    ),
    "python -m recipe": "sys.argv = ['recipe', 'plan', '--json']; runpy.run_module('recipe', run_name='__main__', alter_sys=True)",
}  # fmt: skip
#: The finder: counts imports from the start's import of recipe.cli on (both starts make it after their first statement;
#: what comes before is the interpreter's and runpy's); at the AT-th (if any) sends SIGNAL to its own process.
COUNTER = """
import atexit, os, runpy, signal, sys
class Count:
    seen = 0
    def find_spec(self, name, path=None, target=None):
        if name == "recipe.cli" or Count.seen:  # the first import that both starts make after their first statement
            Count.seen += 1
            if Count.seen == {at}:
                os.kill(os.getpid(), {signal})
        return None
sys.meta_path.insert(0, Count())
atexit.register(lambda: print(f"imports: {{Count.seen}}", file=sys.stderr))
"""
GRID = 20


def _run(start: str, at: int, sent: int) -> subprocess.CompletedProcess[str]:
    code = COUNTER.format(at=at, signal=int(sent)) + STARTS[start]
    return subprocess.run([sys.executable, "-c", code], env=entrypoint_env(DEVICE="gpu"), cwd=REPO,
                          capture_output=True, text=True, timeout=HANG_GUARD_S, check=False)  # fmt: skip


def _imports_of_a_whole_start(start: str) -> int:
    """How many imports `plan` makes from the start's first statement to its end (no signal sent)."""
    done = _run(start, at=0, sent=signal.SIGINT)
    assert done.returncode == 0, done.stderr
    counted = [line for line in done.stderr.splitlines() if line.startswith("imports: ")]
    return int(counted[-1].split()[1]) if counted else 0


@pytest.mark.parametrize(("sent", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["ctrl-c", "sigterm"])
@pytest.mark.parametrize("start", sorted(STARTS))
def test_a_signal_at_any_import_of_the_start_up_ends_it_quietly(start: str, sent: int, status: int) -> None:
    total = _imports_of_a_whole_start(start)
    assert total > 100, f"plan's start-up made only {total} imports: the grid would not cover it"
    points = sorted({1 + (total - 1) * i // (GRID - 1) for i in range(GRID)})
    with ThreadPoolExecutor(max_workers=2) as pool:
        ends = list(pool.map(lambda at: (at, _run(start, at, sent)), points))
    for at, done in ends:
        said = [line for line in done.stderr.splitlines() if not line.startswith("imports: ")]
        assert done.returncode == status, f"import {at} of {total}: exit {done.returncode}\n{done.stderr[-2000:]}"
        assert "Traceback" not in done.stderr and len(said) <= 1, f"import {at} of {total}:\n{done.stderr[-2000:]}"
