"""CI's rules for skips (tests/support): a broken install fails with its error, and under CI=true a skip fails."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.needs import installed, needs

from .envtools import REPO


@pytest.fixture
def packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An importable folder with a package whose import is broken (it needs a module nobody has)."""
    root = tmp_path / "site"
    (root / "brokenpkg").mkdir(parents=True)
    (root / "brokenpkg" / "__init__.py").write_text("import a_dependency_nobody_installed_xyz\n")
    monkeypatch.syspath_prepend(str(root))
    return root


def test_a_package_that_is_not_installed_skips_with_the_install_step() -> None:
    with pytest.raises(pytest.skip.Exception, match=r"not_installed_xyz is not installed: pip install it"):
        needs("not_installed_xyz", install="pip install it")
    assert not installed("not_installed_xyz.sub") and not installed("not_installed_xyz")


def test_a_broken_package_is_an_error_with_its_own_message(packages: Path) -> None:
    """What importorskip turned into a green skip: here it is the import's own error."""
    assert installed("brokenpkg")
    with pytest.raises(ModuleNotFoundError, match="a_dependency_nobody_installed_xyz"):
        needs("brokenpkg", install="pip install brokenpkg")
    with pytest.raises(ModuleNotFoundError, match="a_dependency_nobody_installed_xyz"):
        installed("brokenpkg.sub")  # its parent fails to import: not "absent"


SAMPLE = {
    "conftest.py": "from tests.support.skip_policy import pytest_make_collect_report, pytest_runtest_makereport\n",
    "pytest.ini": "[pytest]\nmarkers =\n    ci_may_skip: see tests/support/skip_policy.py\n",
    "test_sample.py": textwrap.dedent(
        """
        import pytest

        def test_passes():
            pass

        def test_skips():
            pytest.skip("numpy is not installed: pip install -e '.[trainer]'")

        @pytest.mark.ci_may_skip("needs an engine")
        def test_may_skip():
            pytest.skip("no engine")

        @pytest.mark.ci_may_skip("needs an engine", unless_env="SAMPLE_ENGINE")
        def test_may_skip_unless_engine():
            pytest.skip("no engine")

        @pytest.mark.xfail(reason="known")
        def test_xfails():
            assert False
        """
    ),
    "test_module_skip.py": "import pytest\npytest.skip('verl is not installed', allow_module_level=True)\n",
}


def _run_sample(tmp_path: Path, **env: str) -> dict[str, str]:
    for name, text in SAMPLE.items():
        (tmp_path / name).write_text(text)
    environ = {k: v for k, v in os.environ.items() if k not in ("CI", "SAMPLE_ENGINE", "PYTEST_ADDOPTS")}
    environ |= {"PYTHONPATH": str(REPO), **env}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "-rE", "--continue-on-collection-errors", "."],
        cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=300, check=False,
    )
    outcomes: dict[str, str] = {}
    for line in done.stdout.splitlines():
        found = re.match(r"^(?:\S+::(\w+) (PASSED|FAILED|SKIPPED|XFAIL|ERROR)|(ERROR) (\S+\.py))", line)
        if found and found.group(1):
            outcomes[found.group(1)] = found.group(2)
        elif found:
            outcomes[found.group(4)] = found.group(3)
    return outcomes | {"exit": str(done.returncode), "output": done.stdout}


def test_without_ci_a_skip_stays_a_skip(tmp_path: Path) -> None:
    got = _run_sample(tmp_path)
    assert got["exit"] == "0", got["output"]
    assert got["test_skips"] == "SKIPPED" and got["test_may_skip"] == "SKIPPED" and got["test_xfails"] == "XFAIL"


def test_under_ci_a_skip_fails_unless_the_test_may_skip(tmp_path: Path) -> None:
    got = _run_sample(tmp_path, CI="true")
    assert got["exit"] != "0", got["output"]
    assert got["test_passes"] == "PASSED"
    assert got["test_skips"] == "FAILED"
    assert "skipped under CI=true, where a skip is a failure" in got["output"]
    assert "numpy is not installed" in got["output"]  # the reason is quoted
    assert got["test_may_skip"] == "SKIPPED" and got["test_may_skip_unless_engine"] == "SKIPPED"
    assert got["test_xfails"] == "XFAIL"
    assert got.get("test_module_skip.py") == "ERROR", got["output"]  # a whole module skipped at collection


def test_under_ci_an_allowed_skip_fails_once_its_condition_is_there(tmp_path: Path) -> None:
    got = _run_sample(tmp_path, CI="true", SAMPLE_ENGINE="unix:///run/docker.sock")
    assert got["test_may_skip_unless_engine"] == "FAILED" and got["test_may_skip"] == "SKIPPED"


def test_a_broken_verl_import_fails_with_its_real_error(tmp_path: Path) -> None:
    """The review's case: a broken tensordict inside verl once skipped the composition against verl."""
    needs("verl", install="pip install -e '.[trainer]'")
    fake = tmp_path / "fake"
    (fake / "tensordict").mkdir(parents=True)
    (fake / "tensordict" / "__init__.py").write_text("raise ImportError('this tensordict is broken on purpose')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS")}
    env["PYTHONPATH"] = os.pathsep.join([str(fake), str(REPO)])
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", "tests/unit/test_verl_compose.py"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode != 0, done.stdout[-3000:]
    assert "this tensordict is broken on purpose" in done.stdout
    assert "SKIPPED" not in done.stdout and " skipped" not in done.stdout.splitlines()[-1]
