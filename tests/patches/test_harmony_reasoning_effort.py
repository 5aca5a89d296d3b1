"""harmony_reasoning_effort: efforts the request models accept but harmony rejects are mapped before harmony sees them.

Snippets are hand-written in the shape of `get_system_message` in
`entrypoints/openai/parser/harmony_utils.py`: 0.18.0-0.20.x (a direct lookup that raises KeyError) and
0.21.0-0.33.0 (a membership check that raises a validation error).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import pytest

from gptoss_patch.patches.harmony_reasoning_effort import (
    DEFAULT_MAP,
    ENV,
    HELPER,
    HELPER_SOURCE,
    SPEC,
    TARGET,
    UPSTREAM_MAP_FILE,
    fixed_upstream,
    is_applied,
)
from gptoss_patch.spec import PackageView
from tests.patches.helpers import status_on_fake_site, with_helper
from tests.support import tools

check = partial(tools.check_transformed, spec=SPEC)
check_drift = partial(tools.check_drift, spec=SPEC)

ANCHOR = "    if reasoning_effort is not None:\n"

# 0.18.0-0.20.x: an unknown effort is looked up directly.
LOOKUP = """\
EFFORTS = {"high": "HIGH", "medium": "MEDIUM", "low": "LOW"}


def get_system_message(model_identity=None, reasoning_effort=None, with_custom_tools=False):
    sys_msg_content = SystemContent.new()
    if reasoning_effort is not None:
        sys_msg_content = sys_msg_content.with_reasoning_effort(EFFORTS[reasoning_effort])
    return sys_msg_content
"""

# 0.21.0-0.33.0: checked first, with the error the API turns into a 400.
CHECKED = LOOKUP.replace(
    ANCHOR,
    ANCHOR + "        if reasoning_effort not in EFFORTS:\n"
    "            raise ValueError(f'{reasoning_effort!r} is not supported by Harmony')\n",
)

CALL = (
    "    # gptoss-patch harmony_reasoning_effort: efforts harmony does not know are mapped to ones it does.\n"
    f"    reasoning_effort = {HELPER}(reasoning_effort)\n"
)


def patched(source: str) -> str:
    return with_helper(source.replace(ANCHOR, CALL + ANCHOR), HELPER_SOURCE)


@pytest.mark.parametrize("source", [pytest.param(LOOKUP, id="0.18-lookup"), pytest.param(CHECKED, id="0.21-check")])
def test_maps_the_effort_right_before_harmony_reads_it(source):
    check(source, patched(source))


def test_keyword_only_parameter_is_accepted():
    source = LOOKUP.replace("(model_identity=None, reasoning_effort=None,", "(model_identity=None, *, reasoning_effort=None,")
    check(source, patched(source))


def test_noop_when_already_patched():
    assert is_applied(patched(CHECKED), None)
    assert "not found" in check_drift(patched(CHECKED))


@pytest.mark.parametrize(
    "source",
    [
        pytest.param(CHECKED.replace(ANCHOR, "    if reasoning_effort:\n"), id="anchor-gone"),
        pytest.param(CHECKED.replace("reasoning_effort=None, ", "effort=None, "), id="parameter-gone"),
        pytest.param(CHECKED.replace("def get_system_message", "def get_system_msg"), id="function-renamed"),
        pytest.param(CHECKED.replace("    return sys_msg_content", ANCHOR + "        pass\n    return sys_msg_content"), id="anchor-twice"),
    ],
)
def test_drift_when_the_anchor_is_gone_or_ambiguous(source):
    assert "not found" in check_drift(source)


def test_is_applied_needs_our_helper_called_from_get_system_message():
    assert not is_applied(CHECKED, None)
    assert not is_applied(CHECKED + "\n\n" + HELPER_SOURCE.lstrip("\n"), None)


@pytest.fixture
def mapped() -> Callable[[str | None], str | None]:
    namespace: dict = {}
    exec(compile(HELPER_SOURCE, "harmony_utils.py", "exec"), namespace)
    return namespace[HELPER]


@pytest.mark.parametrize(
    "effort, expected",
    [
        pytest.param("minimal", "low", id="minimal-low"),
        pytest.param("xhigh", "high", id="xhigh-high"),
        pytest.param("max", "high", id="max-high"),
        pytest.param("none", "none", id="none-left-to-vllm"),
        pytest.param("low", "low", id="low-unchanged"),
        pytest.param("medium", "medium", id="medium-unchanged"),
        pytest.param("high", "high", id="high-unchanged"),
        pytest.param("bogus", "bogus", id="unknown-left-to-vllm"),
        pytest.param(None, None, id="unset"),
    ],
)
def test_default_map(mapped, monkeypatch, effort, expected):
    monkeypatch.delenv(ENV, raising=False)
    assert mapped(effort) == expected


def test_default_map_names_only_efforts_harmony_rejects():
    assert set(DEFAULT_MAP) == {"minimal", "xhigh", "max"}
    assert set(DEFAULT_MAP.values()) <= {"low", "medium", "high"}


@pytest.mark.parametrize(
    "value, effort, expected",
    [
        pytest.param("{}", "minimal", "minimal", id="empty-map-is-stock"),
        pytest.param('{"none": "low"}', "none", "low", id="none-on-request"),
        pytest.param('{"none": "low"}', "xhigh", "xhigh", id="a-set-map-replaces-the-default"),
        pytest.param('{"medium": "low"}', "medium", "low", id="upstream-help-example"),
    ],
)
def test_the_variable_chooses_the_map(mapped, monkeypatch, value, effort, expected):
    monkeypatch.setenv(ENV, value)
    assert mapped(effort) == expected


@pytest.mark.parametrize(
    "value, message",
    [
        pytest.param("minimal=low", "is not valid JSON", id="not-json"),
        pytest.param('["low"]', "must be a JSON object of strings", id="a-list"),
        pytest.param('{"minimal": 1}', "must be a JSON object of strings", id="a-number"),
    ],
)
def test_a_bad_variable_is_one_clear_error(mapped, monkeypatch, value, message):
    monkeypatch.setenv(ENV, value)
    with pytest.raises(ValueError, match=message) as raised:
        mapped("minimal")
    assert ENV in str(raised.value)


def test_fixed_upstream_where_the_release_defines_the_map(fake_package: Callable[..., PackageView]):
    with_map = fake_package({UPSTREAM_MAP_FILE: "def map_reasoning_effort(effort, effort_map):\n    return effort\n"}, "new")
    without = fake_package({UPSTREAM_MAP_FILE: "def merge_kwargs(a, b):\n    return a\n"}, "old")
    reason = fixed_upstream(with_map)
    assert reason is not None and "--reasoning-effort-map" in reason and "maps nothing by default" in reason
    assert fixed_upstream(without) is None


def test_status_at_fixed_in(tmp_path):
    """0.32.0 still gets the patch; 0.33.0 should define upstream's map, and drift is reported if it does not."""
    before = status_on_fake_site(tmp_path / "0.32.0", "0.32.0", {TARGET: CHECKED})[SPEC.id]
    fixed = status_on_fake_site(
        tmp_path / "fixed", "0.33.0", {TARGET: CHECKED, UPSTREAM_MAP_FILE: "def map_reasoning_effort(e, m):\n    return e\n"}
    )[SPEC.id]
    missing = status_on_fake_site(tmp_path / "missing", "0.33.0", {TARGET: CHECKED})[SPEC.id]
    assert before == ("pending", "unpatched shape found in vllm 0.32.0")
    assert fixed[0] == "fixed-upstream" and "map_reasoning_effort" in fixed[1]
    assert missing == ("drifted", "vllm 0.33.0 should carry the upstream fix (since 0.33.0) but it was not found")
