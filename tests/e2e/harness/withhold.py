"""Make a copy of an HF export lenient on purpose: remove tensors as Megatron-Bridge's strict=False does.

strict=False writes every shard with what was produced and an index listing exactly that
(docs/export.md): a withheld tensor is simply absent, from its shard and from the index.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path

INDEX = "model.safetensors.index.json"


def copy_without(export: Path, target: Path, withheld: Iterable[str]) -> Path:
    """Copy `export` to `target` with the `withheld` tensors removed from their shards and the index."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    names = set(withheld)
    shutil.copytree(export, target)
    found: set[str] = set()
    for shard in sorted(target.glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as handle:
            metadata = handle.metadata()
            keep = {name: handle.get_tensor(name) for name in handle.keys() if name not in names}
            found |= names & set(handle.keys())
        save_file(keep, str(shard), metadata=metadata)
    if found != names:
        raise ValueError(f"not in the export: {sorted(names - found)}")
    index_path = target / INDEX
    if index_path.is_file():
        index = json.loads(index_path.read_text())
        index["weight_map"] = {k: v for k, v in index["weight_map"].items() if k not in names}
        index_path.write_text(json.dumps(index, indent=2))
    return target
