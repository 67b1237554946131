"""The command line in this process: dispatch, exit codes, error and warning lines, JSON documents.

test_cli.py runs the entrypoint as a subprocess (the real thing, end to end); these call
recipe.cli.main directly with a clean environment, so that every branch of the CLI is pinned
quickly: which handler each command reaches and with what, the exact lines on stderr, exit
code 2 for bad input and 3 for a cluster that did not form, and one JSON document with --json.
The handlers themselves are replaced where the command would train, export or download.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from recipe import __version__, cli
from recipe.cluster.rules import ClusterError
from recipe.errors import RecipeConfigError

from .envtools import clear_settings

EXIT_CONFIG = 2


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[pytest.MonkeyPatch]:
    """No recipe setting set, DEVICE=gpu, and a working directory without a .env file."""
    clear_settings(monkeypatch)
    monkeypatch.setenv("DEVICE", "gpu")
    monkeypatch.chdir(tmp_path)
    yield monkeypatch


def _errors(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error: ")]


def _warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("warning: ")]


def _exit_code(argv: list[str]) -> int | str | None:
    """main's exit code, whether returned or raised by argparse (SystemExit)."""
    try:
        return cli.main(argv)
    except SystemExit as left:
        return left.code


class Recorder:
    """A stand-in for a command's handler: records what it was called with, returns a given code."""

    def __init__(self, code: int = 0, raises: BaseException | None = None) -> None:
        self.code, self.raises = code, raises
        self.calls: list[tuple[Any, ...]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> int:
        self.calls.append((*args, kwargs))
        if self.raises is not None:
            raise self.raises
        return self.code


# --- plan ---------------------------------------------------------------------------------------


def test_plan_prints_the_plan_for_people(env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plan"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("device   gpu (setting: DEVICE=gpu was set)\n")
    assert "TP=2 PP=1 CP=1 EP=8 ETP=1 GEN_TP=8 DP=4 on 1 node(s) x 8 = 8 devices" in out


def test_plan_json_is_one_document(env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plan", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["recipe_version"] == __version__ and plan["device"]["name"] == "gpu"
    assert plan["argv"][1:3] == ["-m", "recipe.trainer_main"]


def test_every_word_after_the_double_dash_is_the_trainers(env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # `--json` there is an override (a bad one), not our option: no JSON document.
    assert cli.main(["plan", "--", "--json"]) == EXIT_CONFIG
    captured = capsys.readouterr()
    assert captured.out == ""
    assert _errors(captured.err) == ["error: override '--json': must look like key=value (Hydra override syntax)"]


def test_bad_settings_exit_2_with_one_line_each_and_a_json_document(env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    env.setenv("NNODES", "zero")
    env.setenv("SEED", "-1")
    assert cli.main(["plan", "--json"]) == EXIT_CONFIG
    captured = capsys.readouterr()
    lines = ["NNODES='zero': must be a whole number", "SEED='-1': must be at least 0"]
    assert _errors(captured.err) == [f"error: {line}" for line in lines]
    assert json.loads(captured.out) == {"schema_version": 1, "command": "plan", "status": "error", "exit_code": 2, "errors": lines}


def test_bad_settings_without_json_leave_stdout_empty(env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    env.setenv("TP", "abc")
    assert cli.main(["plan"]) == EXIT_CONFIG
    captured = capsys.readouterr()
    assert captured.out == "" and _errors(captured.err) == ["error: TP='abc': must be a whole number"]


# --- warnings -------------------------------------------------------------------------------------


def test_a_misspelt_variable_an_env_file_slip_and_a_drift_typo_each_warn_once(
    env: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env.setenv("TPP", "2")
    # A dotted name is a Hydra key (ALLOW_DRIFT takes those too), never a misspelt field however close.
    env.setenv("ALLOW_DRIFT", "TRAIN_FILE,TP,FRAMEWORKS,actor_rollout_ref.actor.optim.lr,RECIPE.v2")
    (tmp_path / ".env").write_text("EP = 8\n")
    assert cli.main(["plan"]) == 0
    assert _warnings(capsys.readouterr().err) == [
        "warning: TPP is not a setting (ignored); did you mean TP?",
        "warning: .env:1: EP: Compose reads EP=8, bash runs `EP` as a command and leaves EP unset (blanks around `=`): write EP=8",
        "warning: ALLOW_DRIFT names TRAIN_FILE, which is no field a record compares; did you mean TRAIN_FILES?",
    ]


def test_a_warning_cannot_forge_a_line_on_stderr(env: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The .env path is printed in the warning; here the working directory's name holds a newline.
    odd = tmp_path / "a\nerror: forged"
    odd.mkdir()
    env.chdir(odd)
    (odd / ".env").write_text("EP = 8\n")
    assert cli.main(["plan"]) == 0
    err = capsys.readouterr().err
    assert _errors(err) == [] and len(_warnings(err)) == 1


def test_warnings_come_before_a_command_that_needs_no_plan(env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    env.setenv("NNODE", "2")
    handler = Recorder()
    monkeypatch.setattr(cli, "run_prepare_data", handler)
    assert cli.main(["prepare-data", "gsm8k"]) == 0
    assert _warnings(capsys.readouterr().err) == ["warning: NNODE is not a setting (ignored); did you mean NNODES?"]


# --- dispatch -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("argv", "progress"), [(["run"], None), (["run", "--progress"], True), (["run", "--no-progress"], False)])
def test_run_gets_the_checked_plan_and_the_progress_choice(
    env: pytest.MonkeyPatch, monkeypatch: pytest.MonkeyPatch, argv: list[str], progress: bool | None
) -> None:
    handler = Recorder(code=7)
    monkeypatch.setattr(cli, "run_command", handler)
    assert cli.main(argv) == 7  # the trainer's own exit code
    [(plan, kwargs)] = handler.calls
    assert kwargs == {"progress": progress}
    assert plan.device.name == "gpu" and plan.argv[1:3] == ["-m", "recipe.trainer_main"]


def test_prepare_data_writes_under_data_dir_without_a_layout(env: pytest.MonkeyPatch, monkeypatch: pytest.MonkeyPatch) -> None:
    env.setenv("DATA_DIR", "/srv/data")
    env.setenv("MODEL_PATH", "/srv/model")  # whose processor counts the prompts' tokens
    env.setenv("TP", "3")  # a layout that `plan` refuses: preparing data needs none
    handler = Recorder()
    monkeypatch.setattr(cli, "run_prepare_data", handler)
    assert cli.main(["prepare-data", "gsm8k"]) == 0
    [(args, data_dir, model_dir, _)] = handler.calls
    assert (args.dataset, data_dir, model_dir) == ("gsm8k", Path("/srv/data"), Path("/srv/model"))


def test_export_gets_the_experiments_checkpoints_the_model_and_the_strictness(
    env: pytest.MonkeyPatch, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name, value in {"CHECKPOINT_DIR": "/ck", "PROJECT_NAME": "p", "EXPERIMENT_NAME": "e", "MODEL_PATH": "/m",
                        "EXPORT_STRICT": "true"}.items():  # fmt: skip
        env.setenv(name, value)
    handler = Recorder(code=1)
    monkeypatch.setattr(cli, "run_export", handler)
    assert cli.main(["export", "--out", str(tmp_path / "out")]) == 1
    [(args, checkpoints, model, strict, _)] = handler.calls
    assert (args.out, checkpoints, model, strict) == (tmp_path / "out", Path("/ck/p/e"), Path("/m"), True)


@pytest.mark.parametrize(
    ("argv", "handler_name"),
    [(["doctor"], "run_doctor"), (["replay", "record.json"], "run_replay"), (["verify-export", "dir"], "run_verify_export")],
)
def test_commands_that_read_no_settings_run_even_with_bad_ones(
    env: pytest.MonkeyPatch, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str], handler_name: str
) -> None:
    env.setenv("TP", "abc")
    env.setenv("TPP", "1")
    handler = Recorder(code=5)
    monkeypatch.setattr(cli, handler_name, handler)
    assert cli.main(argv) == 5
    [(args, _)] = handler.calls
    assert args.command == argv[0]
    assert capsys.readouterr().err == ""  # the settings were not even read


def test_a_cluster_that_did_not_form_exits_3_with_one_line_per_problem(
    env: pytest.MonkeyPatch, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "run_command", Recorder(raises=ClusterError(["node 1 did not join", "node 2\x1b[2J did not join"])))
    assert cli.main(["run"]) == 3
    assert _errors(capsys.readouterr().err) == ["error: node 1 did not join", "error: node 2\\x1b[2J did not join"]


def test_a_machine_that_does_not_fit_exits_2_with_a_json_document(
    env: pytest.MonkeyPatch, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "run_command", Recorder(raises=RecipeConfigError(["DEVICE=gpu: no gpu device found"])))
    assert cli.main(["run"]) == EXIT_CONFIG
    captured = capsys.readouterr()
    # `run` has no --json: its errors are lines only.
    assert captured.out == "" and _errors(captured.err) == ["error: DEVICE=gpu: no gpu device found"]


# --- the command line itself -----------------------------------------------------------------------


@pytest.mark.parametrize("command", ["plan", "run"])
def test_an_override_before_the_double_dash_gets_the_spelling_that_works(
    env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    assert cli.main([command, "trainer.total_training_steps=5", "+my.note=two words"]) == EXIT_CONFIG
    captured = capsys.readouterr()
    assert captured.out == ""
    shown = "trainer.total_training_steps=5 '+my.note=two words'"
    assert captured.err.splitlines() == [f"error: {shown}: Hydra overrides go after `--`, e.g. entrypoint.py {command} -- {shown}"]


def test_an_override_before_the_double_dash_with_json_is_a_document(env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plan", "--json", "x=1"]) == EXIT_CONFIG
    document = json.loads(capsys.readouterr().out)
    assert document["command"] == "plan" and document["errors"] == ["x=1: Hydra overrides go after `--`, e.g. entrypoint.py plan -- x=1"]


def test_an_override_among_unknown_words_still_gets_the_hint(env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plan", "--bogus", "x=1"]) == EXIT_CONFIG
    assert capsys.readouterr().err.splitlines() == ["error: x=1: Hydra overrides go after `--`, e.g. entrypoint.py plan -- x=1"]


@pytest.mark.parametrize(
    ("argv", "unknown"),
    [(["plan", "--bogus"], "--bogus"), (["plan", "-x=1"], "-x=1"), (["doctor", "x=1"], "x=1"), (["plan", "--a", "--b"], "--a --b")],
)
def test_an_unknown_argument_is_argparses_error_after_the_usage(
    env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str], unknown: str
) -> None:
    """Only `plan` and `run` take overrides; an option-like word is never taken for one."""
    assert cli.main(argv) == EXIT_CONFIG
    assert capsys.readouterr().err.splitlines() == [
        "usage: entrypoint.py [-h] [--version] COMMAND ...", f"error: unrecognized arguments: {unknown}"
    ]


@pytest.mark.parametrize(
    ("argv", "usage"),
    [(["plan", "--json=yes"], "usage: entrypoint.py plan [--json] [-- key=value ...]"),
     (["run", "--progress=yes"], "usage: entrypoint.py run [--progress | --no-progress] [-- key=value ...]")],
)  # fmt: skip
def test_a_bad_option_of_a_command_shows_that_commands_usage(
    env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str], usage: str
) -> None:
    assert _exit_code(argv) == EXIT_CONFIG
    shown, error = capsys.readouterr().err.splitlines()
    assert shown == usage and error.startswith(f"error: argument {argv[1].split('=')[0]}")


@pytest.mark.parametrize(
    ("argv", "command"),
    [(["--json"], "entrypoint.py"), ([], "entrypoint.py"), (["plan", "--json", "--nope=1"], "plan"), (["doctor", "--json", "--timeout", "soon"], "doctor"),
     (["prepare-data", "--json", "mnist"], "prepare-data")],
)  # fmt: skip
def test_a_usage_error_exits_2_naming_the_command(
    env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str], command: str
) -> None:
    assert _exit_code(argv) == EXIT_CONFIG
    captured = capsys.readouterr()
    assert captured.err.startswith("usage: entrypoint.py") and len(_errors(captured.err)) == 1
    if "--json" in argv:
        document = json.loads(captured.out)
        assert (document["command"], document["exit_code"], document["status"]) == (command, 2, "error")
        assert [f"error: {line}" for line in document["errors"]] == _errors(captured.err)
    else:
        assert captured.out == ""


def test_a_usage_error_without_json_prints_no_document_even_after_one_with_json(
    env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        cli.main(["doctor", "--json", "--timeout", "soon"])
    capsys.readouterr()
    with pytest.raises(SystemExit) as left:
        cli.main(["doctor", "--timeout", "soon"])
    assert left.value.code == EXIT_CONFIG and capsys.readouterr().out == ""


def test_version_names_the_recipe(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as left:
        cli.main(["--version"])
    assert left.value.code == 0 and capsys.readouterr().out == f"grpo-recipe {__version__}\n"


def test_without_arguments_main_reads_the_process_command_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cli.sys, "argv", ["entrypoint.py", "--version"])
    with pytest.raises(SystemExit) as left:
        cli.main()
    assert left.value.code == 0 and capsys.readouterr().out == f"grpo-recipe {__version__}\n"


def test_the_programs_start_exits_with_mains_status(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """entrypoint.py, `python -m recipe` and the `grpo-recipe` script: the process ends with main's status (here a
    normal exit: no Ray core in this process, or os._exit would end pytest too)."""
    from recipe import process_exit

    monkeypatch.setattr(process_exit, "ray_core_loaded", lambda: False)
    monkeypatch.setattr(cli.sys, "argv", ["entrypoint.py", "--version"])
    with pytest.raises(SystemExit) as left:
        cli.console_main()
    assert left.value.code == 0 and capsys.readouterr() == (f"grpo-recipe {__version__}\n", "")


def test_the_parser_is_the_entrypoints(capsys: pytest.CaptureFixture[str]) -> None:
    parser = cli._parser()
    assert parser.prog == "entrypoint.py"
    assert parser.parse_args(["plan"]) == argparse.Namespace(command="plan", json=False)
    assert parser.parse_args(["run"]).progress is None


def test_the_recipes_log_lines_go_to_stderr_with_their_level(
    env: pytest.MonkeyPatch, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest
) -> None:
    # pytest's own log capture sits on the root logger; without it, main's basicConfig applies as in the entrypoint.
    monkeypatch.setattr(logging.root, "handlers", [])
    level = logging.root.level
    request.addfinalizer(lambda: logging.root.setLevel(level))
    logging.root.setLevel(logging.WARNING)  # setLevel, not the attribute: loggers cache what they let through

    def trainer(plan: object, progress: bool | None) -> int:
        logging.getLogger("recipe.run").info("starting the trainer")
        logging.getLogger("recipe.run").debug("not shown")
        return 0

    monkeypatch.setattr(cli, "run_command", trainer)
    assert cli.main(["run"]) == 0
    captured = capsys.readouterr()
    assert captured.err.splitlines() == ["INFO recipe.run: starting the trainer"] and captured.out == ""


# --- a closed stdout, a missing package -------------------------------------------------------------


@pytest.mark.parametrize(("command", "code", "line"), [("plan", 0, None), ("run", 128 + signal.SIGPIPE, "error: stdout was closed before the trainer started")])
def test_a_reader_that_left_ends_plan_quietly_and_run_as_a_shell_would(
    env: pytest.MonkeyPatch, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: str, code: int, line: str | None
) -> None:
    redirected: list[tuple[str, int]] = []
    monkeypatch.setattr(cli.os, "open", lambda path, flags: redirected.append((path, flags)) or 99)
    monkeypatch.setattr(cli.os, "dup2", lambda fd, fd2: redirected.append((fd, fd2)))
    monkeypatch.setattr(cli.sys.stdout, "fileno", lambda: 1, raising=False)
    monkeypatch.setattr(cli, "_cmd_plan" if command == "plan" else "run_command", Recorder(raises=BrokenPipeError()))
    assert cli.main([command]) == code
    # stdout now points at /dev/null, so that the interpreter's last flush cannot fail again.
    assert redirected == [(cli.os.devnull, cli.os.O_WRONLY), (99, 1)]
    assert _errors(capsys.readouterr().err) == ([line] if line else [])


def test_a_command_whose_package_is_missing_names_it_and_exits_2(
    env: pytest.MonkeyPatch, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "run_command", Recorder(raises=ModuleNotFoundError("No module named 'ray'", name="ray")))
    assert cli.main(["run"]) == EXIT_CONFIG
    assert _errors(capsys.readouterr().err) == [
        (
            "error: run needs the Python package providing 'ray', which is not installed: "
            "use the image (docker compose run --rm gpu|npu ...) or pip install '.[trainer]'"
        )
    ]
