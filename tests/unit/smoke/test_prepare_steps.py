"""prepare_smoke_assets' steps, called directly: reuse, refusal, staging, swap, cleanup, permissions.

test_prepare.py builds the real tiny model (tens of seconds); here the model build is replaced by a
stand-in wherever the step under test is not the build itself (reuse, swap, cleanup, errors), and the
build is driven through a fake `transformers` module that records what it was asked to do. So this
file proves, in about a second, that a current build is reused untouched, a directory that is not a
build is never overwritten, an outdated build is replaced with nothing left beside it, a failed build
leaves nothing (or the previous build) behind, and what the build writes and how.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import types
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

from recipe.errors import RecipeConfigError
from recipe.smoke import prepare
from recipe.smoke.prepare import MANIFEST, SmokeAssets, prepare_smoke_assets


@pytest.fixture
def umask_022() -> Iterator[None]:
    """A known umask for the permission checks (the process's one is restored after)."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


@pytest.fixture
def fake_build(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Path, int]]:
    """Replace the model and tokenizer build with a stand-in that writes one marker file each.

    Returns the (model_dir, seed) of every model build, so a test can tell a reuse from a rebuild.
    """
    calls: list[tuple[Path, int]] = []

    def build_model(model_dir: Path, seed: int) -> None:
        calls.append((model_dir, seed))
        (model_dir / "model.safetensors").write_bytes(b"weights for seed %d" % seed)
        (model_dir / "model.safetensors").chmod(0o600)  # like safetensors' temp file

    def build_tokenizer(model_dir: Path) -> None:
        (model_dir / "tokenizer.json").write_text("{}")

    monkeypatch.setattr(prepare, "_build_model", build_model)
    monkeypatch.setattr(prepare, "_build_tokenizer", build_tokenizer)
    return calls


# --- where things go ---------------------------------------------------------------------------


def test_smoke_assets_under_names_the_documented_layout(tmp_path: Path) -> None:
    assets = SmokeAssets.under(str(tmp_path / "root"))  # type: ignore[arg-type]  (a str is accepted)
    assert assets == SmokeAssets(
        tmp_path / "root",
        tmp_path / "root" / "model",
        tmp_path / "root" / "data" / "train.parquet",
        tmp_path / "root" / "data" / "test.parquet",
    )
    assert isinstance(assets.root, Path)


def test_the_shipped_model_dir_holds_the_shipped_config() -> None:
    assert (prepare.shipped_model_dir() / "config.json").is_file()
    assert prepare.shipped_model_dir().name == "shipped"


# --- the fingerprint ---------------------------------------------------------------------------


def test_a_missing_library_is_recorded_as_absent() -> None:
    assert prepare._package_version("no-such-package-h15") == "absent"
    assert prepare._package_version("pytest") == version("pytest")


def test_the_fingerprint_records_seed_sizes_and_library_versions() -> None:
    fp = prepare.fingerprint(7)
    assert fp["build_version"] == prepare.BUILD_VERSION
    assert (fp["seed"], fp["train_rows"], fp["test_rows"]) == (7, 64, 8)
    # The libraries that write the files: a new version may write different bytes (datasets writes the parquet with
    # geo3k's features, Pillow draws and encodes the images).
    expected = {}
    for name in ("torch", "transformers", "tokenizers", "pyarrow", "datasets", "pillow"):
        try:
            expected[name] = version(name)
        except Exception:  # noqa: BLE001  (not installed here)
            expected[name] = "absent"
    assert fp["libraries"] == expected
    assert len(fp["shipped_sha256"]) == 64
    assert fp == prepare.fingerprint(7)
    assert prepare.fingerprint(8) != fp


def _shipped_hash(
    monkeypatch: pytest.MonkeyPatch, directory: Path, files: dict[str, bytes]
) -> str:
    directory.mkdir()
    for name, data in files.items():
        (directory / name).write_bytes(data)
    monkeypatch.setattr(prepare, "SHIPPED", directory)
    return str(prepare.fingerprint(0)["shipped_sha256"])


@pytest.mark.parametrize(
    ("changed", "why"),
    [
        ({"a.json": b"1", "b.json": b"3"}, "a byte of a file changed"),
        ({"a.json": b"1", "c.json": b"2"}, "a file renamed"),
        ({"a.json": b"1", "b.json": b"2", "c.json": b""}, "an empty file added"),
        ({"a.json": b"1b.json2"}, "a file's bytes moved into another's name"),
        (
            {"a.json1": b"", "b.json": b"2"},
            "bytes moved between a name and its content",
        ),
    ],
)
def test_any_change_to_the_shipped_files_changes_the_fingerprint(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, changed: dict[str, bytes], why: str
) -> None:
    base = _shipped_hash(
        monkeypatch, tmp_path / "base", {"a.json": b"1", "b.json": b"2"}
    )
    assert _shipped_hash(monkeypatch, tmp_path / "changed", changed) != base, why


def test_the_same_shipped_files_give_the_same_fingerprint(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    files = {"z.json": b"last", "a.json": b"first", "m.jinja": b"middle"}
    assert _shipped_hash(monkeypatch, tmp_path / "one", files) == _shipped_hash(
        monkeypatch, tmp_path / "two", dict(reversed(list(files.items())))
    )


# --- the manifest ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, None),  # no manifest
        ("{not json", None),
        ("[1, 2]", None),  # JSON, but not an object
        ('"text"', None),
        ('{"fingerprint": {"seed": 0}}', {"fingerprint": {"seed": 0}}),
        ('{"note": "caf\u00e9"}', {"note": "caf\u00e9"}),
    ],
)
def test_the_manifest_is_read_only_when_it_is_a_json_object(
    tmp_path: Path, content: str | None, expected: dict[str, Any] | None
) -> None:
    if content is not None:
        (tmp_path / MANIFEST).write_text(content, encoding="utf-8")
    assert prepare._read_manifest(tmp_path) == expected


def test_a_manifest_that_is_a_directory_is_no_manifest(tmp_path: Path) -> None:
    (tmp_path / MANIFEST).mkdir()
    assert prepare._read_manifest(tmp_path) is None


@pytest.mark.parametrize(
    ("manifest", "current"),
    [
        (None, False),
        ({"fingerprint": {"seed": 0}, "files": {"model/w": 1}}, True),
        ({"fingerprint": {"seed": 0}}, False),  # a manifest that vouches for no files (or from before files)
        ({"fingerprint": {"seed": 1}, "files": {"model/w": 1}}, False),
        ({"other": {"seed": 0}, "files": {"model/w": 1}}, False),
        ({"fingerprint": {"seed": 0}, "files": {"model/w": 2}}, False),  # cut short or grown since
        ({"fingerprint": {"seed": 0}, "files": {"model/w": 1, "data/train.parquet": 9}}, False),  # a file deleted
        ({"fingerprint": {"seed": 0}, "files": {}}, False),  # a file added
    ],
)
def test_a_build_is_current_only_when_its_fingerprint_is_the_wanted_one_and_its_files_are_the_built_ones(
    tmp_path: Path, manifest: dict[str, Any] | None, current: bool
) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "w").write_bytes(b"w")
    if manifest is not None:
        (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    assert prepare._is_current(tmp_path, {"seed": 0}) is current


def test_a_manifest_that_is_a_fifo_is_no_manifest_and_never_blocks(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / MANIFEST)
    assert prepare._read_manifest(tmp_path) is None


# --- the build ---------------------------------------------------------------------------------


class _Recorder:
    """What the fake transformers was asked: which class, which dtypes, how saved."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []


def _fake_transformers(monkeypatch: pytest.MonkeyPatch, record: _Recorder) -> None:
    import torch

    class Model:
        def to(self, dtype: Any) -> Model:
            record.events.append(("to", dtype))
            return self

        def save_pretrained(self, directory: Path, **kwargs: Any) -> None:
            record.events.append(("save", Path(directory), kwargs))
            (Path(directory) / "model.safetensors").write_bytes(b"w")

    class Qwen3_5MoeForConditionalGeneration:  # the real class name
        @staticmethod
        def _from_config(config: Any, **kwargs: Any) -> Model:
            record.events.append(
                ("from_config", config.name, kwargs, torch.initial_seed())
            )
            return Model()

    class AutoConfig:
        @staticmethod
        def from_pretrained(path: Path) -> Any:
            record.events.append(("config", Path(path)))
            return types.SimpleNamespace(
                name="shipped config",
                architectures=["Qwen3_5MoeForConditionalGeneration"],
            )

    fake = types.ModuleType("transformers")
    fake.AutoConfig = AutoConfig  # type: ignore[attr-defined]
    fake.Qwen3_5MoeForConditionalGeneration = Qwen3_5MoeForConditionalGeneration  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "transformers", fake)


def test_the_model_is_the_named_class_built_in_fp32_seeded_and_saved_as_bf16_safetensors(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import torch

    record = _Recorder()
    _fake_transformers(monkeypatch, record)
    prepare._build_model(tmp_path, 1234)
    assert record.events == [
        ("config", prepare.SHIPPED),
        ("from_config", "shipped config", {"dtype": torch.float32}, 1234),
        ("to", torch.bfloat16),
        ("save", tmp_path, {"safe_serialization": True}),
    ]
    # The shipped config files, byte for byte (save_pretrained's own copy would differ).
    for name in prepare.COPIED:
        assert (tmp_path / name).read_bytes() == (
            prepare.SHIPPED / name
        ).read_bytes(), name


class _Tokenizer:
    def __init__(self, writes_template: bool) -> None:
        self.writes_template = writes_template

    def save_pretrained(self, directory: Path) -> None:
        (Path(directory) / "tokenizer.json").write_text("{}")
        if self.writes_template:
            (Path(directory) / "chat_template.jinja").write_text("the tokenizer's own")


@pytest.mark.parametrize(
    ("writes_template", "template"),
    [(True, "the tokenizer's own"), (False, None)],  # None: the shipped one
)
def test_the_model_dir_always_gets_one_chat_template(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    writes_template: bool,
    template: str | None,
) -> None:
    from recipe.smoke import tokenizer

    monkeypatch.setattr(
        tokenizer, "build_tokenizer", lambda: _Tokenizer(writes_template)
    )
    prepare._build_tokenizer(tmp_path)
    shipped = (prepare.SHIPPED / "chat_template.jinja").read_text()
    assert (tmp_path / "chat_template.jinja").read_text() == (template or shipped)
    assert (tmp_path / "tokenizer.json").is_file()


def test_built_files_are_readable_as_the_umask_allows(
    tmp_path: Path, umask_022: None
) -> None:
    (tmp_path / "model").mkdir(mode=0o700)
    (tmp_path / "model" / "model.safetensors").write_bytes(b"w")
    (tmp_path / "model" / "model.safetensors").chmod(0o600)
    tmp_path.chmod(0o700)
    prepare._make_readable(tmp_path)
    assert (tmp_path / "model" / "model.safetensors").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "model").stat().st_mode & 0o777 == 0o755
    assert tmp_path.stat().st_mode & 0o777 == 0o755
    assert os.umask(0o022) == 0o022  # the umask is left as it was


def test_the_build_writes_model_data_and_last_a_manifest(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    fake_build: list[tuple[Path, int]],
    umask_022: None,
) -> None:
    from recipe.smoke import arithmetic

    dataset_calls: list[tuple[Any, ...]] = []

    def write_dataset(
        directory: Path, seed: int, train_rows: int, test_rows: int
    ) -> None:
        # The manifest is written last: while the data is written there is none.
        assert not (staging / MANIFEST).exists()
        dataset_calls.append((directory, seed, train_rows, test_rows))

    monkeypatch.setattr(arithmetic, "write_dataset", write_dataset)
    staging = tmp_path / "staging"
    staging.mkdir()
    prepare._build(staging, 5, {"wanted": True})
    assert fake_build == [(staging / "model", 5)]
    assert dataset_calls == [(staging / "data", 5, 64, 8)]
    manifest = json.loads((staging / MANIFEST).read_text(encoding="utf-8"))
    assert manifest["fingerprint"] == {"wanted": True}
    assert set(manifest) == {"fingerprint", "files", "build_seconds"}
    assert manifest["files"] == prepare._built_files(staging)  # what it vouches for: every file it built
    assert (
        isinstance(manifest["build_seconds"], float)
        and 0 <= manifest["build_seconds"] < 60
    )
    assert (staging / MANIFEST).read_text().endswith("}\n")
    assert (
        (staging / MANIFEST).read_text().startswith('{\n  "fingerprint"')
    )  # indented for people
    # safetensors' 0600 file made readable by others.
    assert (staging / "model" / "model.safetensors").stat().st_mode & 0o777 == 0o644


# --- leftovers of killed builds ----------------------------------------------------------------


def test_only_stale_leftover_builds_of_this_root_are_removed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    now = 100_000.0
    monkeypatch.setattr(prepare.time, "time", lambda: now)
    cutoff = now - 3600
    ages = {
        ".assets.old1.tmp": cutoff - 1,  # stale: removed
        ".assets.edge.tmp": cutoff,  # exactly an hour: kept
        ".assets.young.tmp": cutoff + 1,  # maybe another build running: kept
        ".other.old1.tmp": cutoff - 1,  # another root's
        "assets.old1.tmp": cutoff - 1,  # not hidden: not ours
    }
    for name, mtime in ages.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "f").write_text("x")
        os.utime(tmp_path / name, (mtime, mtime))
    # A stray file with the pattern (rmtree cannot remove it) and a dangling link: neither stops the build.
    (tmp_path / ".assets.file.tmp").write_text("x")
    os.utime(tmp_path / ".assets.file.tmp", (cutoff - 1, cutoff - 1))
    (tmp_path / ".assets.link.tmp").symlink_to(tmp_path / "nowhere")
    prepare._remove_stale_builds(tmp_path / "assets")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [
            ".assets.edge.tmp",
            ".assets.young.tmp",
            ".other.old1.tmp",
            "assets.old1.tmp",
            ".assets.file.tmp",
            ".assets.link.tmp",
        ]
    )


# --- putting the build in place ----------------------------------------------------------------


def _staged(parent: Path, fingerprint: Any, name: str = ".assets.x.tmp") -> Path:
    staging = parent / name
    staging.mkdir()
    (staging / "new").write_text("new build")
    (staging / MANIFEST).write_text(json.dumps({"fingerprint": fingerprint, "files": {"new": 9}}))
    return staging


@pytest.mark.parametrize("before", ["absent", "empty", "outdated"])
def test_the_build_replaces_an_absent_empty_or_outdated_root_leaving_nothing_beside(
    tmp_path: Path, before: str
) -> None:
    root = tmp_path / "assets"
    if before != "absent":
        root.mkdir()
    if before == "outdated":
        (root / "old").write_text("old build")
    prepare._swap_in(_staged(tmp_path, 1), root, 1)
    assert sorted(p.name for p in root.iterdir()) == sorted([MANIFEST, "new"])
    assert [p.name for p in tmp_path.iterdir()] == ["assets"]


def test_an_outdated_build_is_moved_aside_under_a_name_the_cleanup_recognises(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """If the process dies between moving aside and deleting, the next run's cleanup finds it."""
    root = tmp_path / "assets"
    root.mkdir()
    (root / "old").write_text("old build")
    staging = _staged(tmp_path, 1, ".assets.new.tmp")
    seen: list[list[str]] = []
    real_rename = os.rename

    def rename(src: Any, dst: Any) -> None:
        seen.append(sorted(p.name for p in tmp_path.iterdir()))
        real_rename(src, dst)

    monkeypatch.setattr(prepare.os, "rename", rename)
    prepare._swap_in(staging, root, 1)
    (aside,) = [name for name in seen[0] if name != ".assets.new.tmp"]
    assert aside.startswith(".assets.old-") and aside.endswith(".tmp")
    assert list(tmp_path.glob(".assets.*.tmp")) == []


def test_a_same_build_put_in_place_by_another_process_is_accepted(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    root = tmp_path / "assets"
    staging = _staged(tmp_path, 1)

    def rename(src: Any, dst: Any) -> None:
        _staged(
            tmp_path, 1, "assets"
        )  # the other process won the race, with the same build
        raise FileExistsError(17, "File exists")

    monkeypatch.setattr(prepare.os, "rename", rename)
    prepare._swap_in(staging, root, 1)
    assert [p.name for p in tmp_path.iterdir()] == ["assets"]


def test_when_the_swap_fails_the_previous_build_is_put_back(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    root = tmp_path / "assets"
    root.mkdir()
    (root / "old").write_text("old build")
    staging = _staged(tmp_path, 1)

    def rename(src: Any, dst: Any) -> None:
        raise OSError(16, "Device or resource busy")

    monkeypatch.setattr(prepare.os, "rename", rename)
    with pytest.raises(OSError, match="busy"):
        prepare._swap_in(staging, root, 1)
    assert (root / "old").read_text() == "old build"
    # The staging is the caller's to remove. The emptied moved-aside directory stays behind (the raise
    # skips its removal), under a name the next run's stale-build cleanup removes.
    left = sorted(
        p.name for p in tmp_path.iterdir() if p.name not in (".assets.x.tmp", "assets")
    )
    assert (
        len(left) == 1
        and left[0].startswith(".assets.old-")
        and left[0].endswith(".tmp")
    )
    assert list((tmp_path / left[0]).iterdir()) == []


def test_a_different_build_put_in_place_by_another_process_is_an_error_and_kept(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    root = tmp_path / "assets"
    root.mkdir()
    (root / "old").write_text("old build")
    staging = _staged(tmp_path, 1)

    def rename(src: Any, dst: Any) -> None:
        _staged(tmp_path, 2, "assets")  # another process's build, for another seed
        raise FileExistsError(17, "File exists")

    monkeypatch.setattr(prepare.os, "rename", rename)
    with pytest.raises(FileExistsError):
        prepare._swap_in(staging, root, 1)
    assert json.loads((root / MANIFEST).read_text()) == {"fingerprint": 2, "files": {"new": 9}}


# --- the whole call ----------------------------------------------------------------------------


def test_a_first_call_builds_with_seed_0_and_a_second_reuses_it(
    tmp_path: Path, fake_build: list[tuple[Path, int]], umask_022: None
) -> None:
    assets = prepare_smoke_assets(tmp_path / "assets")
    assert assets == SmokeAssets.under(tmp_path / "assets")
    assert len(fake_build) == 1 and fake_build[0][1] == 0
    # The manifest's documented name (tools and people look for it there).
    assert json.loads((assets.root / "smoke-assets.json").read_text())[
        "fingerprint"
    ] == prepare.fingerprint(0)
    assert assets.train_file.is_file() and assets.val_file.is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["assets"]
    before = {p: p.stat().st_mtime_ns for p in assets.root.rglob("*")}
    assert prepare_smoke_assets(tmp_path / "assets", seed=0) == assets
    assert len(fake_build) == 1  # reused, not rebuilt
    assert {p: p.stat().st_mtime_ns for p in assets.root.rglob("*")} == before


def test_another_seed_rebuilds(
    tmp_path: Path, fake_build: list[tuple[Path, int]]
) -> None:
    prepare_smoke_assets(tmp_path / "assets", seed=0)
    assets = prepare_smoke_assets(tmp_path / "assets", seed=3)
    assert [seed for _, seed in fake_build] == [0, 3]
    assert (
        assets.model_path / "model.safetensors"
    ).read_bytes() == b"weights for seed 3"
    assert [p.name for p in tmp_path.iterdir()] == ["assets"]


def test_a_relative_or_home_path_is_made_absolute(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fake_build: list[tuple[Path, int]]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert prepare_smoke_assets(Path("rel")).root == tmp_path / "rel"
    # Missing parents are made.
    assert prepare_smoke_assets(Path("deep/er/assets")).train_file.is_file()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert prepare_smoke_assets(Path("~/assets")).root == tmp_path / "home" / "assets"
    assert (tmp_path / "home" / "assets" / MANIFEST).is_file()


def test_a_stale_leftover_is_removed_before_building(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fake_build: list[tuple[Path, int]]
) -> None:
    (tmp_path / ".assets.killed.tmp").mkdir()
    os.utime(tmp_path / ".assets.killed.tmp", (1.0, 1.0))
    prepare_smoke_assets(tmp_path / "assets")
    assert [p.name for p in tmp_path.iterdir()] == ["assets"]


@pytest.mark.parametrize(
    "kind", ["file", "directory with files", "directory with a broken manifest"]
)
def test_something_that_is_not_a_build_is_never_overwritten(
    tmp_path: Path, fake_build: list[tuple[Path, int]], kind: str
) -> None:
    root = tmp_path / "assets"
    if kind == "file":
        root.write_text("user data")
    else:
        root.mkdir()
        (
            root / ("precious.txt" if kind == "directory with files" else MANIFEST)
        ).write_text("user data")
    with pytest.raises(RecipeConfigError) as error:
        prepare_smoke_assets(root)
    assert error.value.problems == [
        f"smoke assets {root}: exists and is not a smoke build; not overwriting it"
    ]
    assert fake_build == []
    assert [p.name for p in tmp_path.iterdir()] == ["assets"]


def test_an_unwritable_place_is_a_config_error_naming_the_reason(
    tmp_path: Path, fake_build: list[tuple[Path, int]]
) -> None:
    (tmp_path / "file").write_text("not a directory")
    root = tmp_path / "file" / "assets"
    with pytest.raises(RecipeConfigError) as error:
        prepare_smoke_assets(root)
    assert error.value.problems == [
        f"smoke assets {root}: cannot write there (File exists)"
    ]
    assert error.value.__cause__ is None and error.value.__suppress_context__


def test_a_root_that_cannot_be_replaced_is_a_config_error_and_leaves_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fake_build: list[tuple[Path, int]]
) -> None:
    """A mount point cannot be renamed: the message says the build could not be put in place."""

    def rename(src: Any, dst: Any) -> None:
        raise OSError(16, "Device or resource busy")

    monkeypatch.setattr(prepare.os, "rename", rename)
    root = tmp_path / "assets"
    with pytest.raises(RecipeConfigError) as error:
        prepare_smoke_assets(root)
    assert error.value.problems == [
        f"smoke assets {root}: cannot put the build in place ([Errno 16] Device or resource busy)"
    ]
    assert error.value.__cause__ is None and error.value.__suppress_context__
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("failure", [OSError("disk full"), KeyboardInterrupt()])
def test_a_failed_or_interrupted_build_leaves_nothing_and_keeps_the_previous_one(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    fake_build: list[tuple[Path, int]],
    failure: BaseException,
) -> None:
    from recipe.smoke import arithmetic

    first = prepare_smoke_assets(tmp_path / "assets", seed=0)

    def fail(*args: Any, **kwargs: Any) -> None:
        raise failure

    monkeypatch.setattr(arithmetic, "write_dataset", fail)
    with pytest.raises(type(failure)):
        prepare_smoke_assets(tmp_path / "assets", seed=1)
    assert (
        first.model_path / "model.safetensors"
    ).read_bytes() == b"weights for seed 0"
    assert [p.name for p in tmp_path.iterdir()] == ["assets"]


def _nfs_busy_file(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Make files called `name` undeletable, as NFS's `.nfsXXXX` files are while a process holds one open."""
    real_unlink = os.unlink

    def unlink(path: Any, *args: Any, **kwargs: Any) -> None:
        if os.path.basename(path) == name:
            raise OSError(16, "Device or resource busy", name)
        real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)


def test_an_old_build_that_cannot_be_fully_deleted_does_not_fail_the_new_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    root = tmp_path / "assets"
    root.mkdir()
    (root / ".nfs0001").write_text("held open by a running trainer")
    staging = _staged(tmp_path, 1)
    _nfs_busy_file(monkeypatch, ".nfs0001")
    prepare._swap_in(staging, root, 1)
    assert sorted(p.name for p in root.iterdir()) == sorted([MANIFEST, "new"])
    # What could not be deleted stays under a name the stale-build cleanup removes later.
    (left,) = [p.name for p in tmp_path.iterdir() if p.name != "assets"]
    assert left.startswith(".assets.old-") and left.endswith(".tmp")


def test_a_lost_race_whose_staging_cannot_be_fully_deleted_is_still_accepted(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    root = tmp_path / "assets"
    staging = _staged(tmp_path, 1)
    (staging / ".nfs0002").write_text("held open")

    def rename(src: Any, dst: Any) -> None:
        _staged(
            tmp_path, 1, "assets"
        )  # the other process won the race, with the same build
        raise FileExistsError(17, "File exists")

    monkeypatch.setattr(prepare.os, "rename", rename)
    _nfs_busy_file(monkeypatch, ".nfs0002")
    prepare._swap_in(staging, root, 1)
    assert json.loads((root / MANIFEST).read_text()) == {"fingerprint": 1, "files": {"new": 9}}


def test_the_build_happens_in_a_hidden_sibling_the_cleanup_recognises(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fake_build: list[tuple[Path, int]]
) -> None:
    """Beside `root` so the final rename is atomic (same file system); named so a killed build is cleaned up."""
    prepare_smoke_assets(tmp_path / "assets")
    (model_dir, _) = fake_build[0]
    staging = model_dir.parent
    assert staging.parent == tmp_path
    assert staging.name.startswith(".assets.") and staging.name.endswith(".tmp")


def test_a_lost_race_to_the_same_build_is_accepted_by_the_whole_call(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fake_build: list[tuple[Path, int]]
) -> None:
    root = tmp_path / "assets"
    real_rename = os.rename

    def rename(src: Any, dst: Any) -> None:
        real_rename(src, tmp_path / "copy")
        shutil.copytree(
            tmp_path / "copy", root
        )  # another process's identical build landed first
        shutil.rmtree(tmp_path / "copy")
        raise FileExistsError(17, "File exists")

    monkeypatch.setattr(prepare.os, "rename", rename)
    assert prepare_smoke_assets(root) == SmokeAssets.under(root)
    assert [p.name for p in tmp_path.iterdir()] == ["assets"]


def test_a_failed_build_reports_its_own_error_even_when_cleanup_is_incomplete(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fake_build: list[tuple[Path, int]]
) -> None:
    from recipe.smoke import arithmetic

    def fail(directory: Path, *args: Any) -> None:
        (directory / ".nfs0003").write_text("held open")
        raise OSError("disk full")

    monkeypatch.setattr(arithmetic, "write_dataset", fail)
    _nfs_busy_file(monkeypatch, ".nfs0003")
    with pytest.raises(OSError, match="disk full"):
        prepare_smoke_assets(tmp_path / "assets")
    assert not (tmp_path / "assets").exists()
