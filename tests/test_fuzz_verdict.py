"""The fuzz's verdict on the soak (tests/support/hostile.py, used by scripts/fuzz.py and tests/e2e): a case the
patched server answers badly counts against the patches only where stock did not answer it the same bad way."""

from __future__ import annotations

from collections import Counter

from tests.support.hostile import Soak


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
