"""`run` and `plan` as users run them: the real CLI in its own process, end to end on CPU.

The trainer is the stand-in of runtools (through RECIPE_TEST_TRAINER, honoured by `run`
alone); everything before it is the product: settings, plan, machine checks, Ray roles,
the trainer's environment, signal passing and exit codes. Numbers are written out here,
not read from the code under test.
"""

from __future__ import annotations

import json
import shlex
import signal
from pathlib import Path

import pytest

from recipe.launch import override_value
from tests.support.ports import free_port

from .envtools import HANG_GUARD_S
from .runtools import cli, layout_of_one, recorded, run_environment, start_cli


def test_run_gives_the_trainer_the_plans_command_and_environment(tmp_path: Path, model: Path) -> None:
    env = run_environment(tmp_path, model, **layout_of_one(
        PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True,max_split_size_mb:128"))
    env.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    planned = cli(["plan", "--json", "--", "trainer.total_training_steps=2"], env)
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)

    done = cli(["run", "--", "trainer.total_training_steps=2"], env)
    assert done.returncode == 0, done.stderr
    got = recorded(tmp_path)
    assert got is not None, "the trainer never ran"
    # The command `plan` showed, announced on stdout, then run.
    assert got["argv"] == plan["argv"]
    assert got["argv"][1:3] == ["-m", "recipe.trainer_main"] and "trainer.total_training_steps=2" in got["argv"]
    assert f"Executing: {shlex.join(plan['argv'])}" in done.stdout.splitlines()
    # The environment the plan decided, not the one the user started with.
    trainer_env = got["env"]
    assert "expandable_segments:True" not in trainer_env.get("PYTORCH_CUDA_ALLOC_CONF", "")
    assert trainer_env["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128"
    assert trainer_env["RECIPE_EXPANDABLE_SEGMENTS"] == "1"
    assert trainer_env["RECIPE_DEVICE"] == "gpu"
    assert trainer_env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert trainer_env["TENSORBOARD_DIR"] == str(tmp_path / "checkpoints" / "tensorboard" / "p" / "e")
    for name, value in plan["env"].items():
        assert trainer_env.get(name) == value, name
    assert (tmp_path / "checkpoints").is_dir()


def test_expandable_segments_off_reaches_the_trainer_as_off(tmp_path: Path, model: Path) -> None:
    env = run_environment(tmp_path, model, **layout_of_one(EXPANDABLE_SEGMENTS="false"))
    done = cli(["run"], env)
    assert done.returncode == 0, done.stderr
    trainer_env = recorded(tmp_path)["env"]  # type: ignore[index]
    assert trainer_env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:False"
    assert trainer_env["RECIPE_EXPANDABLE_SEGMENTS"] == "0"


def test_the_trainers_exit_code_is_runs_exit_code(tmp_path: Path, model: Path) -> None:
    env = run_environment(tmp_path, model, **layout_of_one()) | {"STAND_IN_EXIT": "7"}
    assert cli(["run"], env).returncode == 7


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 43), (signal.SIGINT, 44)])
def test_a_signal_to_run_reaches_the_trainer_and_its_code_comes_back(
    tmp_path: Path, model: Path, sig: signal.Signals, code: int
) -> None:
    """`docker stop` (SIGTERM) or Ctrl-C: the trainer gets it and decides how to end."""
    env = run_environment(tmp_path, model, **layout_of_one()) | {"STAND_IN_MODE": "wait"}
    proc = start_cli(["run"], env)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # a condition, not a sleep: the trainer says it is up
            if line.strip() == "stand-in ready":
                break
        else:
            pytest.fail(f"the stand-in trainer never started (run exited {proc.wait()})")
        proc.send_signal(sig)
        assert proc.wait(timeout=HANG_GUARD_S) == code  # it ends at once; the limit only stops a hang
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_cluster_that_never_forms_exits_3_and_never_runs_the_trainer(tmp_path: Path, model: Path) -> None:
    """KubeRay's RAY_ADDRESS with no Ray there: exit 3 (a restart may help), not 2 (a config error)."""
    address = f"127.0.0.1:{free_port()}"
    env = run_environment(tmp_path, model, **layout_of_one(RAY_ADDRESS=address, RAY_WAIT_TIMEOUT="1"))
    done = cli(["run"], env)
    assert done.returncode == 3, done.stderr
    assert f"error: address {address}: no Ray head answered within 1s" in done.stderr.splitlines()
    assert recorded(tmp_path) is None


def test_a_worker_node_whose_head_never_answers_exits_3(tmp_path: Path, model: Path) -> None:
    port = free_port()
    env = run_environment(tmp_path, model, **layout_of_one(
        NNODES="2", NODE_RANK="1", MASTER_ADDR="127.0.0.1", RAY_PORT=str(port), RAY_WAIT_TIMEOUT="1",
        RAY_AUTH_MODE="disabled"))
    done = cli(["run"], env)
    assert done.returncode == 3, done.stderr
    assert (f"error: MASTER_ADDR:RAY_PORT=127.0.0.1:{port}: no Ray head answered within 1s (NODE_RANK=1)"
            in done.stderr.splitlines())
    assert recorded(tmp_path) is None


def test_an_unfit_machine_exits_2_before_anything_runs(tmp_path: Path, model: Path) -> None:
    env = run_environment(tmp_path, model, **layout_of_one()) | {"TEST_VISIBLE_DEVICES": "0"}
    done = cli(["run"], env)
    assert done.returncode == 2
    assert any(line.startswith("error: DEVICE=gpu: no gpu device found") for line in done.stderr.splitlines())
    assert recorded(tmp_path) is None and not (tmp_path / "checkpoints").exists()


# --- PROFILE=smoke, as users set it: one variable ----------------------------------------------


def _smoke_plan(tmp_path: Path, *extra: str, **settings: str) -> dict:
    env = run_environment(tmp_path, tmp_path / "unused", PROFILE="smoke", DEVICE="gpu", **settings)
    for name in {"MODEL_PATH", "TRAIN_FILES", "VAL_FILES"} - set(settings):
        env.pop(name)  # the profile decides them
    done = cli(["plan", "--json", *(["--", *extra] if extra else [])], env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_profile_smoke_takes_its_defaults(tmp_path: Path) -> None:
    plan = _smoke_plan(tmp_path)
    settings, layout = plan["settings"], plan["layout"]
    assets = tmp_path / "checkpoints" / "smoke-assets"
    assert settings["PROFILE"] == "smoke"
    assert (settings["TRAIN_BATCH_SIZE"], settings["ROLLOUT_N"], settings["TOTAL_EPOCHS"]) == (4, 4, 1)
    assert (settings["SAVE_FREQ"], settings["TEST_FREQ"], settings["OFFLOAD"]) == (3, 3, False)
    assert settings["MODEL_PATH"] == str(assets / "model")
    assert settings["TRAIN_FILES"] == str(assets / "data" / "train.parquet")
    assert settings["VAL_FILES"] == str(assets / "data" / "test.parquet")
    sizes = [layout[k] for k in ("tp", "pp", "cp", "ep", "etp", "gen_tp", "ndevices_per_node", "world_size")]
    assert sizes == [1, 1, 1, 1, 1, 1, 1, 1]
    # Before the first run the layout is checked against the shipped tiny config, not the 35B profile.
    assert plan["model"]["num_experts"] == 8 and plan["model"]["source"].endswith("config.json")


def test_profile_smoke_adds_its_overrides_and_the_users_come_last(tmp_path: Path) -> None:
    plan = _smoke_plan(tmp_path)
    overrides = plan["overrides"]
    assert override_value(overrides, "trainer.total_training_steps") == "3"
    assert override_value(overrides, "trainer.resume_mode") == "disable"
    assert override_value(overrides, "data.max_prompt_length") == "256"
    assert override_value(overrides, "data.max_response_length") == "64"
    assert override_value(overrides, "data.train_batch_size") == "4"
    assert plan["argv"][3:] == overrides
    user = _smoke_plan(tmp_path, "trainer.total_training_steps=5")
    assert override_value(user["overrides"], "trainer.total_training_steps") == "5"


def test_a_user_setting_beats_the_smoke_default(tmp_path: Path) -> None:
    plan = _smoke_plan(tmp_path, TRAIN_BATCH_SIZE="8", MODEL_PATH=str(tmp_path / "elsewhere"))
    assert plan["settings"]["TRAIN_BATCH_SIZE"] == 8
    assert plan["settings"]["MODEL_PATH"] == str(tmp_path / "elsewhere")
    assert plan["settings"]["ROLLOUT_N"] == 4


def test_a_node_without_the_host_ram_for_the_offloaded_state_is_refused(tmp_path: Path) -> None:
    """The default gpu plan keeps about 720 GiB of optimizer state and offloaded weights on each node's host; a node
    with 512 GiB is named with both figures, before anything starts. This machine's own RAM is read from
    /proc/meminfo (and a cgroup v2 limit, when lower)."""
    from recipe.plan import build_plan
    from recipe.run import preflight

    from .envtools import settings_of

    plan = build_plan(settings_of(DEVICE="gpu", CHECKPOINT_DIR=str(tmp_path)), environ={})
    assert preflight.host_memory_problem(plan, 2048 << 30) is None
    problem = preflight.host_memory_problem(plan, 512 << 30)
    assert problem is not None and problem.startswith("OFFLOAD=true, NDEVICES_PER_NODE=8, TP=2, PP=1, EP=8: the plan keeps 719 GiB")
    assert "optimizer state (fp32) 393 GiB" in problem and "this node has 512 GiB" in problem
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(preflight, "node_memory_bytes", lambda: 512 << 30)
        assert problem in preflight.run_problems(plan)


def test_the_node_s_ram_is_memtotal_or_a_lower_container_limit(tmp_path: Path) -> None:
    from recipe.run.preflight import node_memory_bytes

    meminfo, limit = tmp_path / "meminfo", tmp_path / "memory.max"
    meminfo.write_text("MemTotal:       2097152 kB\nMemFree:        1048576 kB\n")
    assert node_memory_bytes(meminfo, tmp_path / "absent") == 2 << 30
    limit.write_text("max\n")
    assert node_memory_bytes(meminfo, limit) == 2 << 30
    limit.write_text(f"{1 << 30}\n")
    assert node_memory_bytes(meminfo, limit) == 1 << 30
    assert node_memory_bytes(tmp_path / "absent", tmp_path / "absent") is None


def _manifest_for(train: Path, tokens: list[int]) -> None:
    """prepare-data's manifest.json beside `train`, naming it with its sha256 and its prompts' lengths."""
    import hashlib

    (train.parent / "manifest.json").write_text(json.dumps({
        "files": {"train": {"file": train.name, "rows": len(tokens), "sha256": hashlib.sha256(train.read_bytes()).hexdigest()}},
        "prompt_tokens": {"train": {"rows": len(tokens), "tokens": tokens}},
    }))  # fmt: skip


def test_run_warns_before_the_trainer_when_the_prompt_budget_drops_rows(tmp_path: Path, model: Path) -> None:
    """prepare-data counted the prompts (images included): 3 of 100 are over the planned data.max_prompt_length
    (1024), so `run` says so, with the length that keeps 99 %, before the trainer starts; the run goes on."""
    env = run_environment(tmp_path, model, **layout_of_one())
    _manifest_for(tmp_path / "train.parquet", [500] * 97 + [1100, 1200, 1300])
    done = cli(["run"], env)
    assert done.returncode == 0, done.stderr
    assert recorded(tmp_path) is not None, "the trainer never ran"
    assert (
        "data.max_prompt_length=1024: verl will drop 3 of the 100 training rows (3.0 %) as too long, without a word "
        "(their prompts, counted with their images by prepare-data, are longer); 1200 keeps 99 %: "
        "`data.max_prompt_length=1200` (in OVERRIDES, or after `--` of plan and run); plan shows what it costs in memory"
    ) in done.stderr
    # Within budget (an override after `--` raises it), or a manifest for another file: no warning.
    assert "verl will drop" not in cli(["run", "--", "data.max_prompt_length=1300"], env).stderr
    (tmp_path / "train.parquet").write_bytes(b"changed")
    assert "verl will drop" not in cli(["run"], env).stderr
