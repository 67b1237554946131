"""MODEL_PATH's config.json as `plan` reads it, beyond test_models.py: what `plan --json` shows of the model, the
name it carries, where a read stops, and the one line for each way the file or its folder cannot be read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from recipe import models
from recipe.errors import RecipeConfigError
from recipe.model_sizes import QWEN3_5_35B_A3B_CONFIG
from recipe.models import MAX_CONFIG_BYTES, QWEN3_5_35B_A3B, architecture_from_config, load_architecture

#: The architecture fields `plan --json` shows, with the built-in profile's values (from Qwen3.5-35B-A3B's config.json).
PROFILE = {
    "name": "Qwen3.5-35B-A3B", "num_layers": 40, "num_attention_heads": 16, "num_kv_heads": 2, "num_experts": 256,
    "moe_ffn_hidden_size": 512, "linear_key_heads": 16, "linear_value_heads": 32,
}  # fmt: skip


def _config() -> dict[str, Any]:
    """A fresh copy of Qwen3.5-35B-A3B's config.json."""
    return json.loads(json.dumps(QWEN3_5_35B_A3B_CONFIG))


def _refused(model_path: Path) -> list[str]:
    with pytest.raises(RecipeConfigError) as caught:
        load_architecture(model_path)
    return caught.value.problems


def test_plan_json_shows_the_source_the_architecture_and_the_sizes(tmp_path: Path) -> None:
    source = load_architecture(tmp_path)
    assert QWEN3_5_35B_A3B.to_dict() == PROFILE
    assert source.sizes is not None
    assert source.to_dict() == {"source": source.source, **PROFILE, "sizes": source.sizes.to_dict()}


def test_plan_json_says_why_the_sizes_are_unknown(tmp_path: Path) -> None:
    config = _config()
    del config["vision_config"]["depth"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    shown = load_architecture(tmp_path).to_dict()
    assert shown["sizes"] == {"unknown": "config.json lacks depth"}
    assert shown["source"] == str(tmp_path / "config.json") and shown["name"] == str(tmp_path)


def test_the_architecture_read_from_a_model_folder_is_named_after_it(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(_config()))
    assert load_architecture(tmp_path).architecture == models.ModelArchitecture(**{**PROFILE, "name": str(tmp_path)})


@pytest.mark.parametrize(("text_config", "kind"), [([1], "list"), ("x", "str"), (3, "int")])
def test_a_text_config_that_is_no_object_is_named_with_its_json_kind(text_config: object, kind: str) -> None:
    with pytest.raises(RecipeConfigError) as caught:
        architecture_from_config({"text_config": text_config}, "/m")
    assert caught.value.problems == [f"MODEL_PATH='/m': config.json text_config must be a JSON object, not {kind}"]


def test_a_count_the_memory_estimate_refuses_is_named_with_the_model_path(tmp_path: Path) -> None:
    config = _config()
    config["text_config"]["hidden_size"] = -1  # not a count the layout reads: only the memory estimate's check sees it
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert _refused(tmp_path) == [
        f"MODEL_PATH={str(tmp_path)!r}: config.json hidden_size=-1: must be a whole number from 1 to 2147483647 "
        "(0 would leave the memory estimate's term for it empty)"
    ]


def test_a_count_missing_from_a_model_folders_config_names_the_folder(tmp_path: Path) -> None:
    config = _config()
    del config["text_config"]["num_key_value_heads"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert _refused(tmp_path) == [f"MODEL_PATH={str(tmp_path)!r}: config.json lacks num_key_value_heads"]


def test_a_config_of_exactly_the_size_limit_is_read_whole(tmp_path: Path) -> None:
    body = json.dumps(_config()).encode()
    # Whitespace before the object: a read that stopped short would cut its closing brace.
    (tmp_path / "config.json").write_bytes(b" " * (MAX_CONFIG_BYTES - len(body)) + body)
    assert load_architecture(tmp_path).architecture.num_layers == 40


def test_a_config_that_grew_after_its_size_was_checked_is_read_only_one_byte_past_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "config.json").write_bytes(b" " * MAX_CONFIG_BYTES + b"[1, 2]")
    real_fstat = models.os.fstat

    def fstat(fd: int) -> Any:  # the size as it was when looked at, before the file grew
        info = real_fstat(fd)
        return type("Stat", (), {"st_mode": info.st_mode, "st_size": 0})()

    monkeypatch.setattr(models.os, "fstat", fstat)
    column = MAX_CONFIG_BYTES + 1  # the `[` read as the last byte, and nothing after it
    assert _refused(tmp_path) == [
        f"MODEL_PATH={str(tmp_path)!r}: config.json: not JSON (Expecting value, line 1 column {column + 1})"
    ]


@pytest.mark.skipif(not Path("/proc/self/mem").exists(), reason="needs Linux's /proc/self/mem")
def test_a_config_whose_read_fails_is_unreadable_with_the_systems_reason(tmp_path: Path) -> None:
    # /proc/self/mem is a regular file of size 0 whose first bytes (address 0) cannot be read.
    (tmp_path / "config.json").symlink_to("/proc/self/mem")
    assert _refused(tmp_path) == [f"MODEL_PATH={str(tmp_path)!r}: config.json is unreadable (Input/output error)"]


def test_a_model_path_that_cannot_be_examined_says_why(tmp_path: Path) -> None:
    loop = tmp_path / "loop"
    loop.symlink_to(loop)  # a link to itself: config.json under it cannot even be looked at
    assert _refused(loop) == [
        f"MODEL_PATH={str(loop)!r}: config.json cannot be examined (Too many levels of symbolic links)"
    ]
