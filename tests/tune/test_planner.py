"""The budget: parsed, fitted in the candidates' order, "needs at least X", and refitted at the measured pace."""

from __future__ import annotations

import pytest

from gptoss_patch.bench import Workload
from gptoss_patch.errors import UsageError
from gptoss_patch.tune import CPU_COSTS, GPU_COSTS, Candidate, duration, fit, parse_budget, refit
from gptoss_patch.tune.planner import CANDIDATE_PASSES, REFERENCE_PASSES, server_seconds

WORKLOAD = Workload(model="m", concurrency=(1,), repeat=2, input_len=16, output_len=8)
CANDIDATES = [Candidate(f"c{i}", "batched-tokens", (("--max-num-batched-tokens", str(256 * (i + 1))),)) for i in range(4)]


@pytest.mark.parametrize(("text", "seconds"), [("30m", 1800), ("1h30m", 5400), ("90s", 90), ("600", 600), ("2h", 7200)])
def test_a_budget_reads_hours_minutes_and_seconds(text: str, seconds: float) -> None:
    assert parse_budget(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "30x", "0", "m"])
def test_a_budget_that_is_no_duration_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError, match="--budget"):
        parse_budget(text)


def test_the_candidates_are_taken_in_order_while_they_fit_and_the_rest_is_said() -> None:
    reference = server_seconds(CPU_COSTS, WORKLOAD, passes=REFERENCE_PASSES)
    each = server_seconds(CPU_COSTS, WORKLOAD, passes=CANDIDATE_PASSES)
    plan = fit(CANDIDATES, reference + 2 * each + 1, CPU_COSTS, WORKLOAD, kernel=False)
    assert [c.name for c in plan.chosen] == ["c0", "c1"]
    assert [s.name for s in plan.left_out] == ["c2", "c3"]
    assert all(s.reason.startswith("left out for the budget") for s in plan.left_out)
    assert plan.seconds == pytest.approx(reference + 2 * each)


def test_a_budget_too_small_for_one_candidate_says_how_much_it_needs() -> None:
    needed = server_seconds(GPU_COSTS, WORKLOAD, passes=REFERENCE_PASSES) + server_seconds(
        GPU_COSTS, WORKLOAD, passes=CANDIDATE_PASSES) + GPU_COSTS.kernel  # fmt: skip
    with pytest.raises(UsageError) as caught:
        fit(CANDIDATES, needed - 1, GPU_COSTS, WORKLOAD, kernel=True)
    assert f"tune needs at least {duration(needed)} here" in str(caught.value)
    assert "kernel check" in str(caught.value)
    assert fit(CANDIDATES, needed, GPU_COSTS, WORKLOAD, kernel=True).chosen == (CANDIDATES[0],)


def test_nothing_to_tune_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="nothing to tune"):
        fit([], 3600, CPU_COSTS, WORKLOAD, kernel=False)


def test_a_slower_reference_than_estimated_drops_candidates_but_keeps_the_first() -> None:
    plan = fit(CANDIDATES, 10_000, CPU_COSTS, WORKLOAD, kernel=False)
    assert len(plan.chosen) == 4
    slow = refit(plan, measured=plan.reference_seconds * 10, remaining=1.0, done=0)
    assert [c.name for c in slow.chosen] == ["c0"]  # the plan promised one candidate
    assert [s.name for s in slow.left_out] == ["c1", "c2", "c3"]
    assert "measured pace" in slow.left_out[0].reason
    fast = refit(plan, measured=plan.reference_seconds, remaining=10_000, done=0)
    assert fast.chosen == plan.chosen and fast.left_out == ()


def test_durations_read_as_people_write_them() -> None:
    assert [duration(s) for s in (43, 161, 3900)] == ["43 s", "2 min 41 s", "1 h 05 min"]
