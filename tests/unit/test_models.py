"""MODEL_PATH's config.json as `plan` reads it: the built-in profile when absent, one exact line for anything unusable.

test_hostile_settings.py checks the same through the entrypoint; this pins each message, in-process.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from recipe.errors import RecipeConfigError
from recipe.model_sizes import QWEN3_5_35B_A3B_CONFIG
from recipe.models import MAX_CONFIG_BYTES, QWEN3_5_35B_A3B, load_architecture


def _write(text: bytes) -> Callable[[Path], None]:
    return lambda path: path.write_bytes(text)


def _sparse(path: Path) -> None:
    with open(path, "wb") as handle:
        handle.truncate(MAX_CONFIG_BYTES + 1)


#: What config.json is, and the line `plan` says about it (after `MODEL_PATH='<dir>': config.json`).
UNUSABLE: dict[str, tuple[Callable[[Path], None], str]] = {
    "a folder": (lambda path: path.mkdir(), " is not a regular file (a directory, FIFO, socket or device)"),
    "a FIFO": (lambda path: os.mkfifo(path), " is not a regular file (a directory, FIFO, socket or device)"),
    "a link to nothing": (lambda path: path.symlink_to(path.with_name("gone.json")), " is unreadable (No such file or directory)"),
    "too large": (_sparse, f" is {MAX_CONFIG_BYTES + 1} bytes, larger than any model config ({MAX_CONFIG_BYTES})"),
    "not UTF-8": (_write(b"\xff\xfe{}"), ": not UTF-8 text (byte 0)"),
    "not JSON": (_write(b"{"), ": not JSON (Expecting property name enclosed in double quotes, line 1 column 2)"),
    "nested too deep": (_write(b"[" * 100_000 + b"]" * 100_000), ": nested too deep to be read"),
    "a 5000-digit number": (_write(b'{"num_attention_heads": ' + b"9" * 5000 + b"}"),
                            ": not JSON: a number of more than 4,300 digits"),
    "a list": (_write(b"[1, 2]"), " is not a JSON object"),
}  # fmt: skip


@pytest.mark.parametrize("kind", sorted(UNUSABLE))
def test_an_unusable_config_json_is_one_exact_line(tmp_path: Path, kind: str) -> None:
    make, why = UNUSABLE[kind]
    make(tmp_path / "config.json")
    with pytest.raises(RecipeConfigError) as caught:
        load_architecture(tmp_path)
    assert caught.value.problems == [f"MODEL_PATH={str(tmp_path)!r}: config.json{why}"]


def test_no_config_json_is_the_built_in_profile_and_says_so(tmp_path: Path) -> None:
    source = load_architecture(tmp_path)
    assert source.architecture == QWEN3_5_35B_A3B and source.sizes is not None
    assert source.source == f"built-in profile {QWEN3_5_35B_A3B.name} ({tmp_path / 'config.json'} not found)"


def test_a_model_path_that_is_a_file_is_not_a_directory(tmp_path: Path) -> None:
    (tmp_path / "weights").write_text("x")
    with pytest.raises(RecipeConfigError) as caught:
        load_architecture(tmp_path / "weights")
    assert caught.value.problems == [f"MODEL_PATH={str(tmp_path / 'weights')!r}: is not a directory"]


def test_a_real_config_is_read_with_its_sizes_and_its_file_named(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_5_35B_A3B_CONFIG))
    source = load_architecture(tmp_path)
    assert source.architecture.num_attention_heads == QWEN3_5_35B_A3B.num_attention_heads
    assert source.source == str(tmp_path / "config.json") and source.sizes is not None and source.sizes_problem is None


def test_a_config_without_the_sizes_keys_plans_without_an_estimate_and_says_why(tmp_path: Path) -> None:
    config = json.loads(json.dumps(QWEN3_5_35B_A3B_CONFIG))
    del config["vision_config"]["depth"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    source = load_architecture(tmp_path)
    assert source.sizes is None and source.sizes_problem == "config.json lacks depth"


@pytest.mark.parametrize(
    ("value", "shown"),
    [(0, "0"), (2**31, "2147483648"), (True, "true"), (1.5, "1.5"), ("x" * 60, json.dumps("x" * 60)[:40]), ([1], "<list>"),
     ({"a": 1}, "<dict>")],
)  # fmt: skip
def test_a_count_the_layout_reads_that_is_no_count_is_named_with_its_value(value: object, shown: str) -> None:
    from recipe.models import architecture_from_config

    config = json.loads(json.dumps(QWEN3_5_35B_A3B_CONFIG))
    config["text_config"]["num_attention_heads"] = value
    with pytest.raises(RecipeConfigError) as caught:
        architecture_from_config(config, "/m")
    assert f"MODEL_PATH='/m': config.json num_attention_heads={shown}: must be a positive whole number up to 2147483647" in (
        caught.value.problems
    )


@pytest.mark.parametrize("value", [1, 2**31 - 1])
def test_the_bounds_of_a_count_are_counts(value: int) -> None:
    from recipe.models import architecture_from_config

    config = json.loads(json.dumps(QWEN3_5_35B_A3B_CONFIG))
    config["text_config"]["num_attention_heads"] = value
    assert architecture_from_config(config, "/m").num_attention_heads == value


def test_a_missing_count_names_every_key_that_would_give_it() -> None:
    from recipe.models import architecture_from_config

    config = json.loads(json.dumps(QWEN3_5_35B_A3B_CONFIG))
    del config["text_config"]["num_experts"]
    with pytest.raises(RecipeConfigError) as caught:
        architecture_from_config(config, "/m")
    assert caught.value.problems == ["MODEL_PATH='/m': config.json lacks num_experts/num_local_experts/n_routed_experts"]
