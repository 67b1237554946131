"""The run record and the drift guard on real files: parquet written by the recipe's own data
code, a real config.json, `run` end to end with the stand-in trainer (tests/unit/runtools)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recipe.errors import RecipeConfigError
from recipe.digests import sha256_file
from recipe.provenance import MODEL_FILES
from recipe.record_file import RECORD_NAME
from recipe.settings import REDACTED, Settings
from tests.unit.export.conftest import TRACKER, plan_of, saved_run
from tests.unit.runtools import cli, layout_of_one, run_environment

def test_the_record_holds_the_inputs_and_is_deterministic(inputs: dict[str, str]) -> None:
    first, second = plan_of(inputs).provenance, plan_of(inputs).provenance
    assert first == second
    train = Path(inputs["TRAIN_FILES"])
    assert first["data"]["TRAIN_FILES"] == {
        "path": str(train), "size": train.stat().st_size, "rows": 12, "sha256": sha256_file(train),
    }
    assert first["data"]["VAL_FILES"]["rows"] == 4
    model = Path(inputs["MODEL_PATH"])
    assert first["model"]["files"]["config.json"] == sha256_file(model / "config.json")
    assert first["model"]["files"]["model.safetensors.index.json"] == sha256_file(model / "model.safetensors.index.json")
    assert first["frameworks"]["verl"] == "0.9.1"
    assert first["training"]["data.seed"] == "42" and first["training"]["actor_rollout_ref.rollout.seed"] == "42"
    assert "started" not in json.dumps(first)


def test_the_seeds_reach_verl_from_seed(inputs: dict[str, str]) -> None:
    argv = plan_of({**inputs, "SEED": "7"}).argv
    for key in ("data.seed", "actor_rollout_ref.actor.data_loader_seed", "actor_rollout_ref.actor.megatron.seed",
                "actor_rollout_ref.rollout.seed"):
        assert f"{key}=7" in argv


def test_changed_data_is_refused_naming_it_with_both_hashes(inputs: dict[str, str]) -> None:
    root = saved_run(inputs)
    train = Path(inputs["TRAIN_FILES"])
    before = sha256_file(train)
    train.write_bytes(train.read_bytes() + b"\0")
    with pytest.raises(RecipeConfigError) as caught:
        plan_of(inputs)
    [line] = caught.value.problems
    assert line.startswith(f"TRAIN_FILES: {before[:12]} when the checkpoint's run started ({root / RECORD_NAME}), "
                           f"{sha256_file(train)[:12]} now; ")
    assert "ALLOW_DRIFT=TRAIN_FILES" in line


def test_allow_drift_accepts_the_named_field_and_the_plan_says_so(inputs: dict[str, str], qwen35_copy: Path) -> None:
    values = {**inputs, "MODEL_PATH": str(qwen35_copy)}
    saved_run(values)
    (qwen35_copy / "chat_template.jinja").write_text("{{ messages }}")
    with pytest.raises(RecipeConfigError) as caught:
        plan_of(values)
    assert caught.value.problems[0].startswith("MODEL_PATH: chat_template.jinja (absent) when")
    plan = plan_of({**values, "ALLOW_DRIFT": "MODEL_PATH"})
    assert len(plan.drift_accepted) == 1 and plan.drift_accepted[0].endswith("(accepted: ALLOW_DRIFT)")
    assert "drift    MODEL_PATH: " in plan.to_text()


def test_a_changed_setting_is_named_by_the_setting(inputs: dict[str, str]) -> None:
    saved_run(inputs)
    with pytest.raises(RecipeConfigError) as caught:
        plan_of({**inputs, "TRAIN_BATCH_SIZE": "16"})
    assert [p.split(":")[0] for p in caught.value.problems] == ["TRAIN_BATCH_SIZE"]
    with pytest.raises(RecipeConfigError) as caught:
        plan_of(inputs, ("actor_rollout_ref.actor.clip_ratio=0.3",))
    assert [p.split(":")[0] for p in caught.value.problems] == ["actor_rollout_ref.actor.clip_ratio"]


def test_what_cannot_change_the_math_is_no_drift(inputs: dict[str, str], tmp_path: Path) -> None:
    saved_run(inputs)
    moved = tmp_path / "moved.parquet"
    shutil.copy(inputs["TRAIN_FILES"], moved)
    plan_of({**inputs, "TRAIN_FILES": str(moved), "SAVE_FREQ": "5", "TEST_FREQ": "-1"})


def test_no_resume_no_comparison(inputs: dict[str, str]) -> None:
    root = saved_run(inputs)
    changed = {**inputs, "TRAIN_BATCH_SIZE": "16"}
    plan_of(changed, ("trainer.resume_mode=disable",))
    (root / TRACKER).unlink()
    shutil.rmtree(root / "global_step_1")  # nothing saved and no tracker: verl starts afresh over nothing
    plan_of(changed)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_a_hostile_record_is_one_clear_refusal(inputs: dict[str, str], content: bytes) -> None:
    root = saved_run(inputs)
    (root / RECORD_NAME).write_bytes(content)
    with pytest.raises(RecipeConfigError) as caught:
        plan_of(inputs)
    [line] = caught.value.problems
    assert line.startswith(f"CHECKPOINT_DIR={inputs['CHECKPOINT_DIR']!r}: {root / RECORD_NAME}: not a run record")
    shutil.rmtree(root)


def test_run_writes_the_record_and_copies_it_into_each_new_step(tmp_path: Path, qwen35_saved: Path) -> None:
    work = tmp_path / "run"
    work.mkdir()
    root = work / "checkpoints" / "p" / "e"
    # An older step, finished (a sound export, its manifest, the tracker naming it): it keeps what it had (no record).
    shutil.copytree(qwen35_saved, root / "global_step_1" / "actor" / "model" / "huggingface")
    (root / "global_step_1" / "actor" / "ckpt_contents.json").write_text("{}")
    (root / "latest_checkpointed_iteration.txt").write_text("1")
    env = run_environment(work, qwen35_saved, **layout_of_one()) | {
        "STAND_IN_MODE": "save",
        "STAND_IN_EXPORT": str(qwen35_saved),
    }
    done = cli(["run"], env)
    assert done.returncode == 0, done.stderr
    record = json.loads((root / RECORD_NAME).read_text())
    assert set(record) == {"provenance", "started_at"}
    plan = json.loads(cli(["plan", "--json"], env).stdout)
    assert record["provenance"] == plan["provenance"]
    assert (root / "global_step_3" / RECORD_NAME).read_bytes() == (root / RECORD_NAME).read_bytes()
    assert not (root / "global_step_1" / RECORD_NAME).exists()


def test_the_hash_cache_is_reused_only_while_the_file_is_unchanged(tmp_path: Path) -> None:
    from recipe.digests import RACY_NS, cached_digest, hash_cache_path

    environ = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    data = tmp_path / "d.parquet"
    data.write_bytes(b"first")
    time.sleep(RACY_NS / 1e9)  # a file changed within the last second is never cached
    assert cached_digest(data, environ) == (sha256_file(data), None)
    cache = hash_cache_path(environ)
    forged = json.loads(cache.read_text())
    key = next(iter(forged))
    forged[key]["sha256"] = "0" * 64  # what the cache says is what it returns, while the key holds
    cache.write_text(json.dumps(forged))
    assert cached_digest(data, environ)[0] == "0" * 64
    data.write_bytes(b"second, longer")  # size and mtime move: hashed again
    assert cached_digest(data, environ)[0] == sha256_file(data)
    for hostile in (b"[1, 2]", b"\xff\xfe", b'{"x": 1}', b""):
        cache.write_bytes(hostile)
        assert cached_digest(data, environ)[0] == sha256_file(data)


def test_replay_gives_back_the_same_command_and_names_what_changed(tmp_path: Path, qwen35_saved: Path) -> None:
    import shlex

    work = tmp_path / "run"
    work.mkdir()
    env = run_environment(work, qwen35_saved, **layout_of_one(TRAIN_BATCH_SIZE="8", SEED="3"))
    assert cli(["run", "--", "actor_rollout_ref.actor.clip_ratio=0.25"], env).returncode == 0
    recorded_plan = json.loads(cli(["plan", "--json", "--", "actor_rollout_ref.actor.clip_ratio=0.25"], env).stdout)
    root = work / "checkpoints" / "p" / "e"

    replayed = cli(["replay", str(root)], env)
    assert replayed.returncode == 0 and replayed.stderr == "", replayed.stderr
    lines = [line for line in replayed.stdout.splitlines() if line and not line.startswith("#")]
    values = dict(shlex.split(line)[0].split("=", 1) for line in lines)
    assert values["TRAIN_BATCH_SIZE"] == "8" and values["SEED"] == "3"
    assert "# run with: entrypoint.py run -- actor_rollout_ref.actor.clip_ratio=0.25" in replayed.stdout
    # Only the record's settings (and what Python and the stand-in need): the same argv.
    fresh = {k: v for k, v in env.items() if k not in values and k not in {"TRAIN_BATCH_SIZE", "SEED"}} | values
    again = json.loads(cli(["plan", "--json", "--", "actor_rollout_ref.actor.clip_ratio=0.25"], fresh).stdout)
    assert again["argv"] == recorded_plan["argv"]

    Path(values["TRAIN_FILES"]).write_bytes(b"changed")
    changed = cli(["replay", str(root / RECORD_NAME)], env)
    assert changed.returncode == 0
    assert changed.stderr.startswith("replay: TRAIN_FILES changed since the record: ")


# --- issue 27: behaviours a one-line bug broke unnoticed ------------------------------------

#: The settings the settings model types as secrets (SecretStr): found from the model, not from its own list.
SECRET_FIELDS = sorted(
    name.upper() for name, field in Settings.model_fields.items() if "SecretStr" in str(field.annotation)
)


@pytest.mark.parametrize("name", SECRET_FIELDS)
def test_no_secret_setting_reaches_the_record_or_replay(inputs: dict[str, str], name: str) -> None:
    """A secret in the record, even redacted, would be replayed as `HF_TOKEN=**********` over the real one."""
    value = "hf_FAKE_SECRET_for_the_record_0123"
    root = saved_run(inputs | {name: value})
    stored = (root / RECORD_NAME).read_text()
    assert value not in stored and REDACTED not in stored and f'"{name}"' not in stored
    code, out, _ = _replay_of(root / RECORD_NAME)
    assert code == 0 and name not in out and REDACTED not in out


def _replay_of(path: Path) -> tuple[int, str, str]:
    import argparse
    import contextlib
    import io

    from recipe.replay import run_replay

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run_replay(argparse.Namespace(record=path, format="shell"))
    return code, out.getvalue(), err.getvalue()


def test_replay_names_each_model_file_that_changed(inputs: dict[str, str], tmp_path: Path) -> None:
    """Every file the record hashes for MODEL_PATH (config, tokenizer, processor, index)."""
    model = tmp_path / "model"
    shutil.copytree(inputs["MODEL_PATH"], model)
    for name in MODEL_FILES:
        if not (model / name).exists():
            (model / name).write_text("{}\n")
    root = saved_run(inputs | {"MODEL_PATH": str(model)})
    assert set(json.loads((root / RECORD_NAME).read_text())["provenance"]["model"]["files"]) == set(MODEL_FILES)
    for name in MODEL_FILES:
        original = (model / name).read_bytes()
        (model / name).write_bytes(original + b" ")
        code, _, err = _replay_of(root / RECORD_NAME)
        (model / name).write_bytes(original)
        [line] = [text for text in err.splitlines() if "changed since the record" in text]
        assert code == 0 and line.startswith(f"replay: MODEL_PATH changed since the record: {name} "), err


#: One way for each kind of field to drift: (stored part, now part) of a record.
DRIFTS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "RECIPE": ({"recipe_version": "0.1"}, {"recipe_version": "0.2"}),
    "FRAMEWORKS": ({"frameworks": {"verl": "0.9.1"}}, {"frameworks": {"verl": "0.9.2"}}),
    "IMAGE": ({"image": {"locks": {"gpu.lock": "a" * 64}}}, {"image": {"locks": {"gpu.lock": "b" * 64}}}),
    "MODEL_PATH": ({"model": {"files": {"config.json": "a" * 64}}}, {"model": {"files": {"config.json": "b" * 64}}}),
    "TRAIN_FILES": ({"data": {"TRAIN_FILES": {"sha256": "a" * 64}}}, {"data": {"TRAIN_FILES": {"sha256": "b" * 64}}}),
    "VAL_FILES": ({"data": {"VAL_FILES": {"sha256": "a" * 64}}}, {"data": {"VAL_FILES": {"sha256": "b" * 64}}}),
    "TP": ({"layout": {"tp": 2}}, {"layout": {"tp": 4}}),
    "SEED": ({"training": {"data.seed": "1"}}, {"training": {"data.seed": "2"}}),
    "actor_rollout_ref.actor.optim.lr": ({"training": {"actor_rollout_ref.actor.optim.lr": "1e-6"}},
                                         {"training": {"actor_rollout_ref.actor.optim.lr": "2e-6"}}),
    "MY_LR": ({"environment_reads": {"MY_LR": "1"}}, {"environment_reads": {"MY_LR": "2"}}),
    "reward.custom_reward_function.path": (
        {"referenced_files": {"reward.custom_reward_function.path": {"path": "r.py", "sha256": "a" * 64}}},
        {"referenced_files": {"reward.custom_reward_function.path": {"path": "r.py", "sha256": "b" * 64}}},
    ),
    "data.custom_cls.path": ({"referenced_files": {"data.custom_cls.path": {"path": "d.py", "sha256": "a" * 64}}},
                             {"referenced_files": {"data.custom_cls.path": {"path": "d.py", "sha256": "b" * 64}}}),
}  # fmt: skip


def _merged(parts: list[dict[str, Any]]) -> dict[str, Any]:
    merged: dict[str, Any] = {"setting_keys": {"data.seed": "SEED"}}
    for part in parts:
        for key, value in part.items():
            merged[key] = {**merged[key], **value} if isinstance(value, dict) and key in merged else value
    return merged


@given(
    drifted=st.sets(st.sampled_from(sorted(DRIFTS)), min_size=1),
    allowed=st.sets(st.sampled_from(sorted(DRIFTS) + ["TRAIN_FILE", "tp", "NOT_A_FIELD"])),
)
def test_allow_drift_accepts_exactly_the_fields_it_names(drifted: set[str], allowed: set[str]) -> None:
    """Naming one field never accepts another, nor does a near miss (`TRAIN_FILE`, `tp`)."""
    from recipe.provenance import drift_problems

    stored = _merged([DRIFTS[name][0] for name in sorted(drifted)])
    now = _merged([DRIFTS[name][1] for name in sorted(drifted)])
    refused, accepted = drift_problems(stored, now, sorted(allowed), Path("/ck/run-record.json"))
    assert {line.split(":")[0] for line in refused} == drifted - allowed
    assert {line.split(":")[0] for line in accepted} == drifted & allowed


def test_the_record_goes_into_a_new_step_saved_without_an_hf_export(tmp_path: Path, qwen35_saved: Path) -> None:
    work = tmp_path / "run"
    work.mkdir()
    root = work / "checkpoints" / "p" / "e"
    env = run_environment(work, qwen35_saved, **layout_of_one()) | {"STAND_IN_MODE": "save"}
    done = cli(["run"], env)
    assert (root / "global_step_3" / "actor").is_dir() and not (root / "global_step_3" / "actor" / "model").exists()
    assert (root / "global_step_3" / RECORD_NAME).read_bytes() == (root / RECORD_NAME).read_bytes(), done.stderr
