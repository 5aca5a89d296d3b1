"""Which tests need a download or a cached artefact, derived from the fixtures they use.

A fixture that fetches or builds something (a wheel, a --no-deps venv, a CPU harness venv, a serving venv)
says so once, with `@needs("upstream")` under its `@pytest.fixture`; every test that uses it, directly or
through other fixtures, gets the marker at collection (tests/conftest.py). A test that calls such a helper
in its own body carries the marker itself (`@pytest.mark.upstream`, or the module's `pytestmark`).

`make check` runs the tests without these markers (FAST), offline (OFFLINE_ENV, pip without an index) and
against an empty cache: there, tests/support/artefacts.py refuses to download, so a test that needs an
artefact but slipped into the fast set fails and says which marker it lacks, instead of downloading.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import pytest

MARKERS = ("upstream", "harness", "server")
FAST = " and ".join(f"not {m}" for m in MARKERS)  # the `-m` expression of `make check`
# Not a download: the tests of the `harness` tier that .ci/run's upstream lane runs (scripts/ci_lanes.py), so that
# the lanes end together. A `probe` test always carries `harness` too (checked at collection).
LANE_MARKERS = ("probe",)
OFFLINE_ENV = "GPTOSS_PATCH_TEST_OFFLINE"  # set (to 1) by `make check`: no download, no venv build
ATTRIBUTE = "gptoss_patch_needs"

F = TypeVar("F", bound=Callable[..., object])


def needs(*markers: str) -> Callable[[F], F]:
    """Declare that a fixture needs what `markers` stand for; its users are marked at collection."""
    unknown = set(markers) - set(MARKERS)
    if unknown or not markers:
        raise ValueError(f"needs() takes markers from {MARKERS}, got {markers}")

    def declare(fixture: F) -> F:
        setattr(fixture, ATTRIBUTE, (*getattr(fixture, ATTRIBUTE, ()), *markers))
        return fixture

    return declare


def derived(item: pytest.Item) -> dict[str, list[str]]:
    """marker -> the fixtures of `item` (its whole closure) that declare it."""
    found: dict[str, list[str]] = {}
    info = getattr(item, "_fixtureinfo", None)  # pytest's resolved fixture closure of a test function
    if info is None:  # not a python test function (e.g. a doctest)
        return found
    for name in info.names_closure:
        for fixturedef in info.name2fixturedefs.get(name, ()):
            for marker in getattr(fixturedef.func, ATTRIBUTE, ()):
                found.setdefault(marker, []).append(name)
    return found


def mark_from_fixtures(items: list[pytest.Item]) -> None:
    for item in items:
        present = {m.name for m in item.iter_markers()}
        for marker in derived(item):
            if marker not in present:
                item.add_marker(marker)
                present.add(marker)
        if "probe" in present and "harness" not in present:  # it would run in make check and in a lane: twice
            raise pytest.UsageError(f"{item.nodeid}: a `probe` test must carry the `harness` marker too")
