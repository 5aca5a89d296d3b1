"""The fuzz's verdict (tests/support/hostile.py, used by scripts/fuzz.py and tests/e2e): a case the patched server
answers badly counts against the patches only where stock did not answer it the same bad way, except a case of
hostile.FIXED (a stock 5xx in code a patch rewrites, fixed by the patch), which counts whatever stock answers."""

from __future__ import annotations

from collections import Counter

from tests.support.hostile import FIXED, RESPONSES, Outcome, Row, Soak, case, regressions


def soak(*answers: tuple[str, str]) -> Soak:
    run = Soak(seconds=1.0, concurrency=2, labels=Counter(answers))
    run.details.update({answer: "detail" for answer in answers})
    return run


def test_a_hang_stock_also_has_under_the_same_load_is_not_a_regression() -> None:
    patched = soak(("responses/schema+9", "hang"), ("chat/valid", "200"))
    stock = soak(("responses/schema+9", "hang"))
    alone = {"responses/schema+9": "200", "chat/valid": "200"}
    assert patched.new_bad(alone, stock) == []
    # Without stock's soak to compare with, the same hang is reported.
    assert patched.new_bad(alone) == [("responses/schema+9", "hang", "detail")]


def test_a_bad_answer_only_the_patched_server_gives_is_reported() -> None:
    patched = soak(("chat/system-parts", "500"), ("responses/schema+9", "hang"))
    stock = soak(("responses/schema+9", "500"))  # bad too, but not the same way
    alone = {"chat/system-parts": "400", "responses/schema+9": "200"}
    assert patched.new_bad(alone, stock) == [("chat/system-parts", "500", "detail"), ("responses/schema+9", "hang", "detail")]


def test_a_case_stock_answers_badly_alone_is_not_the_patches_doing() -> None:
    patched = soak(("chat/json-array", "500"))
    assert patched.new_bad({"chat/json-array": "500"}, soak()) == []


def row(name: str, stock: str, patched: str) -> Row:
    return Row(case(name, RESPONSES, {}), Outcome(stock, 0.1), Outcome(patched, 0.1))


def test_a_case_the_patches_fixed_must_not_fail_on_the_patched_server_whatever_stock_does() -> None:
    fixed = "responses/input-assistant-refusal"
    assert {fixed, "responses/effort-minimal", "responses/effort-none", "responses/effort-xhigh",
            "responses/input-reasoning-two-parts", "responses/input-reasoning-empty-content",
            "responses/input-reasoning-no-content"} == set(FIXED)
    assert regressions([row(fixed, "500", "200"), row("chat/json-array", "500", "500")]) == []
    assert [r.case.name for r in regressions([row(fixed, "500", "500"), row(fixed, "500", "hang")])] == [fixed, fixed]
    # Under load too: stock's own 5xx on the case, alone or in its soak, excuses nothing.
    patched = soak((fixed, "500"))
    assert patched.new_bad({fixed: "500"}, soak((fixed, "500"))) == [(fixed, "500", "detail")]


def test_a_valid_body_with_a_null_budget_gets_the_cap() -> None:
    """`max_completion_tokens: null` (or `max_tokens: null`) is no budget: without the cap the tiny model decodes to
    the end of its context, over a minute on 2 cores, and the case reads as a hang (the two of 0.17.1's fuzz)."""
    from tests.support.hostile import CHAT, _bounded

    for body in ({"max_completion_tokens": None}, {"max_tokens": None}, {"max_completion_tokens": None, "max_tokens": None}, {}):
        assert _bounded({**body, "messages": []}, "m", CHAT, valid=True)["max_tokens"] == 16, body
    assert "max_tokens" not in _bounded({"max_completion_tokens": 4, "messages": []}, "m", CHAT, valid=True)
    assert _bounded({"max_tokens": None}, "m", CHAT, valid=False)["max_tokens"] is None  # invalid bodies stay as drawn
