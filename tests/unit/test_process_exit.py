"""A process that loaded Ray's core ends with its own exit status, even when the interpreter's teardown would crash.

The crash itself (Ray's native threads against C++ static destructors) comes when it likes; the
tests stand it in with an atexit handler that sends the process SIGSEGV, which is where
Ray's crash strikes: after the program's work, during the interpreter's teardown. Without
the stand-in's oracle run (exit -11), a test of the fix could not fail.
"""

from __future__ import annotations

import io
import signal
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from recipe import process_exit
from tests.support.process_end import is_pytest_the_program

REPO = Path(__file__).resolve().parents[2]

#: Loads Ray's core, then arms the stand-in crash for the interpreter's teardown.
CRASH_AT_TEARDOWN = (
    "import atexit, os, signal, sys; import ray._raylet; "
    "atexit.register(lambda: os.kill(os.getpid(), signal.SIGSEGV)); "
)


def run_python(code: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """CODE in a fresh interpreter that imports the recipe from this checkout."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(cwd)}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_the_stand_in_crash_does_crash_a_normal_exit() -> None:
    """The oracle: with a plain sys.exit the stand-in crash replaces the exit status."""
    done = run_python(CRASH_AT_TEARDOWN + "sys.exit(0)")
    assert done.returncode == -signal.SIGSEGV


@pytest.mark.parametrize("code", [0, 1, 2, 130])
def test_with_ray_loaded_the_exit_status_is_the_programs(code: int) -> None:
    done = run_python(CRASH_AT_TEARDOWN + f"from recipe.process_exit import exit_process; exit_process({code})")
    assert done.returncode == code


def test_what_was_written_before_the_exit_reaches_the_reader() -> None:
    """os._exit drops unflushed buffers: stdout without a newline, a pipe's block buffer, logging's handlers."""
    done = run_python(
        CRASH_AT_TEARDOWN
        + "import logging; logging.basicConfig(stream=sys.stderr, format='%(message)s'); "
        + "print('partial line', end=''); logging.getLogger('x').warning('logged'); "
        + "from recipe.process_exit import exit_process; exit_process(3)"
    )
    assert (done.returncode, done.stdout, done.stderr) == (3, "partial line", "logged\n")


def test_without_ray_the_interpreter_ends_normally(monkeypatch: pytest.MonkeyPatch) -> None:
    """atexit handlers and finalizers still run where Ray's core never loaded."""
    monkeypatch.delitem(sys.modules, process_exit.RAY_CORE_MODULE, raising=False)
    monkeypatch.setattr(process_exit.os, "_exit", lambda code: pytest.fail(f"os._exit({code}) without Ray"))
    with pytest.raises(SystemExit) as ended:
        process_exit.exit_process(5)
    assert ended.value.code == 5


def test_with_ray_loaded_outputs_are_flushed_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """logging's handlers, stdout, stderr, then os._exit (logging.shutdown stood in: in this process it would close
    the handlers of pytest and of every earlier test; the subprocess test above runs the real one)."""
    events: list[str] = []

    class Recording(io.StringIO):
        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

        def flush(self) -> None:
            events.append(f"flush {self.name}")

    class Exited(Exception):
        pass

    def fake_exit(code: int) -> None:
        events.append(f"_exit {code}")
        raise Exited

    monkeypatch.setitem(sys.modules, process_exit.RAY_CORE_MODULE, object())
    monkeypatch.setattr(process_exit.logging, "shutdown", lambda: events.append("logging.shutdown"))
    monkeypatch.setattr(sys, "stdout", Recording("stdout"))
    monkeypatch.setattr(sys, "stderr", Recording("stderr"))
    monkeypatch.setattr(process_exit.os, "_exit", fake_exit)
    with pytest.raises(Exited):
        process_exit.exit_process(7)
    assert events == ["logging.shutdown", "flush stdout", "flush stderr", "_exit 7"]


def test_a_closed_stdout_does_not_stop_the_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader that left (`plan | head`) or a closed stream: the exit status still comes out."""
    closed = io.StringIO()
    closed.close()
    codes: list[int] = []
    monkeypatch.setitem(sys.modules, process_exit.RAY_CORE_MODULE, object())
    monkeypatch.setattr(process_exit.logging, "shutdown", lambda: None)
    monkeypatch.setattr(sys, "stdout", closed)
    monkeypatch.setattr(process_exit.os, "_exit", codes.append)
    process_exit.exit_process(4)
    assert codes == [4]


def console_script_target() -> str:
    """pyproject's `grpo-recipe` script, as `module:function`."""
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]["grpo-recipe"]


ENTRY_POINTS = {
    "python -m recipe": "import runpy; sys.argv = ['recipe', {arg!r}]; runpy.run_module('recipe', run_name='__main__')",
    "entrypoint.py": (
        "import runpy; sys.argv = ['entrypoint.py', {arg!r}]; "
        f"runpy.run_path({str(REPO / 'entrypoint.py')!r}, run_name='__main__')"
    ),
    "grpo-recipe": (
        "import importlib; sys.argv = ['grpo-recipe', {arg!r}]; "
        "module, _, name = {target!r}.partition(':'); sys.exit(getattr(importlib.import_module(module), name)())"
    ),
}


@pytest.mark.parametrize(("arg", "status"), [("--version", 0), ("no-such-command", 2)])
@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_every_entry_point_keeps_its_exit_status_past_a_teardown_crash(entry: str, arg: str, status: int) -> None:
    """Each way the recipe starts (the image runs entrypoint.py) ends through exit_process, argparse's exits too."""
    done = run_python(CRASH_AT_TEARDOWN + ENTRY_POINTS[entry].format(arg=arg, target=console_script_target()))
    assert done.returncode == status, done.stderr
    assert ("grpo-recipe" in done.stdout) if arg == "--version" else ("no-such-command" in done.stderr)


@pytest.mark.parametrize(("code", "status", "printed"), [(None, 0, ""), (0, 0, ""), (3, 3, ""), ("bye", 1, "bye\n")])
def test_exit_status_reads_system_exit_as_the_interpreter_does(code: object, status: int, printed: str,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert process_exit.exit_status(code) == status
    assert capsys.readouterr().err == printed


def ended_with(monkeypatch: pytest.MonkeyPatch, main: object) -> int:
    """The status run_program(MAIN) hands to exit_process."""
    codes: list[int] = []
    monkeypatch.setattr(process_exit, "exit_process", codes.append)
    process_exit.run_program(main)  # type: ignore[arg-type]
    assert len(codes) == 1
    return codes[0]


def test_run_program_ends_with_what_main_returns(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ended_with(monkeypatch, lambda: 6) == 6


def test_run_program_ends_with_a_system_exits_status(monkeypatch: pytest.MonkeyPatch) -> None:
    def main() -> int:
        raise SystemExit(2)

    assert ended_with(monkeypatch, main) == 2


def test_run_program_prints_an_uncaught_exception_and_ends_with_1(monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    def main() -> int:
        raise RuntimeError("the trainer broke")

    assert ended_with(monkeypatch, main) == 1
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):")
    assert err.rstrip().endswith("RuntimeError: the trainer broke")


@pytest.mark.parametrize(
    ("argv0", "owns"),
    [
        ("/venv/bin/pytest", True),
        ("pytest", True),
        ("/venv/bin/py.test", True),
        ("/venv/lib/python3.11/site-packages/pytest/__main__.py", True),
        ("/venv/bin/mutmut", False),
        ("/venv/lib/python3.11/site-packages/mutmut/__main__.py", False),
        ("/venv/lib/python3.11/site-packages/pytest_runner/__main__.py", False),
        ("-c", False),
    ],
)
def test_pytest_ends_the_process_only_where_it_is_the_program(argv0: str, owns: bool) -> None:
    assert is_pytest_the_program(argv0) is owns


PASSING_AND_FAILING = """
import atexit, os, signal
import ray._raylet

atexit.register(lambda: os.kill(os.getpid(), signal.SIGSEGV))


def test_passes():
    pass


def test_fails_when_asked():
    assert not os.environ.get("FAIL")
"""


@pytest.mark.parametrize(("plugin", "fail", "status"), [(True, False, 0), (True, True, 1), (False, False, -signal.SIGSEGV)])
def test_a_pytest_run_that_loaded_ray_ends_with_its_sessions_status(tmp_path: Path, plugin: bool, fail: bool,
                                                                     status: int) -> None:
    """tests/support/process_end.py, in a pytest of its own: passed is 0, failed is 1 (without the hooks: the crash)."""
    (tmp_path / "test_ray_loaded.py").write_text(textwrap.dedent(PASSING_AND_FAILING))
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path)]
    argv += ["-p", "tests.support.process_end"] if plugin else []
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(tmp_path)}
    env |= {"FAIL": "1"} if fail else {}
    done = subprocess.run([*argv, "test_ray_loaded.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == status, done.stdout[-2000:]
    summary = "1 failed, 1 passed" if fail else "2 passed"
    assert summary in done.stdout  # the report was written before the end


def test_the_unit_suite_ends_through_these_hooks() -> None:
    """The real-Ray tests run in the unit suite's pytest process (the one CI's crash ended)."""
    from tests.support import process_end
    from tests.unit import conftest

    assert conftest.pytest_sessionstart is process_end.pytest_sessionstart
    assert conftest.pytest_unconfigure is process_end.pytest_unconfigure


#: A program that loaded Ray's core (and arms the teardown crash), says it is ready, then waits to be signalled.
WAITS_FOR_A_SIGNAL = CRASH_AT_TEARDOWN + textwrap.dedent(
    """
    import time
    from recipe.process_exit import run_program
    def main():
        try:
            print("ready", flush=True)
            time.sleep(600)
        finally:
            print("unwound", flush=True)  # MAIN's finally blocks run before the exit
        return 0
    run_program(main)
    """
)


@pytest.mark.parametrize(("sent", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["ctrl-c", "sigterm"])
def test_a_signal_ends_a_ray_process_with_the_shells_status_and_no_traceback(sent: int, status: int) -> None:
    """Ctrl-C is 130 and SIGTERM 143 (README's exit table), after MAIN unwound; no traceback, no teardown crash."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(REPO)}
    child = subprocess.Popen([sys.executable, "-c", WAITS_FOR_A_SIGNAL], cwd=REPO, env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        child.send_signal(sent)
        out, err = child.communicate(timeout=120)
    finally:
        child.kill()
    assert (child.returncode, out, err) == (status, "unwound\n", "")
