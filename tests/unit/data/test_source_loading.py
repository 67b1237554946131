"""recipe/data/source.py called directly: secrets never printed, the hub probe, and what a source must hold.

- HF_TOKEN and HF_ENDPOINT (and HUGGING_FACE_HUB_TOKEN) never appear in a message or a library
  log line (docs/data.md: "masked as `**********`"); values under 4 characters are left alone.
- The hub probe: not judged offline or behind a proxy; otherwise one connection to the
  endpoint's host and port, and a phrase saying why it failed.
- A local source: the exact line for a missing path, a file, a single split, an unreadable
  folder; every missing split and column and wrong type named at once.
Tiny sources in tmp_path; the hub is never contacted (its calls are replaced).
"""

from __future__ import annotations

import io
import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.needs import needs

from recipe.data import source as source_module
from recipe.data.errors import DataPreparationError, SourceDataError
from recipe.data.source import (
    LoadedSource,
    check_source,
    describe_exception,
    hub_unreachable,
    load_source,
    redact,
    redacted_library_logs,
)
from recipe.data.specs import SPECS
from recipe.errors import RecipeConfigError

datasets = needs("datasets", install="data preparation needs Hugging Face datasets (the trainer extra)")

TOKEN, ENDPOINT, OLD_TOKEN = "hf_SeCrEt0123", "https://mirror.example:8443", "hf_OlDtOkEn99"
GSM8K, GEO3K = SPECS["gsm8k"], SPECS["geo3k"]


@pytest.fixture
def secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("HF_ENDPOINT", ENDPOINT)
    monkeypatch.setenv("HUGGING_FACE_HUB_TOKEN", OLD_TOKEN)


@pytest.fixture(autouse=True)
def datasets_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`load_dataset` of a folder caches its arrow conversion: keep that in the test's folder."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-datasets-cache")


# --- secrets -----------------------------------------------------------------------------------


def test_every_hidden_value_is_masked(secrets: None) -> None:
    text = f"GET {ENDPOINT}/api?token={TOKEN} (old {OLD_TOKEN}) again {TOKEN}"
    assert redact(text) == "GET **********/api?token=********** (old **********) again **********"


@pytest.mark.parametrize(("value", "masked"), [("abc", False), ("abcd", True), ("", False)])
def test_a_value_under_four_characters_would_blank_out_words_and_is_left(
    monkeypatch: pytest.MonkeyPatch, value: str, masked: bool
) -> None:
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.setenv("HF_TOKEN", value)
    text = "abcd abc abcde"
    assert redact(text) == ("********** abc **********e" if masked else text)


def test_nothing_is_masked_when_nothing_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HF_TOKEN", "HF_ENDPOINT", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    assert redact("https://huggingface.co hf_x") == "https://huggingface.co hf_x"


@pytest.mark.parametrize(
    ("error", "line"),
    [
        (ValueError("first line\nsecond line"), "ValueError: first line"),
        (ValueError("  \n  indented first\nsecond"), "ValueError: indented first"),
        (ValueError(""), "ValueError"),
        (ConnectionError(f"GET {ENDPOINT}/x with {TOKEN}"), "ConnectionError: GET **********/x with **********"),
    ],
)
def test_an_exception_is_one_redacted_line(secrets: None, error: Exception, line: str) -> None:
    assert describe_exception(error) == line


@pytest.mark.parametrize(("length", "cut"), [(20, False), (21, True)])
def test_a_long_exception_is_cut_to_its_limit(length: int, cut: bool) -> None:
    message = describe_exception(ValueError("x" * (length - len("ValueError: "))), limit=20)
    assert len(message) == 20
    assert message == ("ValueError: xxxxx..." if cut else "ValueError: xxxxxxxx")


def test_the_default_cut_is_300_characters() -> None:
    message = describe_exception(ValueError("y" * 1000))
    assert message == "ValueError: " + "y" * 285 + "..."


@pytest.fixture
def library_log() -> Iterator[io.StringIO]:
    """A handler on `datasets`' logger, standing for the stderr handler the library installs."""
    printed = io.StringIO()
    handler = logging.StreamHandler(printed)
    logger = logging.getLogger("datasets")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield printed
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


def test_library_log_lines_are_masked_only_while_loading(secrets: None, library_log: io.StringIO) -> None:
    child = logging.getLogger("datasets.builder")
    with redacted_library_logs():
        child.warning("retrying %s/datasets/x (token %s)", ENDPOINT, TOKEN)
        child.warning("plain %s line", "library")
    child.warning("after: %s", "unchanged")
    assert library_log.getvalue().splitlines() == [
        "retrying **********/datasets/x (token **********)",
        "plain library line",
        "after: unchanged",
    ]
    assert not any(handler.filters for handler in logging.getLogger("datasets").handlers)


def test_a_clean_record_keeps_its_arguments(secrets: None, library_log: io.StringIO) -> None:
    """Other handlers (a JSON log shipper) still get the message and its arguments apart."""
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    keeper = Keep()
    logging.getLogger("datasets").addHandler(keeper)
    try:
        with redacted_library_logs():
            logging.getLogger("datasets").warning("loaded %d rows", 3)
            logging.getLogger("datasets").warning("from %s", ENDPOINT)
    finally:
        logging.getLogger("datasets").removeHandler(keeper)
    assert [(record.msg, record.args) for record in seen] == [("loaded %d rows", (3,)), ("from **********", None)]


def test_pythons_last_resort_handler_is_masked_too(secrets: None) -> None:
    """With no handler configured, Python prints warnings through logging.lastResort."""
    assert logging.lastResort is not None
    with redacted_library_logs():
        assert any(isinstance(f, logging.Filter) for f in logging.lastResort.filters)
        record = logging.LogRecord("datasets", logging.WARNING, __file__, 1, "token %s", (TOKEN,), None)
        assert logging.lastResort.filter(record)
        assert record.getMessage() == "token **********"
    assert not logging.lastResort.filters


def test_a_root_handler_is_masked_too(secrets: None) -> None:
    printed = io.StringIO()
    handler = logging.StreamHandler(printed)
    logging.getLogger().addHandler(handler)
    try:
        with redacted_library_logs():
            logging.getLogger("huggingface_hub.utils").warning("HEAD %s", ENDPOINT)
    finally:
        logging.getLogger().removeHandler(handler)
    assert printed.getvalue() == "HEAD **********\n"


# --- the hub probe ---------------------------------------------------------------------------


class Connections:
    """Replaces socket.create_connection: records each (host, port, timeout), fails with `error` if set."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, float]] = []
        self.error: OSError | None = None

    def __call__(self, address: tuple[str, int], timeout: float) -> socket.socket:
        self.calls.append((address[0], address[1], timeout))
        if self.error is not None:
            raise self.error
        return socket.socket()  # a context manager; closed at once, never connected


@pytest.fixture
def connections(monkeypatch: pytest.MonkeyPatch) -> Connections:
    recorder = Connections()
    monkeypatch.setattr(socket, "create_connection", recorder)
    return recorder


@pytest.mark.parametrize(
    ("environ", "address"),
    [
        ({}, ("huggingface.co", 443)),
        ({"HF_ENDPOINT": ""}, ("huggingface.co", 443)),
        ({"HF_ENDPOINT": "https://mirror.example"}, ("mirror.example", 443)),
        ({"HF_ENDPOINT": "http://mirror.example"}, ("mirror.example", 80)),
        ({"HF_ENDPOINT": "http://mirror.example:8080/hub"}, ("mirror.example", 8080)),
        ({"HF_HUB_OFFLINE": "0"}, ("huggingface.co", 443)),
        ({"HF_HUB_OFFLINE": "false"}, ("huggingface.co", 443)),
        ({"HTTPS_PROXY": ""}, ("huggingface.co", 443)),  # set but empty: no proxy
    ],
)
def test_the_probe_connects_once_to_the_endpoints_host(
    connections: Connections, environ: dict[str, str], address: tuple[str, int]
) -> None:
    assert hub_unreachable(environ) is None
    assert connections.calls == [(*address, 5.0)]


@pytest.mark.parametrize(
    "environ",
    [
        {"HF_HUB_OFFLINE": "1"},
        {"HF_HUB_OFFLINE": "true"},
        {"HF_HUB_OFFLINE": " YES "},
        {"HF_HUB_OFFLINE": "On"},
        *({name: "http://proxy:3128"} for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")),
    ],
)
def test_offline_or_behind_a_proxy_the_hub_is_not_judged(connections: Connections, environ: dict[str, str]) -> None:
    assert hub_unreachable({"HF_ENDPOINT": "http://closed.example", **environ}) is None
    assert connections.calls == []


@pytest.mark.parametrize("endpoint", ["not a url", "mirror.example", "http://[::1", "http://mirror.example:99999"])
def test_an_endpoint_that_is_not_a_url_is_said_without_its_value(connections: Connections, endpoint: str) -> None:
    assert hub_unreachable({"HF_ENDPOINT": endpoint}) == "HF_ENDPOINT is not a URL"
    assert connections.calls == []


@pytest.mark.parametrize(
    ("error", "timeout", "phrase"),
    [
        (ConnectionRefusedError(), 5.0, "no connection to the hub's host within 5 s (ConnectionRefusedError)"),
        (TimeoutError(), 2.5, "no connection to the hub's host within 2.5 s (TimeoutError)"),
        (socket.gaierror(), 5.0, "no connection to the hub's host within 5 s (gaierror)"),
    ],
)
def test_a_failed_connection_is_one_phrase(connections: Connections, error: OSError, timeout: float, phrase: str) -> None:
    connections.error = error
    assert hub_unreachable({"HF_ENDPOINT": "https://mirror.example"}, timeout_s=timeout) == phrase
    assert connections.calls == [("mirror.example", 443, timeout)]


def test_the_hub_is_loaded_with_its_config_and_the_environment_is_probed(monkeypatch: pytest.MonkeyPatch) -> None:
    loaded = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"question": ["q"], "answer": ["#### 1"]})})
    asked: list[tuple[object, ...]] = []
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the probe reads the real environment: offline, not judged
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: pytest.fail("probed while offline"))
    monkeypatch.setattr(datasets, "load_dataset", lambda *args: asked.append(args) or loaded)
    assert source_module._load_hub(GSM8K) is loaded
    assert asked == [("openai/gsm8k", "main")]


def test_an_unreachable_hub_is_one_line_with_the_remedies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(source_module, "hub_unreachable", lambda environ: "no connection to the hub's host within 5 s (X)")
    monkeypatch.setattr(datasets, "load_dataset", lambda *args: pytest.fail("loaded without a hub"))
    with pytest.raises(DataPreparationError) as caught:
        source_module._load_hub(GEO3K)
    assert str(caught.value) == (
        "geo3k: cannot reach the Hugging Face hub: no connection to the hub's host within 5 s (X); without a network "
        "use a copy already in HF_HOME with HF_HUB_OFFLINE=1, or pass --source with a local copy; set HF_ENDPOINT "
        "for a mirror"
    )


def test_a_failed_hub_load_is_one_redacted_line_with_the_remedies(secrets: None, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object) -> None:
        raise ConnectionError(f"401 for {ENDPOINT}/api (Bearer {TOKEN})\ndetails")

    monkeypatch.setattr(source_module, "hub_unreachable", lambda environ: None)
    monkeypatch.setattr(datasets, "load_dataset", fail)
    with pytest.raises(DataPreparationError) as caught:
        source_module._load_hub(GSM8K)
    assert str(caught.value) == (
        "gsm8k: cannot load openai/gsm8k from the Hugging Face hub (ConnectionError: 401 for **********/api "
        "(Bearer **********)); set HF_ENDPOINT to reach a mirror, HF_TOKEN if the hub asks for one, "
        "or pass --source with a local copy"
    )
    assert caught.value.__cause__ is None and caught.value.__suppress_context__  # no traceback chain to print


def test_offline_with_an_empty_cache_says_so_and_where_the_cache_is(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Issue 43: offline, "set HF_ENDPOINT to reach a mirror" cannot help; the line says the cache lacks it, and where."""

    def fail(*args: object) -> None:
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(source_module, "hub_unreachable", lambda environ: None)
    monkeypatch.setattr(datasets, "load_dataset", fail)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf" / "datasets")
    with pytest.raises(DataPreparationError) as caught:
        source_module._load_hub(GSM8K)
    assert str(caught.value) == (
        "gsm8k: openai/gsm8k is not in the cache, and offline mode (HF_HUB_OFFLINE) keeps the hub out: datasets "
        f"looked in {tmp_path}/hf/datasets (set by HF_HOME); load it once where the hub is reachable with the same "
        "HF_HOME, or pass --source with a local copy"
    )


# --- a local source -----------------------------------------------------------------------------


def gsm8k_rows(n: int = 1) -> datasets.Dataset:
    return datasets.Dataset.from_dict({"question": [f"q{i}" for i in range(n)], "answer": [f"#### {i}" for i in range(n)]})


def quiet(_: str) -> None:
    """A progress sink for tests that do not look at progress."""


def test_a_saved_dataset_loads_with_its_folder_and_label(tmp_path: Path) -> None:
    source = tmp_path / "src"
    datasets.DatasetDict({"train": gsm8k_rows(3), "test": gsm8k_rows(2)}).save_to_disk(str(source))
    said: list[str] = []
    loaded = load_source(GSM8K, str(source), said.append)
    assert isinstance(loaded, LoadedSource)
    assert ({s: len(d) for s, d in loaded.splits.items()}, loaded.label) == ({"train": 3, "test": 2}, f"--source={source}")
    assert loaded.folder is not None and loaded.folder.path == source
    assert said == [f"loading gsm8k from {source}"]


def test_a_source_under_home_is_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    datasets.DatasetDict({"train": gsm8k_rows(), "test": gsm8k_rows()}).save_to_disk(str(tmp_path / "copy"))
    said: list[str] = []
    loaded = load_source(GSM8K, "~/copy", said.append)
    assert said == [f"loading gsm8k from {tmp_path / 'copy'}"]
    assert loaded.label == "--source=~/copy"  # as the user typed it
    assert loaded.folder is not None and loaded.folder.path == tmp_path / "copy"


def test_the_hub_is_named_by_its_id(monkeypatch: pytest.MonkeyPatch) -> None:
    hub = datasets.DatasetDict({"train": gsm8k_rows(), "test": gsm8k_rows()})
    asked: list[object] = []
    monkeypatch.setattr(source_module, "_load_hub", lambda spec: asked.append(spec) or hub)
    said: list[str] = []
    loaded = load_source(GSM8K, None, said.append)
    assert asked == [GSM8K]
    assert (loaded.splits, loaded.folder, loaded.label) == (hub, None, "openai/gsm8k")
    assert said == ["loading openai/gsm8k from the Hugging Face hub (cached in HF_HOME)"]


def test_a_folder_of_split_files_loads(tmp_path: Path) -> None:
    source = tmp_path / "plain"
    source.mkdir()
    gsm8k_rows(2).to_json(str(source / "train.jsonl"))
    gsm8k_rows(1).to_json(str(source / "test.jsonl"))
    loaded = load_source(GSM8K, source, quiet)
    assert {split: len(rows) for split, rows in loaded.splits.items()} == {"train": 2, "test": 1}


def test_a_hub_download_reads_the_specs_config(tmp_path: Path) -> None:
    """gsm8k's download holds configs main and socratic: main is what the recipe trains on."""
    source = tmp_path / "download"
    for config, prefix in (("main", ""), ("socratic", "How? ")):
        (source / config).mkdir(parents=True)
        for split in ("train", "test"):
            rows = datasets.Dataset.from_dict({"question": ["q"], "answer": [f"{prefix}#### 1"]})
            rows.to_parquet(str(source / config / f"{split}-00000-of-00001.parquet"))
    configs = "".join(
        f"- config_name: {c}\n  data_files:\n  - split: train\n    path: {c}/train-*\n  - split: test\n    path: {c}/test-*\n"
        for c in ("main", "socratic")
    )
    (source / "README.md").write_text(f"---\nconfigs:\n{configs}---\n")
    loaded = load_source(GSM8K, source, quiet)
    assert loaded.splits["train"]["answer"] == ["#### 1"]


@pytest.mark.parametrize(
    ("make", "line"),
    [
        (None, "no such directory"),
        ("file", "must be a directory (save_to_disk output or a download of openai/gsm8k)"),
    ],
)
def test_a_source_that_is_not_a_folder_is_one_line(tmp_path: Path, make: str | None, line: str) -> None:
    path = tmp_path / "src"
    if make == "file":
        path.write_text("rows")
    with pytest.raises(RecipeConfigError) as caught:
        load_source(GSM8K, path, quiet)
    assert caught.value.problems == [f"--source={path}: {line}"]


def test_a_hostile_folder_is_refused_before_datasets_opens_it(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    os.mkfifo(source / "README.md")  # `datasets` would block reading it
    with pytest.raises(SourceDataError) as caught:
        load_source(GSM8K, source, quiet)
    assert caught.value.problems == [
        f"--source={source}: 'README.md' is a FIFO; the source folder may hold only regular files, folders, "
        "and symlinks to them inside it"
    ]


def test_a_saved_dataset_naming_files_outside_is_refused_before_loading(tmp_path: Path) -> None:
    source = tmp_path / "src"
    datasets.DatasetDict({"train": gsm8k_rows(), "test": gsm8k_rows()}).save_to_disk(str(source))
    (source / "dataset_dict.json").write_text('{"splits": ["train", "../elsewhere"]}')
    with pytest.raises(SourceDataError) as caught:
        load_source(GSM8K, source, quiet)
    assert caught.value.problems == [
        f"--source={source}: dataset_dict.json: split name '../elsewhere' is not a plain folder name"
    ]


def test_data_files_out_of_the_folder_are_refused_before_they_are_read(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    gsm8k_rows().to_json(str(elsewhere / "train.jsonl"))
    source = tmp_path / "src"
    source.mkdir()
    gsm8k_rows().to_json(str(source / "test.jsonl"))
    (source / "README.md").write_text(
        "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: ../elsewhere/train.jsonl\n"
        "  - split: test\n    path: test.jsonl\n---\n"
    )
    with pytest.raises(SourceDataError) as caught:
        load_source(GSM8K, source, quiet)
    [problem] = caught.value.problems
    assert problem.startswith(f"--source={source}: data file '")
    assert problem.endswith(
        "elsewhere/train.jsonl' (split 'train') is outside the source folder; the dataset's files must be inside --source"
    )


def test_an_empty_split_file_is_no_rows(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    features = datasets.Features({"question": datasets.Value("string"), "answer": datasets.Value("string")})
    datasets.Dataset.from_dict({"question": [], "answer": []}, features=features).to_parquet(str(source / "train.parquet"))
    gsm8k_rows().to_parquet(str(source / "test.parquet"))
    with pytest.raises(SourceDataError) as caught:
        load_source(GSM8K, source, quiet)
    assert caught.value.problems == [f"--source={source}: split 'train' has no rows"]


def test_a_folder_datasets_cannot_read_is_one_line(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "dataset_dict.json").write_text('{"splits": ["train"]}')
    (source / "train").mkdir()
    (source / "train" / "state.json").write_text('{"_data_files": [{"filename": "data.arrow"}]}')
    with pytest.raises(RecipeConfigError) as caught:
        load_source(GSM8K, source, quiet)
    [problem] = caught.value.problems
    assert problem.startswith(f"--source={source}: cannot be read as a dataset (")
    assert not isinstance(caught.value, SourceDataError)  # not a refused row: the folder is not a dataset


def test_a_datasets_error_is_one_redacted_line(tmp_path: Path, secrets: None, monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "src"
    datasets.DatasetDict({"train": gsm8k_rows(), "test": gsm8k_rows()}).save_to_disk(str(source))

    def broken(path: str) -> None:
        raise ValueError(f"arrow file broken (fetched with {TOKEN})\ntraceback lines")

    monkeypatch.setattr(datasets, "load_from_disk", broken)
    with pytest.raises(RecipeConfigError) as caught:
        load_source(GSM8K, source, quiet)
    assert caught.value.problems == [
        f"--source={source}: cannot be read as a dataset (ValueError: arrow file broken (fetched with **********))"
    ]


def test_a_source_lacking_a_split_is_named_by_its_label(tmp_path: Path) -> None:
    source = tmp_path / "src"
    datasets.DatasetDict({"train": gsm8k_rows()}).save_to_disk(str(source))
    with pytest.raises(RecipeConfigError) as caught:
        load_source(GSM8K, source, quiet)
    assert caught.value.problems == [f"--source={source}: has no split 'test' (found: train)"]


def test_a_single_split_from_load_from_disk_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "src"
    datasets.DatasetDict({"train": gsm8k_rows(), "test": gsm8k_rows()}).save_to_disk(str(source))
    monkeypatch.setattr(datasets, "load_from_disk", lambda path: gsm8k_rows())
    with pytest.raises(RecipeConfigError) as caught:
        source_module._load_local(GSM8K, source, "L")
    assert caught.value.problems == ["L: holds a single split; need splits train, test"]


# --- splits, columns, types --------------------------------------------------------------------


def splits(**columns_by_split: dict[str, Any]) -> datasets.DatasetDict:
    return datasets.DatasetDict({name: datasets.Dataset.from_dict(rows) for name, rows in columns_by_split.items()})


GOOD = {"question": ["q"], "answer": ["#### 1"]}


@pytest.mark.parametrize(
    ("loaded", "problems"),
    [
        ({"train": GOOD, "test": GOOD}, []),
        ({"train": GOOD}, ["L: has no split 'test' (found: train)"]),
        ({"validation": GOOD, "b\nad": GOOD}, ["L: has no split 'train' (found: 'b\\nad', validation)",
                                               "L: has no split 'test' (found: 'b\\nad', validation)"]),
        ({"train": {"question": ["q"]}, "test": {"q": ["x"], "a": ["y"]}},
         ["L: split 'train' lacks column(s) answer (gsm8k needs question, answer)",
          "L: split 'test' lacks column(s) question, answer (gsm8k needs question, answer)"]),
        ({"train": {"question": [1], "answer": [2.5]}, "test": GOOD},
         ["L: split 'train' column question is int64; it must be text (string)",
          "L: split 'train' column answer is float64; it must be text (string)"]),
        ({"train": {"question": [["a"]], "answer": ["#### 1"]}, "test": GOOD},
         ["L: split 'train' column question is List(Value('string')); it must be text (string)"]),
        ({"train": {"question": [1]}, "test": GOOD},
         ["L: split 'train' lacks column(s) answer (gsm8k needs question, answer)",
          "L: split 'train' column question is int64; it must be text (string)"]),
    ],
)  # fmt: skip
def test_every_missing_split_column_and_type_is_named_at_once(loaded: dict[str, Any], problems: list[str]) -> None:
    if problems:
        with pytest.raises(RecipeConfigError) as caught:
            check_source(GSM8K, splits(**loaded), "L")
        assert caught.value.problems == problems
    else:
        check_source(GSM8K, splits(**loaded), "L")


def test_no_splits_at_all_says_none_found() -> None:
    with pytest.raises(RecipeConfigError) as caught:
        check_source(GSM8K, datasets.DatasetDict({}), "L")
    assert caught.value.problems == ["L: has no split 'train' (found: none)", "L: has no split 'test' (found: none)"]


def test_large_strings_are_text() -> None:
    features = datasets.Features({"question": datasets.Value("large_string"), "answer": datasets.Value("string")})
    rows = datasets.Dataset.from_dict(GOOD, features=features)
    check_source(GSM8K, datasets.DatasetDict({"train": rows, "test": rows}), "L")


def test_an_empty_split_with_its_columns_has_no_rows() -> None:
    features = datasets.Features({"question": datasets.Value("string"), "answer": datasets.Value("string")})
    empty = datasets.Dataset.from_dict({"question": [], "answer": []}, features=features)
    with pytest.raises(RecipeConfigError) as caught:
        check_source(GSM8K, datasets.DatasetDict({"train": empty, "test": empty}), "L")
    assert caught.value.problems == ["L: split 'train' has no rows", "L: split 'test' has no rows"]


def test_an_empty_split_missing_a_column_is_named_once_for_the_column() -> None:
    features = datasets.Features({"question": datasets.Value("string")})
    empty = datasets.Dataset.from_dict({"question": []}, features=features)
    with pytest.raises(RecipeConfigError) as caught:
        check_source(GSM8K, datasets.DatasetDict({"train": empty, "test": splits(t=GOOD)["t"]}), "L")
    assert caught.value.problems == ["L: split 'train' lacks column(s) answer (gsm8k needs question, answer)"]


class Odd:
    """A feature whose repr holds a newline and is long: it must still be one printable line."""

    def __repr__(self) -> str:
        return "Odd(\n" + "z" * 200 + ")"


class Value:
    """Named like datasets.Value, with a dtype that is not a string."""

    dtype = 3

    def __repr__(self) -> str:
        return "Value(3)"


@pytest.mark.parametrize(
    ("feature", "name"),
    [
        (datasets.Value("int64"), "int64"),
        (datasets.Value("string"), "string"),
        (datasets.List(datasets.Value("string")), "List(Value('string'))"),
        (Value(), "Value(3)"),
        (Odd(), "'Odd(\\n" + "z" * 109 + "...'"),
    ],
)
def test_a_column_type_is_named_in_one_short_line(feature: object, name: str) -> None:
    assert source_module._feature_name(feature) == name


def test_a_long_printable_type_name_is_cut() -> None:
    class Long:
        def __repr__(self) -> str:
            return "L" * 121

    assert source_module._feature_name(Long()) == "'" + "L" * 115 + "...'"

    class Fits:
        def __repr__(self) -> str:
            return "F" * 120

    assert source_module._feature_name(Fits()) == "F" * 120
