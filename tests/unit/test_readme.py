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


def _set_up_commands() -> list[str]:
    """The command lines of the first bash block of "## Set up": the two commands a newcomer needs."""
    section = README.split("## Set up", 1)[1].split("\n## ", 1)[0]
    block = _blocks("bash", section)[0]
    return [line.split("  #", 1)[0].strip() for line in block.splitlines() if line.strip()]


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


SET_UP_SCRIPT = (REPO / "tests" / "setup.sh").read_text(encoding="utf-8")


def test_the_set_up_is_two_commands_the_main_job_and_the_tests_which_ci_runs() -> None:
    first, second = _set_up_commands()
    assert first.startswith("docker compose run --rm -e PROFILE=smoke "), first
    assert second == "bash tests/setup.sh"
    ci_lines = [line.strip() for line in CI_RUN.splitlines() if not line.lstrip().startswith("#")]
    assert any(re.fullmatch(r"(?:[A-Z_]+=\S+ )*(?:in_session )?bash tests/setup\.sh", line) for line in ci_lines), (
        ".ci/run does not run the README's test command as it is"
    )


def test_the_set_up_takes_torch_from_pytorchs_cpu_index_at_the_e2e_venvs_pin() -> None:
    assert 'TORCH_INDEX_URL="${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"' in SET_UP_SCRIPT
    version = re.search(r"^TORCH_VERSION=([\w.]+)$", SET_UP_SCRIPT, flags=re.MULTILINE)
    assert version, "tests/setup.sh names no TORCH_VERSION"
    e2e = (REPO / ".ci" / "install-e2e.sh").read_text(encoding="utf-8")
    assert set(re.findall(r"torch==([\w.]+)\+cpu", e2e)) == {version[1]}
    assert "torch==" not in CI_RUN, ".ci/run installs torch itself instead of through tests/setup.sh"


def test_tests_page_names_every_testpath() -> None:
    testpaths = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["testpaths"]
    section = PAGES["docs/testing.md"].split("## What `pytest` runs", 1)[1]
    assert all(f"`{path}`" in section for path in testpaths), testpaths
    assert "(docs/testing.md)" in README


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
#: The seven everyday questions a new user came with (issue 54), each answered under its own heading.
EVERYDAY_TASKS = {
    "a first run": "## A first run on one node",
    "several nodes on Kubernetes": "## Kubernetes",
    "training curves": "## Watching training",
    "resume after a crash": "## Resume after a crash",
    "throughput": "## Throughput and memory",
    "a verl override on `docker compose up`": "## verl overrides",
    "checking an image or a node": "## Checking an image or a node",
}
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


def test_each_everyday_task_has_a_heading_linked_from_the_top() -> None:
    """Issue 54: each of the seven everyday tasks is one click from the README's top (before the set-up), to a
    heading of its own that says what it answers."""
    top = README.split("## Set up", 1)[0]
    lines = README.splitlines()
    for task, heading in EVERYDAY_TASKS.items():
        assert heading in lines, heading
        assert f"[{task}](#{_slug(heading.lstrip('#'))})" in top, task
    section = README.split("## verl overrides", 1)[1].split("\n## ", 1)[0]
    assert "docker compose up" in section and "OVERRIDES=" in section


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
