"""The command line: plan/run behaviour, exit codes, one line per problem, signals and exit codes of the trainer."""

from __future__ import annotations

import json
import shlex
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings as hsettings, strategies as st

from .envtools import ENTRYPOINT, HANG_GUARD_S, REPO, clear_settings, entrypoint_env
from recipe import __version__
from recipe.cli import main


def _run(*args: str, **settings: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ENTRYPOINT, *args], env=entrypoint_env(**settings), capture_output=True, text=True, timeout=HANG_GUARD_S)


def test_plan_json_with_no_environment_is_one_json_document() -> None:
    done = _run("plan", "--json")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["recipe_version"] == __version__
    assert plan["device"]["name"] in {"gpu", "npu"} and plan["device"]["reason"]
    assert plan["argv"][1:3] == ["-m", "recipe.trainer_main"]
    assert plan["argv"][3:] == plan["overrides"]
    assert set(plan) >= {"settings", "layout", "model", "allocator", "env"}


def test_plan_json_reflects_the_environment() -> None:
    plan = json.loads(_run("plan", "--json", DEVICE="npu", TP="4", PP="1", GEN_TP="2").stdout)
    assert plan["device"] == {"name": "npu", "source": "setting", "reason": "DEVICE=npu was set", "visible_devices": plan["device"]["visible_devices"]}
    assert (plan["layout"]["tp"], plan["layout"]["pp"], plan["layout"]["gen_tp"], plan["layout"]["ndevices_per_node"]) == (4, 1, 2, 16)
    assert plan["layout"]["sources"]["TP"] == "environment" and plan["layout"]["sources"]["EP"] == "default for npu (a3)"


def test_plan_for_people_names_device_layout_and_command() -> None:
    done = _run("plan", DEVICE="gpu")
    assert done.returncode == 0
    assert "device   gpu (setting: DEVICE=gpu was set)" in done.stdout
    assert "TP=2 PP=1 CP=1 EP=8 ETP=1 GEN_TP=8 DP=4" in done.stdout
    assert "-m recipe.trainer_main" in done.stdout


def test_plan_on_npu_uses_upstreams_npu_layout() -> None:
    """Upstream's npu launch: TP2 PP2 CP1 EP8 ETP1 GEN_TP8 on 16 NPUs (8 A3 cards of 2 dies)."""
    done = _run("plan", DEVICE="npu")
    assert done.returncode == 0, done.stderr
    assert "TP=2 PP=2 CP=1 EP=8 ETP=1 GEN_TP=8 DP=4 on 1 node(s) x 16 = 16 devices" in done.stdout


def test_plan_imports_no_torch_ray_or_verl() -> None:
    code = textwrap.dedent(
        """
        import contextlib, io, sys
        from recipe.cli import main
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["plan", "--json"]) == 0
        print(sorted({m.split(".")[0] for m in sys.modules} & {"torch", "torch_npu", "ray", "verl", "transformers", "hydra"}))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], env=entrypoint_env(), capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_bad_values_exit_2_with_one_line_each_and_no_traceback() -> None:
    done = _run("plan", "--json", TP="3", EP="6", NNODES="zero", DEVICE="gpu")
    assert done.returncode == 2
    assert json.loads(done.stdout)["errors"] == ["NNODES='zero': must be a whole number"]  # --json: a document
    assert done.stderr.splitlines() == ["error: NNODES='zero': must be a whole number"]
    done = _run("plan", "--json", TP="3", EP="6", DEVICE="gpu")
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "error: TP=3: must divide the model's 16 attention heads" in lines
    assert "error: EP=6: must divide the model's 256 experts" in lines


def test_secrets_never_reach_plan_output() -> None:
    done = _run("plan", "--json", HF_TOKEN="hf_do_not_print", WANDB_API_KEY="wandb_do_not_print")
    assert done.returncode == 0
    assert "do_not_print" not in done.stdout + done.stderr
    assert json.loads(done.stdout)["settings"]["HF_TOKEN"] == "**********"


def test_run_without_an_accelerator_refuses_and_writes_nothing(tmp_path: Path) -> None:
    checkpoints = tmp_path / "new-checkpoints"
    done = _run("run", DEVICE="gpu", CHECKPOINT_DIR=str(checkpoints), MODEL_PATH=str(tmp_path / "model"), DATA_DIR=str(tmp_path))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    if not any(Path("/dev").glob("nvidia[0-9]*")):
        assert any(line.startswith("error: DEVICE=gpu: no gpu device found") for line in lines)
    assert f"error: MODEL_PATH={str(tmp_path / 'model')!r}: no config.json there (download the model first)" in lines
    assert any(line.startswith(f"error: TRAIN_FILES={str(tmp_path / 'geo3k' / 'train.parquet')!r}: file not found") for line in lines)
    assert any(line.startswith("error: VAL_FILES=") for line in lines)
    assert "Executing" not in done.stdout
    assert not checkpoints.exists()


def test_extra_overrides_after_double_dash_reach_the_plan() -> None:
    plan = json.loads(_run("plan", "--json", "--", "actor_rollout_ref.actor.optim.lr=5e-7").stdout)
    assert "actor_rollout_ref.actor.optim.lr=5e-7" in plan["overrides"]


_value = st.one_of(
    st.none(), st.integers(-3, 40).map(str), st.sampled_from(["", "abc", "1.5", " 2 ", "1e3", "-0", "٣"])
)


@hsettings(max_examples=200, deadline=None)
@given(
    device=st.sampled_from([None, "gpu", "npu", "auto", "tpu", ""]),
    sizes=st.fixed_dictionaries({k: _value for k in ["TP", "PP", "CP", "EP", "ETP", "GEN_TP", "NNODES", "NDEVICES_PER_NODE"]}),
)
def test_any_combination_exits_0_or_2_with_named_lines(device: str | None, sizes: dict[str, str | None]) -> None:
    import contextlib
    import io

    with pytest.MonkeyPatch.context() as mp:
        clear_settings(mp)
        for name, value in {"DEVICE": device, **sizes}.items():
            if value is not None:
                mp.setenv(name, value)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["plan", "--json"])
    if code == 0:
        json.loads(out.getvalue())
        assert err.getvalue() == ""
    else:
        lines = err.getvalue().splitlines()
        assert code == 2 and json.loads(out.getvalue())["errors"] == [line.removeprefix("error: ") for line in lines]
        assert lines and all(line.startswith("error: ") and "=" in line.split(":")[1] for line in lines)


TRAINER_STUB = textwrap.dedent(
    """
    import signal, sys, time
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(43))
    print("ready", flush=True)
    time.sleep(60)
    """
)


def test_execute_passes_sigterm_to_the_trainer_and_returns_its_code(tmp_path: Path) -> None:
    runner = tmp_path / "runner.py"
    runner.write_text(
        "import os, sys\nfrom recipe.run.trainer import execute\n"
        f"sys.exit(execute([sys.executable, '-c', {TRAINER_STUB!r}], dict(os.environ)))\n"
    )
    proc = subprocess.Popen([sys.executable, str(runner)], stdout=subprocess.PIPE, text=True, cwd=REPO, env=entrypoint_env())
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=HANG_GUARD_S) == 43


def test_execute_reports_a_signal_death_as_128_plus_n() -> None:
    from recipe.run.trainer import execute

    assert execute([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"], dict(os.environ)) == 128 + 9
    assert execute([sys.executable, "-c", "raise SystemExit(7)"], dict(os.environ)) == 7


def test_a_command_without_its_packages_says_so_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only `plan` runs on the package's small dependencies; the others name what is missing."""
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail as if absent
    clear_settings(monkeypatch)
    out = tmp_path / "gsm8k"
    assert main(["prepare-data", "gsm8k", "--out", str(out)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == (
        "error: prepare-data needs the Python package providing 'datasets', which is not installed: "
        "use the image (docker compose run --rm gpu|npu ...) or pip install '.[trainer]'"
    )
    assert not out.exists()


@pytest.mark.parametrize("command", ["plan", "run"])
@pytest.mark.parametrize("override", ["trainer.total_training_steps=5", "+my.values=[1,2]"])
def test_overrides_given_without_the_double_dash_get_the_command_that_works(command: str, override: str) -> None:
    done = _run(command, override, DEVICE="gpu")
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("error: ") and f"e.g. entrypoint.py {command} -- " in line and override in line
    fixed = _run("plan", "--", override, DEVICE="gpu")
    assert fixed.returncode == 0, fixed.stderr  # the suggested spelling is accepted


def test_an_unknown_option_is_still_argparses_error() -> None:
    done = _run("plan", "--bogus", DEVICE="gpu")
    assert done.returncode == 2 and "unrecognized arguments: --bogus" in done.stderr


def test_data_files_that_are_not_files_are_plan_errors(tmp_path: Path) -> None:
    import os

    (tmp_path / "train").mkdir()
    os.mkfifo(tmp_path / "val.fifo")
    done = _run("plan", DEVICE="gpu", TRAIN_FILES=str(tmp_path / "train"), VAL_FILES=str(tmp_path / "val.fifo"))
    assert done.returncode == 2
    assert f"error: TRAIN_FILES='{tmp_path / 'train'}': a directory; name the parquet file itself" in done.stderr
    assert f"error: VAL_FILES='{tmp_path / 'val.fifo'}': not a regular file" in done.stderr


@pytest.mark.parametrize("device", ["gpu", "npu"])
def test_the_readable_plan_and_plan_json_describe_the_same_argv(device: str) -> None:
    """One override per line, grouped; the same items as the exact argv, each once, argv's order kept within a group."""
    extra = ["actor_rollout_ref.actor.optim.lr=2e-6", "+my_section.note='two words'"]
    text = _run("plan", "--", *extra, DEVICE=device).stdout
    argv = json.loads(_run("plan", "--json", "--", *extra, DEVICE=device).stdout)["argv"]
    head, _, body = text.partition("\ncommand  ")
    listed = [line[12:] for line in body.splitlines()[1:]]
    assert body.startswith(shlex.join(argv[:3]) + ", with these overrides")
    assert sorted(listed) == sorted(argv[3:]) and len(set(listed)) == len(listed)
    assert [item for item in argv[3:] if item in extra] == extra
    order = {item: index for index, item in enumerate(argv[3:])}
    groups: dict[str, list[int]] = {}
    label = ""
    for line in body.splitlines()[1:]:
        label = line[2:11].strip() or label
        groups.setdefault(label, []).append(order[line[12:]])
    assert all(indexes == sorted(indexes) for indexes in groups.values())
    assert {"data", "actor", "rollout", "trainer", "ray"} <= set(groups)


@pytest.mark.parametrize(
    ("argv", "settings"),
    [
        (["plan", "--json"], {"TP": "3"}),
        (["plan", "--json", "--", "trainer.total_epochs=1"], {}),
        (["verify-export", "/nonexistent", "--json"], {}),
        (["doctor", "--json", "--only", "no-such-check"], {}),
        # argparse's own usage errors are documents too.
        (["plan", "--json", "x=1"], {}),
        (["plan", "--json", "--bogus"], {}),
        (["verify-export", "--json"], {}),
        (["doctor", "--json", "--timeout", "inf"], {}),
    ],
    ids=["plan-bad-layout", "plan-decided-key", "verify-export-missing", "doctor-selects-nothing", "plan-override-without-dashes",
         "plan-unknown-option", "verify-export-no-dir", "doctor-bad-timeout"],
)  # fmt: skip
def test_a_json_command_that_fails_still_prints_one_json_document(argv: list[str], settings: dict[str, str]) -> None:
    done = _run(*argv, DEVICE="gpu", **settings)
    document = json.loads(done.stdout)  # stdout is exactly one document
    assert document["status"] == "error" and document["exit_code"] == done.returncode == 2
    assert document["command"] == argv[0]
    assert [f"error: {problem}" for problem in document["errors"]] == [
        line for line in done.stderr.splitlines() if line.startswith("error: ")
    ]


@hsettings(max_examples=25, deadline=None)
@given(
    control=st.sampled_from(["\n", "\r", "\x1b[31m", "\u2028", "\x85", "\u202e"]),
    text=st.text(max_size=30).filter(lambda a: "\x00" not in a),
    where=st.sampled_from(["unknown option", "bad value"]),
)
def test_a_hostile_argument_is_one_escaped_error_line(control: str, text: str, where: str) -> None:
    """Whatever argparse quotes back (an unknown option, a bad value) cannot forge lines or terminal codes."""
    import contextlib
    import io

    argument = f"{text}{control}error: forged"
    argv = ["plan", f"--bogus{argument}"] if where == "unknown option" else ["doctor", "--timeout", argument]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        main(argv)
    lines = err.getvalue().splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and all(line.isprintable() for line in errors), lines
