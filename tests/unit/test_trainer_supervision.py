"""How `run` starts and supervises the trainer's process, by direct calls (recipe.run.trainer): its command and
environment, the signals passed on, and its exit code becoming ours.

README (`run`): prints `Executing: ...` and runs the trainer; SIGTERM/SIGINT are passed on and the trainer's exit
code becomes ours (a trainer killed by signal N exits 128+N, as shells and Kubernetes expect). The children here
are `sh` one-liners, each started in a few milliseconds; test_run_command.py does the same through the CLI.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shlex
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from recipe.plan import Plan, build_plan
from recipe.run import trainer
from recipe.run.trainer import (
    TEST_TRAINER_VARIABLE,
    _run_trainer,
    _trainer_environment,
    execute,
)
from tests.unit.envtools import HANG_GUARD_S, settings_of
from tests.unit.runtools import PipedStdout

SH = "/bin/sh"


def _env(**extra: str) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **extra}


# --- the exit code ---------------------------------------------------------------------------


@pytest.mark.parametrize("code", [0, 1, 2, 7, 255])
def test_the_trainers_exit_code_is_ours(code: int) -> None:
    assert execute([SH, "-c", f"exit {code}"], _env()) == code


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGKILL, 137), (signal.SIGTERM, 143), (signal.SIGSEGV, 139)])
def test_a_trainer_killed_by_a_signal_exits_128_plus_its_number(sig: signal.Signals, code: int) -> None:
    """Python reports -N for a child killed by signal N; shells and Kubernetes read 128+N."""
    assert execute([SH, "-c", f"kill -{int(sig)} $$"], _env()) == code


def test_the_trainer_gets_exactly_the_environment_it_is_given(tmp_path: Path) -> None:
    out = tmp_path / "env"
    assert execute([SH, "-c", f'env > "{out}"'], _env(RECIPE_DEVICE="gpu")) == 0
    names = {line.split("=", 1)[0] for line in out.read_text().splitlines()}
    assert names - {"PWD", "OLDPWD", "SHLVL", "_"} == {"PATH", "RECIPE_DEVICE"}  # the shell adds its own, nothing else


def test_the_trainer_runs_in_its_own_session(tmp_path: Path) -> None:
    """A Ctrl-C at the terminal reaches `run` once, which passes it on: the trainer never gets it twice."""
    # Field 6 of /proc/PID/stat is the session id: a session's leader has its own pid there.
    script = 'set -- $(cat /proc/$$/stat); test "$6" = "$$"'
    assert execute([SH, "-c", script], _env()) == 0


# --- signals passed on -------------------------------------------------------------------------


@pytest.fixture
def own_handlers() -> Iterator[dict[int, object]]:
    """Known handlers for SIGTERM and SIGINT during the test, the real ones back afterwards."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    mine: dict[int, object] = {}
    for sig in before:
        def handler(signum: int, frame: object) -> None:  # never called: the trainer's run replaces it
            raise AssertionError(f"signal {signum} reached the test's own handler")

        signal.signal(sig, handler)
        mine[sig] = handler
    try:
        yield mine
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]


def _signal_once_passed_on(sig: int, mine: object, ready: Path, done: threading.Event) -> threading.Thread:
    """Send `sig` to this process once execute() handles it and the trainer has set its trap (no sleep decides)."""

    def send() -> None:
        while signal.getsignal(sig) is mine or not ready.exists():
            if done.wait(0.005):
                return  # execute() returned without ever handling it
        os.kill(os.getpid(), sig)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


#: A trainer that ends on SIGTERM (43) or SIGINT (44), or by itself after 30 s (0) when nothing reaches it.
TRAPPING = "trap 'kill $!; exit 43' TERM; trap 'kill $!; exit 44' INT; touch '{ready}'; sleep 30 & wait $!"


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 43), (signal.SIGINT, 44)])
def test_sigterm_and_sigint_reach_the_trainer_which_decides_how_to_end(
    tmp_path: Path, own_handlers: dict[int, object], sig: signal.Signals, code: int
) -> None:
    """`docker stop` (SIGTERM) or Ctrl-C (SIGINT) to `run`: the trainer gets it, and its exit code is ours."""
    ready, done = tmp_path / "ready", threading.Event()
    sender = _signal_once_passed_on(sig, own_handlers[sig], ready, done)
    try:
        assert execute([SH, "-c", TRAPPING.format(ready=ready)], _env()) == code
    finally:
        done.set()
        sender.join(HANG_GUARD_S)
    # Once the trainer is gone, `run`'s own handlers are back.
    assert signal.getsignal(signal.SIGTERM) is own_handlers[signal.SIGTERM]
    assert signal.getsignal(signal.SIGINT) is own_handlers[signal.SIGINT]


def test_the_handlers_are_restored_when_the_trainer_ends_by_itself(own_handlers: dict[int, object]) -> None:
    assert execute([SH, "-c", "exit 0"], _env()) == 0
    assert {sig: signal.getsignal(sig) for sig in own_handlers} == own_handlers


# --- the command announced, and the tests' stand-in ------------------------------------------------


def test_the_command_is_announced_then_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TEST_TRAINER_VARIABLE, raising=False)
    out = tmp_path / "ran"
    argv = [SH, "-c", f"echo \"$@\" > '{out}'; exit 5", "trainer", "data.seed=42", "a b"]
    assert _run_trainer(argv, _env()) == 5
    assert capsys.readouterr().out == "Executing: " + shlex.join(argv) + "\n"
    assert out.read_text() == "data.seed=42 a b\n"


def test_the_test_stand_in_runs_with_the_trainers_argv_appended(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    out = tmp_path / "argv"
    stand_in = shlex.join([SH, "-c", f"printf '%s\\n' \"$@\" > '{out}'; exit 3", "stand-in"])
    monkeypatch.setenv(TEST_TRAINER_VARIABLE, stand_in)
    argv = ["python3", "-m", "recipe.trainer_main", "data.seed=42"]
    with caplog.at_level(logging.WARNING, logger="recipe"):
        assert _run_trainer(argv, _env()) == 3
    # What is announced is the trainer's command; the stand-in gets it whole as its arguments.
    assert capsys.readouterr().out == "Executing: python3 -m recipe.trainer_main data.seed=42\n"
    assert out.read_text().splitlines() == argv
    assert caplog.messages == [f"{TEST_TRAINER_VARIABLE} is set: running {stand_in} instead of the trainer (tests only)"]


def test_the_command_reaches_the_log_before_the_trainer_writes_anything(monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainer writes to the same pipe: `Executing: ...` must not sit in our buffer behind its output."""
    monkeypatch.delenv(TEST_TRAINER_VARIABLE, raising=False)
    piped = PipedStdout()
    monkeypatch.setattr("sys.stdout", piped)
    seen: list[str] = []
    monkeypatch.setattr(trainer, "execute", lambda argv, env: seen.append(piped.unflushed) or 0)
    assert _run_trainer(["python3", "-m", "recipe.trainer_main"], _env()) == 0
    assert seen == [""] and piped.getvalue() == "Executing: python3 -m recipe.trainer_main\n"


def test_an_empty_stand_in_variable_runs_the_trainer_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TEST_TRAINER_VARIABLE, "")
    assert _run_trainer([SH, "-c", "exit 6"], _env()) == 6


def test_the_stand_in_variable_is_the_one_the_test_tools_set() -> None:
    assert TEST_TRAINER_VARIABLE == "RECIPE_TEST_TRAINER"


# --- the trainer's environment: ours, with the plan's changes ------------------------------------


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> Plan:
    from recipe.smoke import shipped_model_dir

    folder = tmp_path_factory.mktemp("plan")
    (folder / "model").mkdir()
    (folder / "model" / "config.json").write_bytes((shipped_model_dir() / "config.json").read_bytes())
    settings = settings_of(DEVICE="gpu", NDEVICES_PER_NODE="1", TP="1", PP="1", CP="1", EP="1", ETP="1", GEN_TP="1",
                           MODEL_PATH=str(folder / "model"), CHECKPOINT_DIR=str(folder / "ck"))  # fmt: skip
    return build_plan(settings, environ={})


def test_the_trainer_gets_our_environment_with_the_plans_values(plan: Plan, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # the plan switches it at run time
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "8")
    monkeypatch.setenv("MY_OWN_VARIABLE", "kept")
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    plan = dataclasses.replace(plan, env={"PYTORCH_CUDA_ALLOC_CONF": None, "CUDA_DEVICE_MAX_CONNECTIONS": "1",
                                          "NOT_SET_ANYWHERE": None, "RECIPE_DEVICE": "gpu"})  # fmt: skip
    env = _trainer_environment(plan)
    assert "PYTORCH_CUDA_ALLOC_CONF" not in env and "NOT_SET_ANYWHERE" not in env
    assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1" and env["RECIPE_DEVICE"] == "gpu"
    assert env["MY_OWN_VARIABLE"] == "kept"
    assert {k: v for k, v in env.items() if k not in plan.env} == {k: v for k, v in os.environ.items() if k not in plan.env}
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"  # ours is left as it was


def test_the_trainers_environment_is_a_copy(plan: Plan) -> None:
    env = _trainer_environment(plan)
    env["CHANGED_BY_THE_TEST"] = "1"
    assert "CHANGED_BY_THE_TEST" not in os.environ
    assert trainer._trainer_environment(plan) is not env
