"""A pytest plugin: a test whose artefact cannot be downloaded fails in one line that says how to fetch it.

Loaded by tests/conftest.py (`pytest_plugins`); usable alone with `-p tests.support.failures`.
"""

from __future__ import annotations

from collections.abc import Generator

import pytest

from tests.support import artefacts


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    return (yield from _missing_artefact_is_one_line())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    return (yield from _missing_artefact_is_one_line())


def _missing_artefact_is_one_line() -> Generator[None, None, None]:
    """A failed download fails the test with the artefact, its source and the fetch command (no traceback)."""
    try:
        return (yield)
    except artefacts.MissingArtefact as exc:
        pytest.fail(str(exc), pytrace=False)
