"""Name what differs between two OCI image layouts (`skopeo copy ... oci:DIR:TAG`).

Used by .ci/reproducible-recipe.sh: when two builds of the same commit give different image
IDs, a bare pair of digests says nothing; this says which config field or which files in
which layer differ, so the cause (a clock, a random name, a build path) can be found.

    python tests/images/oci_diff.py DIR_A:TAG DIR_B:TAG    # exit 0 when the same, 1 if not
"""

from __future__ import annotations

import hashlib
import json
import sys
import tarfile
from pathlib import Path
from typing import Any

# Per-file facts compared between layers: content hash (or link target), mode, owner, mtime,
# type and the PAX records (where extended attributes and sub-second times live).
Entry = tuple[str, int, int, int, float, bytes, tuple[tuple[str, str], ...]]


def _blob(layout: Path, digest: str) -> Path:
    algorithm, _, hexdigest = digest.partition(":")
    return layout / "blobs" / algorithm / hexdigest


def _manifest(layout: Path, tag: str) -> dict[str, Any]:
    index = json.loads((layout / "index.json").read_text())
    for entry in index["manifests"]:
        if entry.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag:
            return json.loads(_blob(layout, entry["digest"]).read_text())
    raise SystemExit(f"oci_diff: no image tagged {tag!r} in {layout}/index.json")


def image_id(layout: Path, tag: str) -> str:
    """The image ID: the digest of the image's config, as `docker images` and buildah show it."""
    return _manifest(layout, tag)["config"]["digest"]


def _entries(path: Path) -> dict[str, Entry]:
    entries: dict[str, Entry] = {}
    with tarfile.open(path) as layer:  # plain or gzip: skopeo writes either
        for member in layer:
            if member.isfile():
                handle = layer.extractfile(member)
                content = hashlib.sha256(handle.read() if handle else b"").hexdigest()[:16]
            else:
                content = member.linkname
            pax = tuple(sorted((k, str(v)) for k, v in member.pax_headers.items()))
            entries[member.name] = (content, member.mode, member.uid, member.gid, member.mtime, member.type, pax)
    return entries


def differences(a: tuple[Path, str], b: tuple[Path, str], limit: int = 40) -> list[str]:
    """One line per differing config field and per differing file (at most `limit` files a layer)."""
    (dir_a, tag_a), (dir_b, tag_b) = a, b
    manifest_a, manifest_b = _manifest(dir_a, tag_a), _manifest(dir_b, tag_b)
    config_a = json.loads(_blob(dir_a, manifest_a["config"]["digest"]).read_text())
    config_b = json.loads(_blob(dir_b, manifest_b["config"]["digest"]).read_text())
    lines: list[str] = []
    for key in sorted(set(config_a) | set(config_b)):
        if key != "rootfs" and config_a.get(key) != config_b.get(key):
            lines.append(f"config {key}: {json.dumps(config_a.get(key))[:200]} != {json.dumps(config_b.get(key))[:200]}")
    layers_a, layers_b = manifest_a["layers"], manifest_b["layers"]
    if len(layers_a) != len(layers_b):
        lines.append(f"layer count: {len(layers_a)} != {len(layers_b)}")
    for number, (layer_a, layer_b) in enumerate(zip(layers_a, layers_b)):
        if layer_a["digest"] == layer_b["digest"]:
            continue
        files_a, files_b = _entries(_blob(dir_a, layer_a["digest"])), _entries(_blob(dir_b, layer_b["digest"]))
        changed = [name for name in sorted(set(files_a) | set(files_b)) if files_a.get(name) != files_b.get(name)]
        lines.append(f"layer {number}: {len(changed)} file(s) differ")
        lines += [f"  {name}: {files_a.get(name)} != {files_b.get(name)}" for name in changed[:limit]]
        if len(changed) > limit:
            lines.append(f"  ... and {len(changed) - limit} more")
    return lines


def _parse(argument: str) -> tuple[Path, str]:
    directory, _, tag = argument.rpartition(":")
    if not directory or not tag:
        raise SystemExit(f"oci_diff: expected DIR:TAG, got {argument!r}")
    return Path(directory), tag


def main(argv: list[str]) -> int:
    """Print the two image IDs and what differs; exit 0 when the IDs are equal."""
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    a, b = _parse(argv[0]), _parse(argv[1])
    id_a, id_b = image_id(*a), image_id(*b)
    print(f"{argv[0]}: {id_a}\n{argv[1]}: {id_b}")
    if id_a == id_b:
        return 0
    print("\n".join(differences(a, b)))
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
