"""prepare_dataset end to end on offline stand-ins of the hub datasets."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import pytest

from tests.support.needs import needs

from recipe.data import DataPreparationError, prepare_dataset
from recipe.data.errors import SourceDataError
from recipe.data.specs import GEO3K_INSTRUCTION
from recipe.errors import RecipeConfigError

from .conftest import GEO3K_ROWS, GSM8K_ROWS, geo3k_dataset_dict, gsm8k_dataset_dict

pa = needs("pyarrow", install="parquet output needs pyarrow (the trainer extra)")
pq = needs("pyarrow.parquet", install="parquet output needs pyarrow (the trainer extra)")

PROMPT = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
REWARD_MODEL = pa.struct([("style", pa.string()), ("ground_truth", pa.string())])
EXTRA_INFO = pa.struct(
    [("split", pa.string()), ("index", pa.int64()), ("answer", pa.string()), ("question", pa.string())]
)
IMAGES = pa.list_(pa.struct([("bytes", pa.binary()), ("path", pa.string())]))

GEO3K_SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        ("prompt", PROMPT),
        ("images", IMAGES),
        ("ability", pa.string()),
        ("reward_model", REWARD_MODEL),
        ("extra_info", EXTRA_INFO),
    ]
)
GSM8K_SCHEMA = pa.schema([f for f in GEO3K_SCHEMA if f.name != "images"])


class Injected(Exception):
    """The failure a test throws into a write."""


def quiet(_: str) -> None:
    """A progress sink for tests that do not look at progress."""


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def listing(directory: Path) -> dict[str, str]:
    """Every file under `directory` with its hash: shows any file added, removed or changed."""
    return {str(p.relative_to(directory)): digest(p) for p in sorted(directory.rglob("*")) if p.is_file()}


def test_geo3k_parquet_has_verls_schema_and_every_row(geo3k_source: Path, tmp_path: Path) -> None:
    out = tmp_path / "data" / "geo3k"
    prepared = prepare_dataset("geo3k", out, geo3k_source, progress=quiet)

    assert [(f.split, f.path, f.rows) for f in prepared.files] == [
        ("train", out / "train.parquet", len(GEO3K_ROWS["train"])),
        ("test", out / "test.parquet", len(GEO3K_ROWS["test"])),
    ]
    assert all(f.bytes == f.path.stat().st_size for f in prepared.files)
    assert prepared.data_source == "hiyouga/geometry3k"
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "test.parquet", "train.parquet"]  # no validation, no temps
    for written in prepared.files:
        schema = pq.read_schema(written.path)
        assert schema.remove_metadata() == GEO3K_SCHEMA
        # The `datasets` feature metadata is what makes verl's loader decode images to PIL.
        features = json.loads(schema.metadata[b"huggingface"])["info"]["features"]
        assert features["images"] == {"feature": {"_type": "Image"}, "_type": "List"}


def test_geo3k_rows_carry_prompt_placeholders_images_and_answers(geo3k_source: Path, tmp_path: Path) -> None:
    from PIL import Image

    prepared = prepare_dataset("geo3k", tmp_path / "out", geo3k_source, progress=quiet)
    source = geo3k_dataset_dict()
    for split in ("train", "test"):
        rows = pq.read_table(prepared.path(split)).to_pylist()
        assert len(rows) == len(source[split])
        for index, (row, original) in enumerate(zip(rows, source[split], strict=True)):
            content = row["prompt"][0]["content"]
            assert row["prompt"][0]["role"] == "user"
            assert content.endswith(" " + GEO3K_INSTRUCTION)
            # verl asserts one <image> per image; a problem that lost its placeholder gets one.
            assert content.count("<image>") == len(row["images"]) == len(original["images"])
            assert content.replace("<image>", "").startswith(original["problem"].replace("<image>", ""))
            assert row["reward_model"] == {"style": "rule", "ground_truth": original["answer"]}
            assert row["extra_info"] == {
                "split": split,
                "index": index,
                "answer": original["answer"],
                "question": original["problem"],
            }
            for stored, image in zip(row["images"], original["images"], strict=True):
                decoded = Image.open(io.BytesIO(stored["bytes"])).convert("RGB")
                assert decoded.size == image.size
                assert decoded.tobytes() == image.convert("RGB").tobytes()


def test_running_twice_writes_the_same_bytes(geo3k_source: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    prepare_dataset("geo3k", out, geo3k_source, progress=quiet)
    first = listing(out)
    prepare_dataset("geo3k", out, geo3k_source, progress=quiet)
    assert listing(out) == first
    assert sorted(first) == ["manifest.json", "test.parquet", "train.parquet"]


def test_two_outputs_of_one_source_are_byte_identical_and_the_manifest_traces_them(
    geo3k_source: Path, tmp_path: Path
) -> None:
    import hashlib
    import json

    first, second = tmp_path / "a", tmp_path / "b" / "elsewhere"
    prepare_dataset("geo3k", first, geo3k_source, progress=quiet)
    prepare_dataset("geo3k", second, geo3k_source, progress=quiet)
    for name in ("train.parquet", "test.parquet", "manifest.json"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    manifest = json.loads((first / "manifest.json").read_text())
    assert manifest["source"]["path"] == str(geo3k_source) and len(manifest["source"]["content_sha256"]) == 64
    for split in ("train", "test"):
        data = (first / f"{split}.parquet").read_bytes()
        assert manifest["files"][split]["sha256"] == hashlib.sha256(data).hexdigest()
    # Another source content, another revision.
    extra = next(p for p in sorted(geo3k_source.rglob("*.json")))
    extra.write_text(extra.read_text() + " ")
    prepare_dataset("geo3k", tmp_path / "c", geo3k_source, progress=quiet)
    changed = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert changed["source"]["content_sha256"] != manifest["source"]["content_sha256"]


def test_the_source_folder_is_left_unchanged(geo3k_source: Path, tmp_path: Path) -> None:
    # A source mounted read-only must work: `datasets` would otherwise drop cache files beside it.
    before = listing(geo3k_source)
    prepare_dataset("geo3k", tmp_path / "out", geo3k_source, progress=quiet)
    assert listing(geo3k_source) == before


def _fail_on_nth_row_group(monkeypatch: pytest.MonkeyPatch, out: Path, n: int, error: BaseException) -> list[str]:
    """Make the n-th parquet row-group write raise `error`; return the staged files present at that moment."""
    calls = {"count": 0}
    seen: list[str] = []
    real_write_table = pq.ParquetWriter.write_table

    def write_table(self: pq.ParquetWriter, table: pa.Table, *args: object, **kwargs: object) -> None:
        calls["count"] += 1
        if calls["count"] == n:
            seen.extend(sorted(p.name.split(".parquet.")[0] + ".parquet" for p in out.glob(".*.tmp")))
            raise error
        real_write_table(self, table, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", write_table)
    return seen


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")  # no writer left to finalise
@pytest.mark.parametrize("error", [Injected("disk full"), KeyboardInterrupt()])
def test_interrupted_rewrite_keeps_the_earlier_complete_files(
    geo3k_source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: BaseException
) -> None:
    out = tmp_path / "out"
    prepare_dataset("geo3k", out, geo3k_source, progress=quiet)
    before = listing(out)
    # One row per row group: train is 5 groups, so the 7th write is inside test, after train was
    # staged complete and one row group of test was written.
    seen = _fail_on_nth_row_group(monkeypatch, out, 7, error)
    with pytest.raises(type(error)):
        prepare_dataset("geo3k", out, geo3k_source, batch_size=1, progress=quiet)
    assert seen == [".test.parquet", ".train.parquet"]
    assert listing(out) == before
    for split, rows in (("train", 5), ("test", 3)):
        assert pq.read_metadata(out / f"{split}.parquet").num_rows == rows


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")  # no writer left to finalise
def test_interrupted_first_run_leaves_no_file(
    geo3k_source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    seen = _fail_on_nth_row_group(monkeypatch, out, 3, Injected("killed"))  # two rows of train written
    with pytest.raises(Injected):
        prepare_dataset("geo3k", out, geo3k_source, batch_size=1, progress=quiet)
    assert seen == [".train.parquet"]
    assert not out.exists()  # nor the folder it made for them


def test_gsm8k_from_a_hub_download_reads_config_main(gsm8k_hub_snapshot: Path, tmp_path: Path) -> None:
    prepared = prepare_dataset("gsm8k", tmp_path / "gsm8k", gsm8k_hub_snapshot, progress=quiet)
    assert pq.read_schema(prepared.path("train")).remove_metadata() == GSM8K_SCHEMA
    rows = pq.read_table(prepared.path("train")).to_pylist()
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["72", "3600", "-8"]
    assert [r["extra_info"]["answer"] for r in rows] == [a for _, a in GSM8K_ROWS["train"]]  # not socratic's
    assert {r["data_source"] for r in rows} == {"openai/gsm8k"}
    test_rows = pq.read_table(prepared.path("test")).to_pylist()
    assert [r["reward_model"]["ground_truth"] for r in test_rows] == ["13", "4.5"]


def test_gsm8k_from_a_plain_folder_of_split_files(tmp_path: Path, needs_datasets: None) -> None:
    folder = tmp_path / "plain"
    folder.mkdir()
    for split, rows in gsm8k_dataset_dict().items():
        rows.to_json(str(folder / f"{split}.jsonl"))
    prepared = prepare_dataset("gsm8k", tmp_path / "out", folder, progress=quiet)
    assert [f.rows for f in prepared.files] == [3, 2]


def test_geo3k_from_a_hub_style_folder_of_parquet_shards(tmp_path: Path, needs_datasets: None) -> None:
    # The hub repository keeps data/<split>-00000-of-00001.parquet; `hf download` copies that layout.
    folder = tmp_path / "geometry3k" / "data"
    folder.mkdir(parents=True)
    for split, rows in geo3k_dataset_dict().items():
        rows.to_parquet(str(folder / f"{split}-00000-of-00001.parquet"))
    prepared = prepare_dataset("geo3k", tmp_path / "out", folder.parent, progress=quiet)
    assert [f.rows for f in prepared.files] == [5, 3]
    first = pq.read_table(prepared.path("train")).to_pylist()[0]
    assert first["images"][0]["bytes"].startswith(b"\x89PNG")


def test_progress_names_each_step(geo3k_source: Path, tmp_path: Path) -> None:
    lines: list[str] = []
    prepare_dataset("geo3k", tmp_path / "out", geo3k_source, progress=lines.append)
    assert lines == [
        f"loading geo3k from {geo3k_source}",
        "geo3k train: writing 5 rows",
        "geo3k test: writing 3 rows",
    ]


def test_missing_source_is_a_config_error(tmp_path: Path, needs_datasets: None) -> None:
    with pytest.raises(RecipeConfigError) as caught:
        prepare_dataset("geo3k", tmp_path / "out", tmp_path / "nope", progress=quiet)
    assert caught.value.problems == [f"--source={tmp_path / 'nope'}: no such directory"]
    assert not (tmp_path / "out").exists()


def test_source_lacking_splits_and_columns_reports_every_problem(tmp_path: Path, needs_datasets: None) -> None:
    import datasets

    source = tmp_path / "src"
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict({"question": ["q"], "solution": ["#### 1"]})}
    ).save_to_disk(str(source))
    with pytest.raises(RecipeConfigError) as caught:
        prepare_dataset("gsm8k", tmp_path / "out", source, progress=quiet)
    assert caught.value.problems == [
        f"--source={source}: split 'train' lacks column(s) answer (gsm8k needs question, answer)",
        f"--source={source}: has no split 'test' (found: train)",
    ]


def test_output_folder_that_cannot_be_made_is_a_config_error(geo3k_source: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(RecipeConfigError) as caught:
        prepare_dataset("geo3k", blocker / "geo3k", geo3k_source, progress=quiet)
    [problem] = caught.value.problems
    # Said before the source is even read (prepare.output_problem).
    assert problem == f"--out={blocker / 'geo3k'}: {blocker} is not a directory; check DATA_DIR or --out"


def test_unknown_dataset_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(RecipeConfigError, match=r"dataset='mnist': must be one of geo3k, gsm8k"):
        prepare_dataset("mnist", tmp_path, None, progress=quiet)  # type: ignore[arg-type]


def test_malformed_row_names_split_and_row_and_writes_nothing(tmp_path: Path, needs_datasets: None) -> None:
    import datasets

    source = tmp_path / "src"
    good = {"question": ["q1", "q2"], "answer": ["#### 1", "#### 2"]}
    bad = {"question": ["q1", "q2"], "answer": ["#### 1", "the answer is two"]}
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict(good), "test": datasets.Dataset.from_dict(bad)}
    ).save_to_disk(str(source))
    with pytest.raises(SourceDataError) as caught:  # a RecipeConfigError: exit 2, not retried
        prepare_dataset("gsm8k", tmp_path / "out", source, progress=quiet)
    assert caught.value.problems == ["gsm8k test row 1: answer has no final line '#### <number>'"]
    assert not (tmp_path / "out").exists()  # every row is checked before anything is written


def test_a_refused_source_leaves_earlier_files_untouched(gsm8k_hub_snapshot: Path, tmp_path: Path) -> None:
    import datasets

    out = tmp_path / "out"
    prepare_dataset("gsm8k", out, gsm8k_hub_snapshot, progress=quiet)
    before = listing(out)
    source = tmp_path / "bad"
    rows = {"question": ["q"], "answer": ["no marker"]}
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict(rows), "test": datasets.Dataset.from_dict(rows)}
    ).save_to_disk(str(source))
    with pytest.raises(SourceDataError):
        prepare_dataset("gsm8k", out, source, progress=quiet)
    assert listing(out) == before


def test_hub_failure_names_the_remedy_and_never_the_token_or_endpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, needs_datasets: None
) -> None:
    import logging

    import datasets

    token, endpoint = "hf_SeCrEtToKeN123", "https://mirror.internal.example:8443"
    printed = io.StringIO()
    handler = logging.StreamHandler(printed)  # stands for the stderr handler huggingface_hub installs
    hub_logger = logging.getLogger("huggingface_hub")
    hub_logger.addHandler(handler)
    monkeypatch.setattr(hub_logger, "level", logging.WARNING)

    def unreachable(*args: object, **kwargs: object) -> None:
        # What huggingface_hub logs on each retry, then what it raises in the end.
        logging.getLogger("huggingface_hub.utils._http").warning(
            "'Connection refused' thrown while requesting HEAD %s/datasets/hiyouga/geometry3k (token %s)",
            endpoint,
            token,
        )
        raise ConnectionError(f"GET {endpoint}/api/datasets/hiyouga/geometry3k failed (auth: Bearer {token})\nmore")

    monkeypatch.setenv("HF_TOKEN", token)
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    # The host answers (prepare-data's own probe passes); the hub then fails mid-way.
    monkeypatch.setattr("recipe.data.source.hub_unreachable", lambda *args, **kwargs: None)
    try:
        with pytest.raises(DataPreparationError) as caught:
            prepare_dataset("geo3k", tmp_path / "out", None, progress=quiet)
    finally:
        hub_logger.removeHandler(handler)
    message = str(caught.value)
    assert message.startswith("geo3k: cannot load hiyouga/geometry3k from the Hugging Face hub (ConnectionError: GET ")
    assert "--source" in message and "\n" not in message
    assert token not in message and endpoint not in message
    assert printed.getvalue() == (
        "'Connection refused' thrown while requesting HEAD **********/datasets/hiyouga/geometry3k (token **********)\n"
    )
    assert not handler.filters  # the redaction is removed again after the load
    assert not (tmp_path / "out").exists()


def test_the_manifest_always_describes_the_files_beside_it(
    geo3k_source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rewrite that fails before anything is put in place leaves the old manifest with the old files."""
    import errno

    from recipe import atomic

    out = tmp_path / "out"
    prepare_dataset("geo3k", out, geo3k_source, progress=quiet)
    before = listing(out)

    def full_disk(*_args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic.os, "replace", full_disk)
    with pytest.raises(DataPreparationError):
        prepare_dataset("geo3k", out, geo3k_source, batch_size=1, progress=quiet)  # other row groups: other bytes
    assert listing(out) == before
    manifest = json.loads((out / "manifest.json").read_text())
    for entry in manifest["files"].values():
        assert hashlib.sha256((out / entry["file"]).read_bytes()).hexdigest() == entry["sha256"]
