"""The numerics gate per candidate and the choice of the winner: beyond the spread, gate passed, crashes never chosen."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from gptoss_patch.numerics.served import Pass, PromptResult
from gptoss_patch.tune import SERVED_LIMIT, choose, kernel_verdicts, served_verdict
from gptoss_patch.tune.gate import kernel_verdict, passed


def a_pass(server: str, logprobs: list[float], index: int = 1) -> Pass:
    return Pass(server, index, (PromptResult(tuple(logprobs), tuple(range(len(logprobs))), "text"),), 0.1)


def test_a_candidate_within_the_limit_passes_the_served_check() -> None:
    reference = [a_pass("reference", [-1.0, -2.0, -3.0]), a_pass("reference", [-1.0, -2.0, -3.0], 2)]
    verdict, figures = served_verdict(reference, a_pass("tokens", [-1.01, -2.02, -3.0]))
    assert verdict.passed is True
    assert abs(figures["against_reference"]["median_abs_logprob_diff"] - 0.01) < 1e-9
    assert figures["limit"] == SERVED_LIMIT


def test_a_candidate_that_drifts_from_the_reference_fails_the_served_check() -> None:
    reference = [a_pass("reference", [-1.0, -2.0, -3.0]), a_pass("reference", [-1.0, -2.0, -3.0], 2)]
    verdict, figures = served_verdict(reference, a_pass("marlin", [-1.4, -2.5, -3.3]))
    assert verdict.passed is False
    assert figures["against_reference"]["median_abs_logprob_diff"] > SERVED_LIMIT
    assert "median |Δ logprob| 0.4 against the reference (limit 0.1" in verdict.line


def test_a_noisy_reference_widens_the_limit_to_twice_its_own_floor() -> None:
    reference = [a_pass("reference", [-1.0, -2.0, -3.0]), a_pass("reference", [-1.2, -2.2, -3.2], 2)]
    verdict, figures = served_verdict(reference, a_pass("x", [-1.3, -2.3, -3.3]))
    assert abs(figures["limit"] - 0.4) < 1e-9  # the reference differs from itself by 0.2
    assert verdict.passed is True


def test_dummy_weights_leave_the_served_check_unjudged_and_such_a_candidate_cannot_win() -> None:
    # --load-format dummy on an H200 (120b shape): every prompt logprob was ln(1/201088), whatever the backend.
    uniform = [-12.2115, -12.2115, -12.2115]
    reference = [a_pass("reference", uniform), a_pass("reference", uniform, 2)]
    verdict, figures = served_verdict(reference, a_pass("attn-triton-attn", uniform))
    assert verdict.passed is None and "not judged" in verdict.line and "--load-format dummy" in verdict.line
    assert figures["limit"] is None
    gate = {"kernel": {"passed": None, "line": "kernel check: the reference's MoE kernel"}, "served": verdict.to_json()}
    assert passed(gate) is False  # nothing that applies passed: not chosen


def kernel_report(results: list[dict[str, Any]], floors: list[dict[str, Any]], not_run: list[dict[str, str]]) -> Any:
    return SimpleNamespace(results=results, floors=floors, not_run=not_run)


def test_the_kernel_check_gates_each_moe_kernel_and_a_kernel_it_missed_fails() -> None:
    floors = [{"layer": "moe", "tokens": 8, "rel_error": 4e-3, "step": 0.25, "step_first": 0.125}]
    results = [
        {"layer": "moe", "backend": "triton", "tokens": 8, "rel_error": 3.6e-3, "batch_diff": 0.0, "max_run_diff": 0.0},
        {"layer": "moe", "backend": "marlin", "tokens": 8, "rel_error": 6e-3, "batch_diff": 0.0, "max_run_diff": 0.0},
        {"layer": "qkv", "backend": "dense", "tokens": 8, "rel_error": 1e-3, "batch_diff": 0.0, "max_run_diff": 0.0},
    ]
    verdicts = kernel_verdicts(kernel_report(results, floors, [{"layer": "moe", "backend": "flashinfer", "reason": "absent"}]))
    assert set(verdicts) == {"triton", "marlin", "flashinfer"}
    assert verdicts["triton"].passed is True and verdicts["marlin"].passed is False
    assert "1.50x the floor" in verdicts["marlin"].line
    assert verdicts["flashinfer"].passed is False and "not run (absent)" in verdicts["flashinfer"].line
    assert kernel_verdict("flashinfer_cutlass", verdicts, "").passed is False
    assert kernel_verdict("humming", verdicts, "").passed is False  # not covered: never passes by default
    assert kernel_verdict(None, verdicts, "").line == "kernel check: the reference's MoE kernel"
    assert kernel_verdict("marlin", None, "no GPU").line == "no GPU"


def row(concurrency: int, median: float, low: float, high: float) -> dict[str, Any]:
    return {"concurrency": concurrency, "generation": {"median": median, "low": low, "high": high}}


REFERENCE = {"name": "reference", "status": "measured", "rows": [row(1, 100, 98, 102), row(16, 1000, 990, 1010)]}
PASSED = {"served": {"passed": True, "line": ""}, "kernel": {"passed": None, "line": ""}}


def test_the_winner_is_faster_beyond_the_spread_somewhere_and_slower_nowhere() -> None:
    faster = {"name": "fast", "status": "measured", "gate": PASSED, "rows": [row(1, 120, 118, 121), row(16, 1000, 995, 1005)]}
    mixed = {"name": "mixed", "status": "measured", "gate": PASSED, "rows": [row(1, 150, 149, 151), row(16, 900, 890, 910)]}
    noise = {"name": "noise", "status": "measured", "gate": PASSED, "rows": [row(1, 101, 99, 103), row(16, 1005, 1000, 1012)]}
    name, why = choose(REFERENCE, [mixed, noise, faster])
    assert name == "fast"
    assert "beyond the spread at concurrency 1" in why and "1.20x at 1" in why


def test_a_faster_candidate_that_failed_the_gate_or_crashed_never_wins() -> None:
    failed = {"name": "marlin", "status": "measured", "rows": [row(1, 200, 199, 201), row(16, 2000, 1990, 2010)],
              "gate": {"served": {"passed": False, "line": ""}, "kernel": {"passed": False, "line": ""}}}
    crashed = {"name": "tp2", "status": "out of memory", "rows": [], "gate": {}}
    name, why = choose(REFERENCE, [failed, crashed])
    assert name == "reference" and "the built-in profile stays" in why
    assert passed({"served": {"passed": True}, "kernel": {"passed": None}}) is True
    assert passed({"kernel": {"passed": None}}) is False  # no check applied: not by default
