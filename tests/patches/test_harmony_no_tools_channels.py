"""harmony_no_tools_channels: without custom tools, `commentary` is removed from the valid channels again.

Snippets are hand-written in the shape of `get_system_message` in
`entrypoints/openai/parser/harmony_utils.py`: 0.17.0-0.33.0 (no restriction) and 0.15.1-0.16.0
(with the restriction block that vllm#32114 removed).
"""

from __future__ import annotations

import sys
from functools import partial
from types import ModuleType, SimpleNamespace

import pytest

from gptoss_patch.patches.harmony_no_tools_channels import HELPER, HELPER_SOURCE, SPEC, is_applied, not_needed
from tests.patches.helpers import status_on_fake_site, with_helper
from tests.support import tools

check = partial(tools.check_transformed, spec=SPEC)
check_drift = partial(tools.check_drift, spec=SPEC)
TARGET = "entrypoints/openai/parser/harmony_utils.py"

# 0.17.0-0.33.0: `with_custom_tools` is accepted and ignored.
UNRESTRICTED = """\
def get_system_message(reasoning_effort=None, start_date=None, browser_description=None, with_custom_tools=False):
    sys_msg_content = SystemContent.new()
    if reasoning_effort is not None:
        sys_msg_content = sys_msg_content.with_reasoning_effort(EFFORTS[reasoning_effort])
    sys_msg_content = sys_msg_content.with_conversation_start_date(start_date or "2026-01-01")
    if browser_description is not None:
        sys_msg_content = sys_msg_content.with_tools(browser_description)
    sys_msg = Message.from_role_and_content(Role.SYSTEM, sys_msg_content)
    return sys_msg
"""

# 0.15.1-0.16.0: the block this patch restores (written here in our own words).
RESTRICTED = UNRESTRICTED.replace(
    "    sys_msg = Message",
    "    if not with_custom_tools:\n"
    "        kept = [c for c in sys_msg_content.channel_config.valid_channels if c != 'commentary']\n"
    "        sys_msg_content = sys_msg_content.with_channel_config(ChannelConfig.require_channels(kept))\n"
    "    sys_msg = Message",
)

ANCHOR = "    sys_msg = Message.from_role_and_content(Role.SYSTEM, sys_msg_content)\n"
CALL = (
    "    # gptoss-patch harmony_no_tools_channels: no custom tools, no `commentary` channel.\n"
    f"    sys_msg_content = {HELPER}(sys_msg_content, with_custom_tools)\n"
)
PATCHED = with_helper(UNRESTRICTED.replace("    sys_msg = Message", CALL + "    sys_msg = Message"), HELPER_SOURCE)


def test_restricts_the_channels_right_before_the_system_message_is_built():
    check(UNRESTRICTED, PATCHED)


def test_keyword_only_parameter_is_accepted():
    source = UNRESTRICTED.replace(", with_custom_tools=False)", ", *, with_custom_tools=False)")
    check(source, with_helper(source.replace("    sys_msg = Message", CALL + "    sys_msg = Message"), HELPER_SOURCE))


def test_noop_when_already_patched():
    assert is_applied(PATCHED, None)
    assert "not found" in check_drift(PATCHED)


def test_not_needed_where_the_restriction_is_still_stock():
    assert "before 0.17.0" in not_needed(RESTRICTED, None)
    assert not is_applied(RESTRICTED, None)  # the restriction being there is not our patch
    assert not_needed(UNRESTRICTED, None) is None
    assert not_needed(PATCHED, None) is None


@pytest.mark.parametrize(
    "source, message",
    [
        pytest.param(UNRESTRICTED.replace(ANCHOR, "    sys_msg = build(sys_msg_content)\n"), "not found", id="anchor-gone"),
        pytest.param(UNRESTRICTED.replace(", with_custom_tools=False)", ")"), "not found", id="parameter-gone"),
        pytest.param(UNRESTRICTED.replace("def get_system_message", "def get_system_msg"), "not found", id="function-renamed"),
        pytest.param(UNRESTRICTED.replace(ANCHOR, ANCHOR + ANCHOR), "not found", id="anchor-twice"),
    ],
)
def test_drift_when_the_anchor_is_gone_or_ambiguous(source, message):
    assert message in check_drift(source)


def test_is_applied_needs_our_helper_called_from_get_system_message():
    assert not is_applied(UNRESTRICTED, None)
    assert not is_applied(UNRESTRICTED + "\n\n" + HELPER_SOURCE.lstrip("\n"), None)


class FakeChannelConfig(SimpleNamespace):
    @classmethod
    def require_channels(cls, channels):
        return cls(valid_channels=channels, channel_required=True)


class FakeContent(SimpleNamespace):
    def with_channel_config(self, config):
        self.channel_config = config
        return self


@pytest.fixture
def restrict(monkeypatch):
    harmony = ModuleType("openai_harmony")
    harmony.ChannelConfig = FakeChannelConfig
    monkeypatch.setitem(sys.modules, "openai_harmony", harmony)  # the helper imports it when it acts
    namespace: dict = {}
    exec(compile(HELPER_SOURCE, "harmony_utils.py", "exec"), namespace)
    return namespace[HELPER]


@pytest.mark.parametrize(
    "with_custom_tools, expected",
    [
        pytest.param(False, ["analysis", "final"], id="no-custom-tools-drops-commentary"),
        pytest.param(True, ["analysis", "commentary", "final"], id="custom-tools-keep-commentary"),
    ],
)
def test_helper_drops_commentary_only_without_custom_tools(restrict, with_custom_tools, expected):
    content = FakeContent(channel_config=FakeChannelConfig.require_channels(["analysis", "commentary", "final"]))
    assert restrict(content, with_custom_tools).channel_config.valid_channels == expected


def test_helper_leaves_a_content_without_channel_config_alone(restrict):
    content = FakeContent(channel_config=None)
    assert restrict(content, False) is content


def test_status_still_patches_the_newest_release_no_upstream_release_restores_the_restriction(tmp_path):
    named = status_on_fake_site(tmp_path / "venv", "0.33.0", args=("--with", SPEC.id))[SPEC.id]
    assert named == ("pending", "unpatched shape found in vllm 0.33.0")


def test_opt_in_status_says_so_and_how_to_apply_it_unless_named(tmp_path):
    state, reason = status_on_fake_site(tmp_path / "venv", "0.33.0")[SPEC.id]
    assert state == "opt-in"
    assert f"--with {SPEC.id}" in reason and "departs from upstream" in reason


def test_opt_in_and_its_trade_off_are_declared():
    assert SPEC.opt_in and "chat template" in SPEC.opt_in and "built-in tools" in SPEC.opt_in
