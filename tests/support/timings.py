"""The pytest plugin that measures each test: one CSV row per test, for `.ci/run`'s report (scripts/ci_report.py).

Active when `GPTOSS_PATCH_TIMINGS` names a file (`.ci/run` gives each lane its own). A row covers a test's
whole protocol (set-up, call, tear-down: a shared server's start or a venv's build is paid in a set-up) and holds
its wall time, the CPU of this pytest process, and the CPU of the children it reaped in that time (a server,
a pip, a harness pytest: `RUSAGE_CHILDREN` counts a child once it has been waited for, and grandchildren once
their parent has reaped them). A server shared across tests is paid by the test whose tear-down stops it.
Rows are written as each test ends (flushed), so the file of a lane that is killed still says how far it got.
"""

from __future__ import annotations

import csv
import os
import resource
import time
from collections.abc import Generator
from pathlib import Path
from typing import IO, Any

import pytest

from tests.support.markers import MARKERS

ENV = "GPTOSS_PATCH_TIMINGS"
LANE_ENV = "GPTOSS_PATCH_LANE"  # the lane's name, written on every row (default: "main")
COLUMNS = ("lane", "test", "tier", "outcome", "started", "wall_s", "cpu_s", "children_cpu_s")  # started: epoch seconds
_FILE: dict[str, tuple[IO[str], Any]] = {}  # path -> (file, csv writer)
_OUTCOME = pytest.StashKey[str]()


def tier(item: pytest.Item) -> str:
    """The first download marker the test carries (server, harness, upstream), else "fast"."""
    present = {m.name for m in item.iter_markers()}
    return next((m for m in ("server", "harness", "upstream") if m in present and m in MARKERS), "fast")


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def _writer() -> Any:
    path = os.environ.get(ENV)
    if not path:
        return None
    if path not in _FILE:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fresh = not Path(path).exists() or Path(path).stat().st_size == 0
        handle = open(path, "a", newline="", encoding="utf-8")  # noqa: SIM115 - open for the session, closed at its end
        writer = csv.writer(handle)
        if fresh:
            writer.writerow(COLUMNS)
        _FILE[path] = (handle, writer)
    return _FILE[path][1]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    writer = _writer()
    if writer is None:
        yield
        return
    epoch, started = time.time(), time.monotonic()
    own, children = _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)
    yield
    wall = time.monotonic() - started
    row = (os.environ.get(LANE_ENV, "main"), item.nodeid, tier(item), item.stash.get(_OUTCOME, "passed"),
           f"{epoch:.1f}", f"{wall:.2f}", f"{_cpu(resource.RUSAGE_SELF) - own:.2f}",
           f"{_cpu(resource.RUSAGE_CHILDREN) - children:.2f}")
    writer.writerow(row)
    _FILE[os.environ[ENV]][0].flush()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, None, None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        item.stash[_OUTCOME] = "failed"


def pytest_sessionfinish(session: pytest.Session) -> None:
    for handle, _ in _FILE.values():
        handle.close()
    _FILE.clear()
