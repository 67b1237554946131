"""The README tells the truth: its examples are run, its set-up is CI's, its claims match the project."""

from __future__ import annotations

import re
import shlex
import subprocess
import tomllib

import pytest

from .envtools import ENTRYPOINT, HANG_GUARD_S, REPO, entrypoint_env

README = (REPO / "README.md").read_text(encoding="utf-8")
CI_RUN = (REPO / ".ci" / "run").read_text(encoding="utf-8")


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.DOTALL)


def _set_up_block() -> str:
    section = README.split("## Set up", 1)[1]
    return re.search(r"```bash\n(.*?)```", section, flags=re.DOTALL).group(1)  # type: ignore[union-attr]


def _examples() -> list[tuple[str, list[str]]]:
    """(command line, the lines README shows it printing) of every complete `$ ... entrypoint.py` example.

    An example with `...` in its output is abridged (its text says so) and is not compared.
    """
    found = []
    for block in _blocks("text"):
        lines = block.strip("\n").splitlines()
        if lines and lines[0].startswith("$ ") and "entrypoint.py" in lines[0] and not any("..." in l for l in lines):
            found.append((lines[0][2:], lines[1:]))
    return found


EXAMPLES = _examples()


def test_there_are_examples_to_check() -> None:
    assert EXAMPLES, "no complete `$ ... python entrypoint.py` example found in README.md"


@pytest.mark.parametrize(("command", "shown"), EXAMPLES, ids=[c for c, _ in EXAMPLES])
def test_readme_example_prints_what_it_shows(command: str, shown: list[str]) -> None:
    words = shlex.split(command)
    settings = dict(word.split("=", 1) for word in words if re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", word))
    argv = words[len(settings) :]
    assert argv[:2] == ["python", "entrypoint.py"], command
    done = subprocess.run(
        [*ENTRYPOINT, *argv[2:]], env=entrypoint_env(**settings), capture_output=True, text=True, timeout=HANG_GUARD_S,
        cwd=REPO, check=False,
    )
    assert (done.stdout + done.stderr).splitlines() == shown


def test_set_up_installs_torch_from_pytorchs_cpu_index_as_ci_does() -> None:
    block = _set_up_block()
    torch_line = next(line for line in block.splitlines() if "torch==" in line)
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in torch_line
    assert "-e " not in torch_line, "torch alone first: the CPU index must not be asked for every package"
    for line in block.splitlines():
        command = line.strip().removesuffix("&& pytest").strip()
        if command.startswith(("pip install", "bash .ci/")):
            assert command.replace("pip install", "python -m pip install --quiet", 1) in CI_RUN or command in CI_RUN, (
                f"README's set-up line is not in .ci/run: {command}"
            )


def test_tests_section_names_every_testpath() -> None:
    testpaths = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["testpaths"]
    section = README.split("## Tests", 1)[1]
    assert all(f"`{path}`" in section for path in testpaths), testpaths


def test_every_ci_set_up_pin_of_torch_is_the_readmes() -> None:
    pins = set(re.findall(r"torch==([\w.+]+)", CI_RUN)) | set(re.findall(r"torch==([\w.+]+)", _set_up_block()))
    assert len(pins) == 1, pins


def test_dot_env_is_read_by_compose_only_as_the_readme_says(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert "Only Docker Compose reads `.env`." in README
    # A .env beside the command with a value plan would refuse: plan does not read it.
    (tmp_path / ".env").write_text("TP=3\n")
    done = subprocess.run(
        [*ENTRYPOINT, "plan", "--json"], env=entrypoint_env(), cwd=tmp_path, capture_output=True, text=True,
        timeout=HANG_GUARD_S, check=False,
    )
    assert done.returncode == 0, done.stderr
