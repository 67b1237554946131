"""The README tells the truth: its examples are run, its set-up is CI's, its claims match the project.

It is a front door (issue 43): at most 250 lines, a heading for each thing users come for, and the
long contracts on docs/ pages it links, whose `$ ... entrypoint.py` examples are run here too.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import tomllib

import pytest

from .envtools import ENTRYPOINT, HANG_GUARD_S, REPO, entrypoint_env

README = (REPO / "README.md").read_text(encoding="utf-8")
#: The README and the docs pages its long contracts moved to: every `$ ... entrypoint.py` example in them is run.
PAGES = {"README.md": README} | {
    f"docs/{path.name}": path.read_text(encoding="utf-8") for path in sorted((REPO / "docs").glob("*.md"))
}
CI_RUN = (REPO / ".ci" / "run").read_text(encoding="utf-8")


def _blocks(language: str, text: str = README) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.DOTALL)


def _set_up_block() -> str:
    """The test set-up: the bash block of "## Set up" that installs (the one before it is plan or smoke)."""
    section = README.split("## Set up", 1)[1].split("\n## ", 1)[0]
    return next(block for block in _blocks("bash", section) if "pip install" in block)


def _examples() -> list[tuple[str, list[str]]]:
    """(command line, the lines README shows it printing) of every complete `$ ... entrypoint.py` example.

    An example with `...` in its output is abridged (its text says so) and is not compared.
    """
    found = []
    for block in (block for text in PAGES.values() for block in _blocks("text", text)):
        lines = block.strip("\n").splitlines()
        if lines and lines[0].startswith("$ ") and "entrypoint.py" in lines[0] and not any("..." in l for l in lines):
            found.append((lines[0][2:], lines[1:]))
    return found


EXAMPLES = _examples()


def test_there_are_examples_to_check() -> None:
    assert EXAMPLES, "no complete `$ ... python entrypoint.py` example found in README.md or docs/*.md"


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


def test_tests_page_names_every_testpath() -> None:
    testpaths = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["testpaths"]
    section = PAGES["docs/testing.md"].split("## What `pytest` runs", 1)[1]
    assert all(f"`{path}`" in section for path in testpaths), testpaths
    assert "(docs/testing.md)" in README


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


# --- the front door (issue 43) ---------------------------------------------------------------------------------

MAX_LINES = 250
#: What users come for, each under its own heading.
HEADINGS = ["## Set up", "## Ways to start", "## Settings", "## A first run on one node", "## Several nodes",
            "## Kubernetes", "## Watching training", "## Resume after a crash", "## When something fails"]  # fmt: skip
#: The long contracts, each on a docs page the README links.
CONTRACT_PAGES = ["docs/overrides.md", "docs/doctor.md", "docs/mutation.md", "docs/layout.md", "docs/settings.md",
                  "docs/reproducibility.md", "docs/testing.md", "docs/troubleshooting.md"]  # fmt: skip


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but `-` and `_` dropped, spaces to `-`."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(text: str) -> set[str]:
    return {_slug(line.lstrip("#")) for line in text.splitlines() if re.match(r"#{1,6} ", line)}


def test_the_readme_is_a_front_door_of_at_most_250_lines() -> None:
    assert len(README.splitlines()) <= MAX_LINES, f"README.md has {len(README.splitlines())} lines; move detail to docs/"


def test_the_readme_has_a_heading_for_each_thing_users_come_for() -> None:
    lines = README.splitlines()
    assert [h for h in HEADINGS if h not in lines] == []
    assert README.index("**Status.**") < README.index("## Set up"), "the status line comes before the set-up"


def test_the_readme_links_each_long_contract() -> None:
    assert [page for page in CONTRACT_PAGES if f"]({page})" not in README] == []


def test_every_link_of_the_readme_and_the_docs_resolves() -> None:
    """Each relative link (README -> docs/, docs -> docs) names a file that exists, and an anchor that is a heading."""
    broken = []
    for name, text in PAGES.items():
        folder = (REPO / name).parent
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            file = (folder / path).resolve() if path else REPO / name
            if not file.exists():
                broken.append(f"{name}: {target} (no such file)")
            elif anchor and anchor not in _anchors(file.read_text(encoding="utf-8")):
                broken.append(f"{name}: {target} (no such heading)")
    assert broken == []
