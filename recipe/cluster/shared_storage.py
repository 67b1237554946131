"""Every node sees the same checkpoint root: a nonce written on NODE_RANK 0, read back on every node before training.

verl saves one checkpoint, each rank writing its shard under trainer.default_local_dir, and a resume
reads it back on every node. When CHECKPOINT_DIR is a node-local disk, each node holds only its own
shards and the resume fails an hour in (`common.pt` not found: verl's Ascend FAQ). So before the
trainer starts, the head writes a random nonce into the root and runs one Ray task on each node that
reads it back where that node's own `run` put its root: `run` sets ROOT_VARIABLE in the environment
of its `ray start`, which Ray workers inherit (under KubeRay, where the recipe starts no raylet, the
head's path is read).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Sequence
from pathlib import Path

from recipe.atomic import atomic_write
from recipe.cluster.readiness import NodeReport, _connected
from recipe.errors import RecipeConfigError
from recipe.read_back import FileRefused, open_regular, read_bounded

#: The checkpoint root as this node's `run` resolved it (CHECKPOINT_DIR/PROJECT_NAME/EXPERIMENT_NAME).
ROOT_VARIABLE = "RECIPE_CHECKPOINT_ROOT"
NONCE_FILE = ".shared-storage-check"
#: A nonce is 32 hex digits; more than this is not ours.
_MAX_READ = 256
#: How long each node's read may take (a task waits for a worker process to start first).
READ_TIMEOUT_S = 120.0


def read_nonce(head_root: str) -> tuple[str, str]:
    """On one node: (the root it reads, the nonce file's text there, or `error: why`). Runs as a Ray task."""
    root = os.environ.get(ROOT_VARIABLE) or head_root
    path = os.path.join(root, NONCE_FILE)
    try:
        # Not through a link, a regular file of a nonce's size only (recipe.read_back): a planted link,
        # FIFO, folder or huge file is an answer naming what it is, never a hang or a wrong nonce.
        fd, _ = open_regular(Path(path), _MAX_READ, follow=False)
    except OSError as error:
        return root, f"error: {error.strerror or type(error).__name__}"
    except FileRefused as refused:
        return root, f"error: {str(refused).removeprefix(f'{path}: ')}"
    try:
        return root, read_bounded(fd, _MAX_READ).decode("utf-8", "replace")
    except (OSError, FileRefused) as error:
        return root, f"error: {getattr(error, 'strerror', None) or error}"
    finally:
        os.close(fd)


def shared_storage_problems(
    address: str, nodes: Sequence[NodeReport], root: Path, checkpoint_dir: str, node_ip_address: str | None = None
) -> list[str]:
    """One line per node that cannot read back the nonce written under `root` (empty: every node shares it)."""
    import ray  # lazy: ray is heavy or absent where this module is imported; loaded only here
    # lazy: ray is heavy or absent where this module is imported; loaded only here
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nonce = secrets.token_hex(16)
    marker = root / NONCE_FILE
    try:
        atomic_write(marker, lambda handle: handle.write(nonce.encode()))
    except OSError as error:
        return [f"CHECKPOINT_DIR={checkpoint_dir!r}: cannot write {marker} ({error.strerror or type(error).__name__})"]
    problems = []
    try:
        with _connected(address, node_ip_address):
            reader = ray.remote(num_cpus=0, max_retries=0)(read_nonce)
            pending = {
                node.describe(): reader.options(
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False)
                ).remote(str(root))
                for node in nodes
            }
            for where, ref in pending.items():
                try:
                    seen_root, text = ray.get(ref, timeout=READ_TIMEOUT_S)
                except Exception as error:  # noqa: BLE001 - a task that could not run is the node's answer
                    seen_root, text = str(root), f"error: the read did not run ({type(error).__name__})"
                if text != nonce:
                    why = text if text.startswith("error: ") else "error: it holds another run's nonce"
                    problems.append(
                        f"{where}: cannot read {os.path.join(seen_root, NONCE_FILE)} that NODE_RANK=0 just wrote "
                        f"under CHECKPOINT_DIR={checkpoint_dir!r} ({why[7:]}): every node must mount the same "
                        "shared CHECKPOINT_DIR, or a resume finds only this node's shards"
                    )
    finally:
        marker.unlink(missing_ok=True)
    return problems


def check_shared_storage(
    address: str, nodes: Sequence[NodeReport], root: Path, checkpoint_dir: str, node_ip_address: str | None = None
) -> None:
    """shared_storage_problems, raised as RecipeConfigError (exit 2, before any step)."""
    problems = shared_storage_problems(address, nodes, root, checkpoint_dir, node_ip_address)
    if problems:
        raise RecipeConfigError(problems)
