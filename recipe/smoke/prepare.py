"""Build the smoke profile's model, tokenizer, processor files and dataset, offline and atomically.

Layout under `root`:

    model/   config.json (the shipped one), model.safetensors (random bf16 weights),
             generation_config.json, tokenizer.json, tokenizer_config.json, chat_template.jinja,
             preprocessor_config.json, video_preprocessor_config.json
    data/    train.parquet, test.parquet
    smoke-assets.json   what was built, from what (written last)

Everything is built in a hidden sibling directory and renamed into place, so `root`
is either absent, the previous complete build, or the new complete build. A build is
reused when its manifest matches what would be built now (shipped files, seed, and the
versions of the libraries that write the files); otherwise it is rebuilt. Nothing here
reaches the network: the config is read from the repository and the weights are random.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from recipe.errors import RecipeConfigError
from recipe.read_back import FileRefused, read_json
from recipe.smoke import arithmetic
from recipe.smoke.tokenizer import SHIPPED

MANIFEST = "smoke-assets.json"
#: A manifest larger than this was not written here (they are a few kilobytes).
MAX_MANIFEST_BYTES = 1 << 20
#: Bump when the build itself changes in a way the inputs below do not show.
BUILD_VERSION = 2
TRAIN_ROWS = 64
TEST_ROWS = 8
#: Shipped files copied into the model directory unchanged.
COPIED = ("config.json", "generation_config.json", "preprocessor_config.json", "video_preprocessor_config.json")
#: Leftover build directories older than this are removed (a killed build leaves one behind).
STALE_AFTER_S = 3600.0


@dataclass(frozen=True)
class SmokeAssets:
    """Where the smoke model and data are (or will be) under one root."""

    root: Path
    model_path: Path
    train_file: Path
    val_file: Path

    @classmethod
    def under(cls, root: Path) -> SmokeAssets:
        """The paths `prepare_smoke_assets(root)` writes; builds nothing (for `plan`)."""
        root = Path(root)
        return cls(root, root / "model", root / "data" / "train.parquet", root / "data" / "test.parquet")


def shipped_model_dir() -> Path:
    """The directory holding the shipped config.json (what `plan` reads the architecture from)."""
    return SHIPPED


def _package_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "absent"


def fingerprint(seed: int) -> dict[str, Any]:
    """Everything the build depends on; equal fingerprints mean equal assets."""
    shipped = hashlib.sha256()
    for path in sorted(SHIPPED.iterdir()):
        shipped.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return {
        "build_version": BUILD_VERSION,
        "seed": seed,
        "train_rows": TRAIN_ROWS,
        "test_rows": TEST_ROWS,
        "shipped_sha256": shipped.hexdigest(),
        "libraries": {
            name: _package_version(name)
            for name in ("torch", "transformers", "tokenizers", "pyarrow", "datasets", "pillow")
        },
    }


def _read_manifest(root: Path) -> dict[str, Any] | None:
    try:
        # Bounded, and never blocking on a FIFO planted at its name (recipe.read_back).
        manifest = read_json(root / MANIFEST, MAX_MANIFEST_BYTES)
    except FileRefused:
        return None
    return manifest if isinstance(manifest, dict) else None


def _built_files(root: Path) -> dict[str, int]:
    """{relative path: size} of every file of a build but its manifest: what the manifest vouches for."""
    return {
        path.relative_to(root).as_posix(): path.stat().st_size
        for path in sorted(root.rglob("*"))
        if path.is_file() and path.name != MANIFEST
    }


def _is_current(root: Path, wanted: dict[str, Any]) -> bool:
    """The build at `root` is this one: its manifest's inputs are `wanted`, and its files are the ones it built
    (a file deleted, added or cut short since means rebuild: a manifest is evidence only of what it lists)."""
    manifest = _read_manifest(root)
    if manifest is None or manifest.get("fingerprint") != wanted:
        return False
    try:
        return manifest.get("files") == _built_files(root)
    except OSError:
        return False


def _build_model(model_dir: Path, seed: int) -> None:
    """Random weights for the shipped config, saved as bf16 safetensors like the real checkpoint."""
    import torch  # lazy: torch is heavy or absent where this module is imported; loaded only here
    import transformers  # lazy: transformers is heavy or absent where this module is imported; loaded only here

    config = transformers.AutoConfig.from_pretrained(SHIPPED)
    # The class the real checkpoint names (Qwen3_5MoeForConditionalGeneration): the VLM, as
    # Megatron-Bridge and vLLM pick their implementation by this name.
    model_class = getattr(transformers, config.architectures[0])
    torch.manual_seed(seed)
    # Built in fp32 (the config says bf16, which would mix dtypes at init), stored in bf16.
    model = model_class._from_config(config, dtype=torch.float32)
    model.to(torch.bfloat16).save_pretrained(model_dir, safe_serialization=True)
    # The shipped config, byte for byte: save_pretrained's copy would record fp32 sub-configs.
    for name in COPIED:
        shutil.copyfile(SHIPPED / name, model_dir / name)


def _build_tokenizer(model_dir: Path) -> None:
    # lazy: the tokenizer's build imports tokenizers and transformers
    from recipe.smoke.tokenizer import build_tokenizer

    build_tokenizer().save_pretrained(model_dir)
    # transformers >= 5 writes the template to chat_template.jinja; keep one file either way.
    if not (model_dir / "chat_template.jinja").exists():
        shutil.copyfile(SHIPPED / "chat_template.jinja", model_dir / "chat_template.jinja")


def _make_readable(directory: Path) -> None:
    """Files as `open()` would create them under the umask (safetensors' temp file leaves 0600)."""
    umask = os.umask(0)
    os.umask(umask)
    for path in directory.rglob("*"):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)
    directory.chmod(0o777 & ~umask)


def _build(staging: Path, seed: int, wanted: dict[str, Any]) -> None:
    started = time.monotonic()
    assets = SmokeAssets.under(staging)
    assets.model_path.mkdir()
    assets.train_file.parent.mkdir()
    _build_model(assets.model_path, seed)
    _build_tokenizer(assets.model_path)
    arithmetic.write_dataset(assets.train_file.parent, seed, TRAIN_ROWS, TEST_ROWS)
    _make_readable(staging)
    manifest = {"fingerprint": wanted, "files": _built_files(staging), "build_seconds": round(time.monotonic() - started, 2)}
    # Last: a manifest means a complete build.
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


def _remove_stale_builds(root: Path) -> None:
    cutoff = time.time() - STALE_AFTER_S
    for leftover in root.parent.glob(f".{root.name}.*.tmp"):
        try:
            if leftover.stat().st_mtime < cutoff:
                shutil.rmtree(leftover, ignore_errors=True)
        except FileNotFoundError:
            pass


def _swap_in(staging: Path, root: Path, wanted: dict[str, Any]) -> None:
    """Put the complete build at `root`; an outdated build there is moved aside first, then deleted."""
    old: Path | None = None
    if root.is_dir() and not any(root.iterdir()):
        root.rmdir()  # an empty directory someone made for us
    elif root.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{root.name}.old-", suffix=".tmp", dir=root.parent))
        os.replace(root, old / "assets")
    try:
        os.rename(staging, root)
    except OSError:
        # Another process put its build there first: fine when it is the same one.
        if not _is_current(root, wanted):
            if old is not None and not root.exists():
                os.replace(old / "assets", root)
            raise
        shutil.rmtree(staging, ignore_errors=True)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def prepare_smoke_assets(root: Path, seed: int = 0) -> SmokeAssets:
    """Build (or reuse) the smoke model, tokenizer, processor files and dataset under `root`.

    Idempotent: a complete build with the same inputs is reused as it is. Atomic: the
    build happens in a hidden sibling directory that is renamed to `root` at the end.
    Offline: reads only the shipped files. Takes a few seconds on a CPU.

    Raises:
        RecipeConfigError: `root` exists but is not a smoke build (never overwritten),
            or its parent cannot be written.
    """
    root = Path(root).expanduser().absolute()
    wanted = fingerprint(seed)
    if _is_current(root, wanted):
        return SmokeAssets.under(root)
    if root.exists() and (not root.is_dir() or (any(root.iterdir()) and _read_manifest(root) is None)):
        raise RecipeConfigError([f"smoke assets {root}: exists and is not a smoke build; not overwriting it"])
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_builds(root)
        staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.", suffix=".tmp", dir=root.parent))
    except OSError as exc:
        raise RecipeConfigError([f"smoke assets {root}: cannot write there ({exc.strerror or exc})"]) from None
    try:
        _build(staging, seed, wanted)
        try:
            _swap_in(staging, root, wanted)
        except OSError as exc:
            # e.g. `root` is a mount point, which cannot be renamed: mount its parent instead.
            raise RecipeConfigError([f"smoke assets {root}: cannot put the build in place ({exc})"]) from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return SmokeAssets.under(root)
