"""The native threads of this process, by name: what a library left running, read from /proc (Linux)."""

from __future__ import annotations

import os

#: Name prefixes of torch.distributed's CPU threads: gloo's loops and workers, the TCP store's server.
DISTRIBUTED_THREADS = ("gloo", "pt_gloo", "pt_tcpstore")


def thread_names() -> list[str]:
    """Every thread's name (its `comm`, 15 characters at most), sorted; threads that end meanwhile are skipped."""
    names = []
    tasks = "/proc/self/task"
    for task in os.listdir(tasks):
        try:
            with open(f"{tasks}/{task}/comm") as comm:
                names.append(comm.read().strip())
        except OSError:
            continue
    return sorted(names)


def distributed_threads(names: list[str]) -> list[str]:
    """The names among NAMES that belong to torch.distributed's CPU backend."""
    return [name for name in names if name.startswith(DISTRIBUTED_THREADS)]
