"""prepare_dataset's output: the manifest (atomic, exact), the --out checks, cleanup after a failure.

- manifest.json is staged and renamed over the old one, never rewritten in place: a reader
  holding the old file (or a hard link to it) keeps the old complete bytes, and a failed
  rewrite leaves the old manifest with the old files.
- Its content: the dataset, the hub id, the source's revision (the hub commit, or a sha256 over
  the --source tree's relative paths and contents, bounded) and each file's rows and sha256.
- --out is refused in one line before anything is read; folders this run made are removed when
  it fails; a temp file an earlier killed run left is removed and said.
Tiny gsm8k sources (no images) and one tiny geo3k split keep each test well under a second.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.needs import needs

import recipe.atomic
from recipe.data import DataPreparationError, PreparedData, PreparedFile, prepare
from recipe.data.errors import SourceDataError
from recipe.data.guard import ImagePolicy, SourceFolder
from recipe.data.prepare import convert_split, output_problem, prepare_dataset, source_revision
from recipe.data.specs import SPECS
from recipe.errors import RecipeConfigError

datasets = needs("datasets", install="data preparation needs Hugging Face datasets (the trainer extra)")
pq = needs("pyarrow.parquet", install="parquet output needs pyarrow (the trainer extra)")

GSM8K, GEO3K = SPECS["gsm8k"], SPECS["geo3k"]


def quiet(_: str) -> None:
    """A progress sink for tests that do not look at progress."""


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def gsm8k_source(path: Path, train: int = 2, test: int = 1, marker: str = "####") -> Path:
    def rows(n: int) -> datasets.Dataset:
        return datasets.Dataset.from_dict({"question": [f"q{i}" for i in range(n)], "answer": [f"{marker} {i}" for i in range(n)]})

    datasets.DatasetDict({"train": rows(train), "test": rows(test)}).save_to_disk(str(path))
    return path


@pytest.fixture
def source(tmp_path: Path) -> Path:
    return gsm8k_source(tmp_path / "src")


# --- the manifest --------------------------------------------------------------------------------


def test_the_manifest_names_the_source_and_each_files_rows_and_hash(source: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    prepare_dataset("gsm8k", out, source, progress=quiet)
    text = (out / "manifest.json").read_text()
    manifest = json.loads(text)
    assert text == json.dumps(manifest, indent=2, sort_keys=True) + "\n"  # stable bytes: diffable, reproducible
    assert manifest == {
        "dataset": "gsm8k",
        "data_source": "openai/gsm8k",
        "source": {"path": str(source), "content_sha256": manifest["source"]["content_sha256"]},
        "files": {
            "train": {"file": "train.parquet", "rows": 2, "sha256": sha256(out / "train.parquet")},
            "test": {"file": "test.parquet", "rows": 1, "sha256": sha256(out / "test.parquet")},
        },
        "prompt_tokens": "not counted: no model given",
    }
    assert manifest["source"]["content_sha256"] == source_revision(GSM8K, source)["content_sha256"]


def test_the_manifest_is_replaced_atomically_not_rewritten_in_place(tmp_path: Path) -> None:
    """A reader that opened the old manifest (here: a hard link to it) keeps the old complete bytes.

    Rewriting in place would truncate that same file under the reader; a rename puts a new file
    at the name and leaves the old one whole.
    """
    out = tmp_path / "out"
    prepare_dataset("gsm8k", out, gsm8k_source(tmp_path / "first", train=2), progress=quiet)
    old_bytes = (out / "manifest.json").read_bytes()
    os.link(out / "manifest.json", tmp_path / "reader-holds-this")
    prepare_dataset("gsm8k", out, gsm8k_source(tmp_path / "second", train=3), progress=quiet)
    assert (tmp_path / "reader-holds-this").read_bytes() == old_bytes
    assert json.loads((out / "manifest.json").read_text())["files"]["train"]["rows"] == 3
    assert not (out / "manifest.json").samefile(tmp_path / "reader-holds-this")
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "test.parquet", "train.parquet"]  # no temp left


def test_a_manifest_that_cannot_be_written_leaves_the_old_files_and_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    prepare_dataset("gsm8k", out, gsm8k_source(tmp_path / "first", train=2), progress=quiet)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def disk_full(manifest: dict[str, Any]) -> bytes:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(prepare, "_manifest_bytes", disk_full)
    with pytest.raises(DataPreparationError) as caught:
        prepare_dataset("gsm8k", out, gsm8k_source(tmp_path / "second", train=3), progress=quiet)
    assert str(caught.value) == f"gsm8k: writing to {out} failed (OSError: [Errno 28] No space left on device)"
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # parquet files staged, none put in place


def test_the_manifest_is_committed_with_the_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The manifest goes through the same staged set: committed last, with the files it describes."""
    moved: list[str] = []
    real_replace = recipe.atomic.os.replace

    def replace(source: str, target: str) -> None:
        moved.append(Path(target).name)
        real_replace(source, target)

    monkeypatch.setattr(recipe.atomic.os, "replace", replace)
    prepare_dataset("gsm8k", tmp_path / "out", gsm8k_source(tmp_path / "src"), progress=quiet)
    assert moved == ["train.parquet", "test.parquet", "manifest.json"]


def tree(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def test_the_source_digest_is_fixed_for_a_given_tree(tmp_path: Path) -> None:
    """Manifests made by an earlier version must still match: the digest's format does not change.

    The value was computed once, by hand, from the documented recipe: sha256 over the lines
    `<relative posix path>\\0<sha256 of the file>\\n`, sorted by path.
    """
    root = tree(tmp_path / "src", {"b.txt": b"b", "a/x.txt": b"hello"})
    hello, b = hashlib.sha256(b"hello").hexdigest(), hashlib.sha256(b"b").hexdigest()
    expected = hashlib.sha256(f"a/x.txt\0{hello}\nb.txt\0{b}\n".encode()).hexdigest()
    assert source_revision(GSM8K, root) == {"path": str(root), "content_sha256": expected}


def test_the_source_digest_follows_content_and_names_not_location(tmp_path: Path) -> None:
    files = {"data/train.arrow": b"rows", "dataset_dict.json": b"{}"}

    def digest(root: Path) -> str:
        return str(source_revision(GSM8K, root)["content_sha256"])

    first = digest(tree(tmp_path / "one", files))
    assert digest(tree(tmp_path / "two" / "deeper", files)) == first  # moved: the same source
    assert digest(tree(tmp_path / "three", {**files, "data/train.arrow": b"rowz"})) != first
    assert digest(tree(tmp_path / "four", {"data/train2.arrow": b"rows", "dataset_dict.json": b"{}"})) != first
    assert digest(tree(tmp_path / "five", {**files, "extra/empty": b""})) != first
    empty_folder = tree(tmp_path / "six", files)
    (empty_folder / "nothing-in-here").mkdir()
    assert digest(empty_folder) == first  # folders hold no content of their own


def test_a_source_under_home_is_hashed_where_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    tree(tmp_path / "copy", {"a": b"1"})
    assert source_revision(GSM8K, "~/copy") == {
        "path": str(tmp_path / "copy"),
        "content_sha256": source_revision(GSM8K, tmp_path / "copy")["content_sha256"],
    }
    assert source_revision(GSM8K, "~/copy")["content_sha256"] != hashlib.sha256(b"").hexdigest()


@pytest.mark.parametrize(("second", "refused"), [(4, False), (5, True)])
def test_the_whole_tree_is_hashed_within_one_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, second: int, refused: bool
) -> None:
    monkeypatch.setattr(prepare, "MAX_DATA_BYTES", 10)
    monkeypatch.chdir(tmp_path)
    tree(tmp_path / "src", {"a.bin": b"x" * 6, "b.bin": b"y" * second})
    if not refused:
        assert len(source_revision(GSM8K, "src")["content_sha256"]) == 64
        return
    with pytest.raises(RecipeConfigError) as caught:
        source_revision(GSM8K, "src")
    assert caught.value.problems == [
        "--source='src': src/b.bin: 5 B, above the 4 B bound: the manifest hashes the whole source, "
        "at most 0 GiB in all; keep only the dataset's files there"
    ]


def test_a_sparse_file_past_the_budget_is_refused_unread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prepare, "MAX_DATA_BYTES", 2 << 30)
    monkeypatch.chdir(tmp_path)
    tree(tmp_path / "src", {"a.bin": b"x" * 6})
    with open(tmp_path / "src" / "b.bin", "wb") as handle:
        handle.truncate((2 << 30) - 5)  # fits alone; not after a.bin
    started = time.monotonic()
    with pytest.raises(RecipeConfigError) as caught:
        source_revision(GSM8K, "src")
    assert time.monotonic() - started < 5  # refused by its size, never read
    assert caught.value.problems == [
        "--source='src': src/b.bin: 2.0 GiB, above the 2.0 GiB bound: the manifest hashes the whole source, "
        "at most 2 GiB in all; keep only the dataset's files there"
    ]


def test_a_source_file_that_cannot_be_read_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    tree(tmp_path / "src", {"a.bin": b"x"})

    def unreadable(path: Path, limit: int) -> str:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(prepare, "sha256_file", unreadable)
    with pytest.raises(RecipeConfigError) as caught:
        source_revision(GSM8K, "src")
    assert caught.value.problems == [
        "--source='src': src/a.bin cannot be read (PermissionError: [Errno 13] Permission denied)"
    ]


def test_the_hub_revision_is_the_repositorys_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub

    class Api:
        def dataset_info(self, repo_id: str) -> Any:
            return type("Info", (), {"sha": f"commit-of-{repo_id}"})()

    monkeypatch.setattr(huggingface_hub, "HfApi", Api)
    assert source_revision(GSM8K, None) == {"hub": "openai/gsm8k", "revision": "commit-of-openai/gsm8k"}


def test_offline_the_hub_revision_is_null_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub

    class Api:
        def dataset_info(self, repo_id: str) -> Any:
            raise ConnectionError("offline")

    monkeypatch.setattr(huggingface_hub, "HfApi", Api)
    assert source_revision(GEO3K, None) == {
        "hub": "hiyouga/geometry3k",
        "revision": None,
        "why": "not asked of the hub (ConnectionError)",
    }


# --- --out ---------------------------------------------------------------------------------------


def test_an_out_that_is_a_file_or_below_one_is_refused(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert output_problem(blocker) == f"--out={blocker}: not a directory; check DATA_DIR or --out"
    assert output_problem(blocker / "a" / "b") == f"--out={blocker / 'a' / 'b'}: {blocker} is not a directory; check DATA_DIR or --out"


def test_an_out_in_a_folder_this_user_cannot_write_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[str, int]] = []

    def access(path: str | os.PathLike[str], mode: int) -> bool:
        asked.append((os.fspath(path), mode))
        return False

    monkeypatch.setattr(os, "access", access)
    out = tmp_path / "new" / "deeper"
    assert output_problem(out) == f"--out={out}: {tmp_path} is not writable by uid {os.getuid()}; check DATA_DIR or --out"
    assert asked == [(str(tmp_path), os.W_OK | os.X_OK)]  # write to make the folder, search to enter it


@pytest.mark.parametrize("out", ["existing", "new", "new/and/deeper"])
def test_an_out_that_exists_or_can_be_made_passes(tmp_path: Path, out: str) -> None:
    (tmp_path / "existing").mkdir()
    assert output_problem(tmp_path / out) is None
    assert not (tmp_path / "new").exists()  # only checked: nothing created


def test_an_out_refused_before_the_source_is_read(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(RecipeConfigError) as caught:
        prepare_dataset("gsm8k", blocker / "out", tmp_path / "no-such-source", progress=quiet)
    assert caught.value.problems == [f"--out={blocker / 'out'}: {blocker} is not a directory; check DATA_DIR or --out"]


def test_an_out_folder_that_cannot_be_made_is_a_config_error(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def mkdir(self: Path, *args: object, **kwargs: object) -> None:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(Path, "mkdir", mkdir)
    out = tmp_path / "out"
    with pytest.raises(RecipeConfigError) as caught:
        prepare_dataset("gsm8k", out, source, progress=quiet)
    assert caught.value.problems == [
        f"{out}: cannot create the output directory (PermissionError: [Errno 13] Permission denied); "
        "check DATA_DIR or --out"
    ]


def test_an_out_under_home_is_expanded(source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    prepared = prepare_dataset("gsm8k", "~/data/gsm8k", source, progress=quiet)
    assert prepared.out_dir == tmp_path / "data" / "gsm8k"
    assert (tmp_path / "data" / "gsm8k" / "train.parquet").is_file()


def test_a_failed_write_removes_only_the_folders_this_run_made(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "other-file").write_text("someone's")
    out = tmp_path / "kept" / "made" / "by" / "run"

    def disk_full(manifest: dict[str, Any]) -> bytes:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(prepare, "_manifest_bytes", disk_full)
    with pytest.raises(DataPreparationError):
        prepare_dataset("gsm8k", out, source, progress=quiet)
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == ["other-file"]


def test_cleanup_stops_at_a_folder_that_is_no_longer_empty(tmp_path: Path) -> None:
    inner = tmp_path / "a" / "b" / "c"
    inner.mkdir(parents=True)
    (tmp_path / "a" / "someone-else").write_text("")
    prepare._remove_empty([inner, inner.parent, tmp_path / "a"])
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["someone-else"]


def test_cleanup_stops_at_the_first_folder_it_cannot_remove(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "x").write_text("")
    (tmp_path / "c").mkdir()
    prepare._remove_empty([tmp_path / "a" / "b", tmp_path / "c"])
    assert (tmp_path / "c").is_dir()  # innermost first: an outer folder of a kept one is kept too


def test_a_temp_file_left_by_a_killed_run_is_removed_and_said(source: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    stale = out / ".train.parquet.abc123.tmp"
    stale.write_bytes(b"half a file")
    hour_ago = time.time() - 7200
    os.utime(stale, (hour_ago, hour_ago))
    said: list[str] = []
    prepare_dataset("gsm8k", out, source, progress=said.append)
    assert f"removed {stale}, left by an interrupted run" in said
    assert not stale.exists()


def test_progress_goes_to_stderr_by_default(source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prepare_dataset("gsm8k", tmp_path / "out", source)
    printed = capsys.readouterr()
    assert printed.out == ""
    lines = printed.err.splitlines()
    assert f"loading gsm8k from {source}" in lines
    assert "gsm8k train: writing 2 rows" in lines and "gsm8k test: writing 1 rows" in lines


# --- what is written and returned -----------------------------------------------------------------


def test_the_result_names_each_file_with_its_rows_and_size(source: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    prepared = prepare_dataset("gsm8k", out, source, progress=quiet)
    assert prepared == PreparedData(
        dataset="gsm8k",
        data_source="openai/gsm8k",
        out_dir=out,
        files=(
            PreparedFile("train", out / "train.parquet", 2, (out / "train.parquet").stat().st_size),
            PreparedFile("test", out / "test.parquet", 1, (out / "test.parquet").stat().st_size),
        ),
    )
    assert (prepared.path("train"), prepared.path("test")) == (out / "train.parquet", out / "test.parquet")
    with pytest.raises(KeyError) as caught:
        prepared.path("validation")
    assert caught.value.args == ("validation",)
    assert prepared.summary() == [
        *(f"wrote {f.path}: {f.rows} rows, {f.bytes} bytes" for f in prepared.files), "prompt lengths: not counted: no model given"
    ]


def test_the_batch_size_is_rows_per_row_group(tmp_path: Path) -> None:
    source = gsm8k_source(tmp_path / "src", train=5, test=1)
    prepared = prepare_dataset("gsm8k", tmp_path / "out", source, batch_size=2, progress=quiet)
    assert pq.ParquetFile(prepared.path("train")).num_row_groups == 3


def test_a_staged_file_with_the_wrong_row_count_is_never_committed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    datasets.Dataset.from_dict({"a": [1, 2, 3]}).to_parquet(str(tmp_path / "three.parquet"))
    with pytest.raises(DataPreparationError) as caught:
        prepare._check_written(tmp_path / "three.parquet", 4)
    assert str(caught.value) == f"{tmp_path / 'three.parquet'}: wrote 3 rows, expected 4"
    prepare._check_written(tmp_path / "three.parquet", 3)
    assert not out.exists()


@pytest.mark.parametrize(("cap", "ok"), [(1, True), (0, False), (-5, False)])
def test_the_image_cap_must_be_at_least_one_byte(source: Path, tmp_path: Path, cap: int, ok: bool) -> None:
    if ok:
        prepare_dataset("gsm8k", tmp_path / "out", source, max_image_bytes=cap, progress=quiet)
        return
    with pytest.raises(RecipeConfigError) as caught:
        prepare_dataset("gsm8k", tmp_path / "out", source, max_image_bytes=cap, progress=quiet)
    assert caught.value.problems == [f"max_image_bytes={cap}: must be at least 1"]


def test_an_unknown_dataset_names_the_choices(tmp_path: Path) -> None:
    with pytest.raises(RecipeConfigError) as caught:
        prepare_dataset("mnist", tmp_path, None, progress=quiet)  # type: ignore[arg-type]
    assert caught.value.problems == ["dataset='mnist': must be one of geo3k, gsm8k"]


def test_refused_rows_of_both_splits_are_named_together_and_nothing_is_written(tmp_path: Path) -> None:
    source = tmp_path / "src"
    bad = {"question": ["q0", "q1"], "answer": ["#### 1", "no number"]}
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict(bad), "test": datasets.Dataset.from_dict(bad)}
    ).save_to_disk(str(source))
    with pytest.raises(SourceDataError) as caught:
        prepare_dataset("gsm8k", tmp_path / "out", source, progress=quiet)
    assert caught.value.problems == [
        "gsm8k train row 1: answer has no final line '#### <number>'",
        "gsm8k test row 1: answer has no final line '#### <number>'",
    ]
    assert not (tmp_path / "out").exists()


# --- converting one split ----------------------------------------------------------------------------


def png() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (8, 6), "red").save(buffer, format="PNG")
    return buffer.getvalue()


def stored_images(converted: datasets.Dataset) -> list[Any]:
    """The images column as it will be written (reading a row would decode it to PIL)."""
    return converted.data.column("images").to_pylist()


def geo3k_split(images_feature: Any, images: list[Any]) -> datasets.Dataset:
    features = datasets.Features({"images": images_feature, "problem": datasets.Value("string"), "answer": datasets.Value("string")})
    return datasets.Dataset.from_dict(
        {"images": images, "problem": ["<image>Find x."] * len(images), "answer": ["3"] * len(images)}, features=features
    )


@pytest.mark.parametrize("kind", ["list", "single"])
def test_images_are_embedded_as_their_original_bytes(kind: str) -> None:
    """Encoded bytes pass through untouched: no decode and re-encode of every image."""
    data = png()
    raw = (
        geo3k_split(datasets.List(datasets.Image()), [[{"bytes": data, "path": None}]])
        if kind == "list"
        else geo3k_split(datasets.Image(), [{"bytes": data, "path": None}])
    )
    converted, refused = convert_split(GEO3K, raw, "train")
    assert refused == []
    assert stored_images(converted)[0] == [{"bytes": data, "path": None}]


def test_an_images_column_of_another_type_is_refused() -> None:
    raw = geo3k_split(datasets.Value("string"), ["a.png"])
    with pytest.raises(SourceDataError) as caught:
        convert_split(GEO3K, raw, "train")
    assert caught.value.problems == [
        "geo3k split 'train': column images is Value('string'); expected a list of datasets Image"
    ]


def test_a_long_images_column_type_is_cut_in_the_refusal() -> None:
    string = datasets.Value("string")
    feature = {f"field_number_{index}": string for index in range(8)}  # repr: about 250 characters
    raw = geo3k_split(feature, [{name: "x" for name in feature}])
    with pytest.raises(SourceDataError) as caught:
        convert_split(GEO3K, raw, "train")
    cut = repr(feature)[:156] + "...'"
    assert caught.value.problems == [f"geo3k split 'train': column images is {cut}; expected a list of datasets Image"]
    assert len(cut) == 160


def test_without_a_folder_image_paths_are_refused_row_by_row(tmp_path: Path) -> None:
    (tmp_path / "a.png").write_bytes(png())
    raw = geo3k_split(datasets.List(datasets.Image()), [[{"bytes": png(), "path": None}], [{"bytes": None, "path": "a.png"}]])
    _, refused = convert_split(GEO3K, raw, "test")
    assert refused == [
        "geo3k test row 1: images[0] path 'a.png' has no bytes; images from the hub must carry their bytes "
        "(download the repository and pass --source)"
    ]
    converted, refused = convert_split(GEO3K, raw, "test", ImagePolicy(SourceFolder.of(tmp_path)))
    assert refused == []
    assert stored_images(converted)[1] == [{"bytes": png(), "path": "a.png"}]


def test_extra_source_columns_are_dropped_and_verls_columns_written() -> None:
    raw = datasets.Dataset.from_dict({"question": ["q"], "answer": ["#### 7"], "id": [12]})
    converted, refused = convert_split(GSM8K, raw, "train")
    assert refused == []
    assert converted.column_names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    assert converted[0]["reward_model"] == {"style": "rule", "ground_truth": "7"}
    assert converted[0]["extra_info"] == {"split": "train", "index": 0, "answer": "#### 7", "question": "q"}


def test_a_refused_row_keeps_the_splits_schema() -> None:
    """The stand-in row of a refused one must fit the output schema, or `datasets` fails before the refusal is said."""
    raw = geo3k_split(datasets.List(datasets.Image()), [[{"bytes": png(), "path": None}], [{"bytes": b"no image", "path": None}]])
    converted, refused = convert_split(GEO3K, raw, "train")
    assert len(converted) == 2 and len(refused) == 1
    assert converted[1] == {
        "data_source": "",
        "prompt": [],
        "images": [],
        "ability": "",
        "reward_model": {"style": "", "ground_truth": ""},
        "extra_info": {"split": "", "index": -1, "answer": "", "question": ""},
    }
    gsm8k_converted, _ = convert_split(GSM8K, datasets.Dataset.from_dict({"question": [None], "answer": ["#### 1"]}), "train")
    assert "images" not in gsm8k_converted[0]


def test_converting_twice_gives_the_same_rows_and_leaves_the_raw_split() -> None:
    raw = datasets.Dataset.from_dict({"question": ["q1", "q2"], "answer": ["#### 1", "#### 2"]})
    first, _ = convert_split(GSM8K, raw, "train")
    second, _ = convert_split(GSM8K, raw, "train")
    assert first.to_list() == second.to_list()
    assert [row["extra_info"]["index"] for row in first] == [0, 1]
    assert raw.column_names == ["question", "answer"]


def test_the_images_column_keeps_the_datasets_image_type_verl_decodes() -> None:
    """verl's loader turns `images` into PIL images only when the parquet says it is a list of Image."""
    raw = geo3k_split(datasets.List(datasets.Image()), [[{"bytes": png(), "path": None}]])
    converted, _ = convert_split(GEO3K, raw, "train")
    assert converted.features["images"] == datasets.List(datasets.Image())
    assert converted.features["extra_info"]["index"] == datasets.Value("int64")


def test_each_split_shows_its_own_progress_bar(capsys: pytest.CaptureFixture[str]) -> None:
    raw = datasets.Dataset.from_dict({"question": ["q"], "answer": ["#### 7"]})
    convert_split(GSM8K, raw, "test")
    assert "gsm8k test: converting" in capsys.readouterr().err


def write_geo3k_parquet(source: Path, images: dict[str, list[Any]]) -> Path:
    """A hub-style geo3k folder (data/<split>-00000-of-00001.parquet) whose images are given as {bytes, path}.

    Written with pyarrow: `datasets`' own writers would read (embed) the paths while writing.
    """
    import pyarrow as pa

    schema = datasets.Features(
        {"images": datasets.List(datasets.Image()), "problem": datasets.Value("string"), "answer": datasets.Value("string")}
    ).arrow_schema
    (source / "data").mkdir(parents=True)
    for split, row_images in images.items():
        table = pa.Table.from_pydict(
            {"images": row_images, "problem": ["Find x."] * len(row_images), "answer": ["3"] * len(row_images)}, schema=schema
        )
        pq.write_table(table, source / "data" / f"{split}-00000-of-00001.parquet")
    return source


@pytest.fixture
def geo3k_paths(tmp_path: Path) -> Path:
    """A local geo3k copy whose train image is a path inside it, and whose test image is embedded."""
    source = tmp_path / "geo3k-src"
    (source / "figures").mkdir(parents=True)
    (source / "figures" / "a.png").write_bytes(png())
    return write_geo3k_parquet(
        source, {"train": [[{"bytes": None, "path": "figures/a.png"}]], "test": [[{"bytes": png(), "path": None}]]}
    )


def test_image_paths_inside_the_source_are_read_from_it(geo3k_paths: Path, tmp_path: Path) -> None:
    prepared = prepare_dataset("geo3k", tmp_path / "out", geo3k_paths, progress=quiet)
    images = pq.read_table(prepared.path("train")).column("images").to_pylist()
    assert images == [[{"bytes": png(), "path": "a.png"}]]


@pytest.mark.parametrize(("cap", "refused"), [(len(png()), False), (len(png()) - 1, True)])
def test_the_image_cap_applies_to_images_read_from_the_source(
    geo3k_paths: Path, tmp_path: Path, cap: int, refused: bool
) -> None:
    if not refused:
        prepare_dataset("geo3k", tmp_path / "out", geo3k_paths, max_image_bytes=cap, progress=quiet)
        return
    with pytest.raises(SourceDataError) as caught:
        prepare_dataset("geo3k", tmp_path / "out", geo3k_paths, max_image_bytes=cap, progress=quiet)
    size = len(png())
    over = f"over the limit of {cap} bytes (--max-image-mib)"
    assert caught.value.problems == [
        f"geo3k train row 0: images[0] path 'figures/a.png' is {size} bytes, {over}",
        f"geo3k test row 0: images[0] is {size} bytes, {over}",
    ]


def listing(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): sha256(p) for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("dataset", ["gsm8k", "geo3k"])
def test_the_source_folder_is_left_unchanged(tmp_path: Path, dataset: str) -> None:
    """A source mounted read-only must work: `datasets` would otherwise write cache files beside its arrow files."""
    source = tmp_path / "src"
    if dataset == "gsm8k":
        gsm8k_source(source)
    else:
        rows = geo3k_split(datasets.List(datasets.Image()), [[{"bytes": png(), "path": None}]])
        datasets.DatasetDict({"train": rows, "test": rows}).save_to_disk(str(source))
    before = listing(source)
    prepare_dataset(dataset, tmp_path / "out", source, progress=quiet)  # type: ignore[arg-type]
    assert listing(source) == before


def test_from_the_hub_the_manifest_names_the_repositorys_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub

    from recipe.data import source as source_module

    rows = datasets.Dataset.from_dict({"question": ["q"], "answer": ["#### 1"]})
    monkeypatch.setattr(source_module, "_load_hub", lambda spec: datasets.DatasetDict({"train": rows, "test": rows}))

    class Api:
        def dataset_info(self, repo_id: str) -> Any:
            return type("Info", (), {"sha": "0123abcd"})()

    monkeypatch.setattr(huggingface_hub, "HfApi", Api)
    prepare_dataset("gsm8k", tmp_path / "out", None, progress=quiet)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["source"] == {"hub": "openai/gsm8k", "revision": "0123abcd"}


def test_an_interrupted_write_removes_the_folders_it_made(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(manifest: dict[str, Any]) -> bytes:
        raise KeyboardInterrupt

    monkeypatch.setattr(prepare, "_manifest_bytes", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prepare_dataset("gsm8k", tmp_path / "new" / "out", source, progress=quiet)
    assert not (tmp_path / "new").exists()


def test_prompt_lengths_are_counted_with_the_model_and_written_to_the_manifest(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a model, each split's prompts are counted (a stand-in counter here: the real one needs the model's
    processor and is tested against verl in tests/e2e/test_image_data.py) into the manifest and the summary."""
    import recipe.data.prompt_lengths as prompt_lengths
    from recipe.data.prompt_lengths import RowLength

    class Counter:
        def __init__(self, model_dir: Path) -> None:
            assert model_dir == model

        def count(self, row: dict[str, Any]) -> RowLength:
            return RowLength(len(row["prompt"][0]["content"]), 0)

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    monkeypatch.setattr(prompt_lengths, "PromptCounter", Counter)
    out = tmp_path / "out"
    prepared = prepare_dataset("gsm8k", out, source, progress=quiet, model_dir=model)
    manifest = json.loads((out / "manifest.json").read_text())
    assert isinstance(prepared.prompt_lengths, dict) and sorted(prepared.prompt_lengths) == ["test", "train"]
    for split, rows in (("train", 2), ("test", 1)):
        counted = manifest["prompt_tokens"][split]
        assert counted["rows"] == rows and counted["tokens"] == sorted(counted["tokens"]) and len(counted["tokens"]) == rows
        assert f"prompt lengths ({split}): {prepared.prompt_lengths[split].describe()}" in prepared.summary()
    # A model folder without config.json, or a processor that cannot load, is said and the files are written anyway.
    assert prepare_dataset("gsm8k", tmp_path / "o2", source, progress=quiet, model_dir=tmp_path).prompt_lengths == (
        f"not counted: no model at MODEL_PATH={tmp_path} (image tokens depend on the model's processor)"
    )
    monkeypatch.setattr(prompt_lengths, "PromptCounter", lambda model_dir: (_ for _ in ()).throw(OSError("no processor")))
    broken = prepare_dataset("gsm8k", tmp_path / "o3", source, progress=quiet, model_dir=model)
    assert broken.prompt_lengths == f"not counted with {model}'s processor (OSError: no processor)"
