"""Upstream parity: vLLM's own tests of each backported fix pass on the patched releases (issue #23).

The tests come from the fixing release's source distribution at test time and run unchanged in the CPU
harness (tests/support/upstream_tests.py: the suites, the one LISTED table of what is not run and why,
the set-up shim). The rule: every upstream test that passes on the fixing release passes on each patched
release, except the LISTED ones; a `pending` row's tests must still fail there (when they pass, the row
goes). Stock releases fail the tests the patch is about, so the check can fail.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import upstream_tests
from tests.support.upstream_tests import SUITES, Outcome, Suite, excused, listed

pytestmark = [pytest.mark.upstream, pytest.mark.harness]

CASES = [pytest.param(suite, version, id=f"{name}-vllm-{version}") for name, suite in SUITES.items() for version in suite.patched]


@pytest.fixture(scope="module")
def tests_root(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """The tree of upstream files for a release's sdist, extracted once per module for every suite it holds (a run
    writes nothing there: no bytecode, no pytest cache; its results file lies beside the tree)."""
    done: dict[str, Path] = {}

    def root(release: str) -> Path:
        if release not in done:
            suites = [suite for suite in SUITES.values() if suite.release == release]
            done[release] = upstream_tests.extract(suites, tmp_path_factory.mktemp(f"sdist-{release}") / "tests-root")
        return done[release]

    return root


def run_suites(suites: list[Suite], version: str, root: Path, where: Path, *, patched: bool,
               only: tuple[str, ...] = ()) -> dict[str, Outcome]:
    python = upstream_tests.venv(version, where / "venv", patched=patched)
    return upstream_tests.run(python, root, suites, version, only)


@pytest.fixture(scope="module")
def pass_set(tests_root: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], dict[str, Outcome]]:
    """A suite's outcomes on its stock fixing release, run once per module on first use: the suites of one sdist with
    the same pass-set release run in one pytest process (one import of vLLM's API layer, not one per suite)."""
    done: dict[str, dict[str, Outcome]] = {}

    def outcomes(name: str) -> dict[str, Outcome]:
        if name not in done:
            suite = SUITES[name]
            group = [s for s in SUITES.values() if (s.release, s.stock_run) == (suite.release, suite.stock_run)]
            if not upstream_tests.together(group, suite.stock_run):
                group = [suite]
            ran = run_suites(group, suite.stock_run, tests_root(suite.release),
                             tmp_path_factory.mktemp(f"stock-{suite.stock_run}"), patched=False)
            done.update({s.patch: upstream_tests.of_suite(ran, s) for s in group})
        return done[name]

    return outcomes


def outcome(outcomes: dict[str, Outcome], nodeid: str) -> str:
    return outcomes[nodeid].outcome if nodeid in outcomes else "not collected"


def describe(nodeids: list[str], outcomes: dict[str, Outcome]) -> str:
    return "; ".join(f"{n} ({outcome(outcomes, n)}: {outcomes[n].message if n in outcomes else ''})" for n in nodeids)


@pytest.mark.parametrize("suite, version", CASES)
def test_upstream_tests_that_pass_on_the_fixing_release_pass_on_the_patched_release(
    suite: Suite, version: str, pass_set: Callable[[str], dict[str, Outcome]], tests_root: Callable[[str], Path], tmp_path: Path
) -> None:
    reference = pass_set(suite.patch)
    passing = sorted(n for n, o in reference.items() if o.outcome == "passed")
    assert passing, f"no upstream test of {suite.patch} passed on stock {suite.stock_run}: {describe(sorted(reference), reference)}"
    outcomes = run_suites([suite], version, tests_root(suite.release), tmp_path, patched=True)
    pending = [n for n in passing if any(row.pending for row in listed(n, suite.patch))]
    required = [n for n in passing if n not in pending and not excused(n, version, suite.patch) and outcome(outcomes, n) != "deselected"]
    broken = [n for n in required if outcome(outcomes, n) != "passed"]
    kept_out = [n for n in passing if n not in pending and n not in required]
    counts = (f"{suite.patch} on patched {version}: {len(required) - len(broken)} passed of {len(required)} required; "
              f"{len(passing)} of {len(reference)} pass on stock {suite.stock_run}, {len(pending) + len(kept_out)} of them "
              f"LISTED ({len(pending)} pending, {len(kept_out)} excused or deselected on {version})")
    print(counts)
    assert required, f"no upstream test is required to pass (the check would check nothing): {counts}"
    unchecked = [n for n in STOCK_FAILS[suite.patch] if n not in required]
    assert not unchecked, f"the fix's own tests are not required on patched {version}: {describe(unchecked, outcomes)}; {counts}"
    assert not broken, f"{counts}; {len(broken)} fail: {describe(broken, outcomes)}"
    landed = [n for n in pending if outcome(outcomes, n) == "passed"]
    assert not landed, (f"pending upstream tests pass on patched {version} now: drop `pending` from their LISTED rows in "
                        f"tests/support/upstream_tests.py: {', '.join(landed)}")


def test_every_listed_row_names_tests_of_the_fixing_release(pass_set: Callable[[str], dict[str, Outcome]]) -> None:
    """A row that matches no upstream test any more is stale: the table is reviewed with each release."""
    collected = [(name, n) for name in SUITES for n in pass_set(name)]
    run_rows = [row for row in upstream_tests.LISTED if row.suite in SUITES]
    stale = [row.pattern for row in run_rows if not any(row in listed(n, name) for name, n in collected)]
    assert stale == []


STOCK_FAILS = {  # the tests of the fix itself: they fail on a stock release before the fix
    "harmony_instructions": (
        "tests/entrypoints/openai/parser/test_harmony_utils.py::TestCommonParseInputToHarmonyMessage::"
        "test_system_message[parse_chat_input_to_harmony_message]",
        "tests/entrypoints/openai/parser/test_harmony_utils.py::TestCommonParseInputToHarmonyMessage::"
        "test_developer_message[parse_chat_input_to_harmony_message]",
    ),
    "harmony_stream_guard": ("tests/parser/test_harmony.py::TestProcessChunk::test_malformed_token_does_not_raise",),
    "harmony_tool_choice_structural": tuple(
        f"tests/parser/test_harmony.py::TestAdjustRequest::test_adjust_request[{case}-{kind}]"
        for case in ("tool_auto_strict", "tool_required", "tool_named") for kind in ("chat", "responses")
    ),
    # with the map set the way the test sets it (the suite's `settings`): stock reads no map, so it still rejects "none"
    "harmony_reasoning_effort": (
        "tests/entrypoints/openai/test_render_parity.py::TestReasoningRenderParity::test_effort_map_applies_to_harmony",
    ),
}


@pytest.mark.parametrize("name", sorted(STOCK_FAILS))
def test_the_fix_tests_fail_on_the_newest_stock_release_before_the_fix(
    name: str, tests_root: Callable[[str], Path], tmp_path: Path
) -> None:
    suite = SUITES[name]
    # Only the fix's own tests: the rest of the suite says nothing here (and each test it adds costs a stock run).
    outcomes = run_suites([suite], suite.patched[-1], tests_root(suite.release), tmp_path, patched=False,
                          only=STOCK_FAILS[name])
    ran = [n for n in STOCK_FAILS[name] if outcome(outcomes, n) in ("passed", "failed")]
    assert ran == list(STOCK_FAILS[name]), f"on stock {suite.patched[-1]} these did not run: {describe(list(STOCK_FAILS[name]), outcomes)}"
    passing = [n for n in STOCK_FAILS[name] if outcome(outcomes, n) == "passed"]
    assert passing == [], f"on stock {suite.patched[-1]} these should fail: {passing}"
