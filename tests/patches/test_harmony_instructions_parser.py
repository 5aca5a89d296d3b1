"""harmony_instructions_parser: parse_chat_input_to_harmony_message renders system/developer messages as instructions.

Snippets are hand-written in the shape of `parse_chat_input_to_harmony_message` in harmony_utils
(0.15.1-0.22.x): the statements the codemod anchors on and enough around them to place them.
"""

from __future__ import annotations

from functools import partial

import pytest

from gptoss_patch.patches.harmony_instructions_parser import (
    FUNCTION,
    HELPER_SOURCE,
    INSTRUCTIONS,
    SPEC,
    TARGET,
    fixed_upstream,
    is_applied,
)
from gptoss_patch.versions import KNOWN_RELEASES
from tests.patches.helpers import status_on_fake_site, wheel_source, with_helper
from tests.support import fakesite, tools

check = partial(tools.check_transformed, spec=SPEC)
check_drift = partial(tools.check_drift, spec=SPEC)

PARSER = """\
def parse_chat_input_to_harmony_message(chat_msg, tool_id_names=None):
    tool_id_names = tool_id_names or {}
    role = chat_msg.get("role")
    msgs = []
    tool_calls = chat_msg.get("tool_calls", [])
    if role == "assistant" and tool_calls:
        content = flatten_chat_text_content(chat_msg.get("content"))
        if content:
            msgs.append(commentary(content))
        return msgs
    if role == "tool":
        content = chat_msg.get("content", "") or ""
        content = flatten_chat_text_content(content)
        return [tool_output(content)]
    msgs.append(Message.from_role_and_contents(role, contents_of(chat_msg)))
    return msgs
"""

PATCHED = with_helper(
    PARSER.replace(
        '    role = chat_msg.get("role")\n',
        '    role = chat_msg.get("role")\n'
        "    # gptoss-patch harmony_instructions_parser: system/developer messages become harmony instructions "
        "(vllm#44330).\n"
        '    if role in ("system", "developer"):\n'
        f'        return {INSTRUCTIONS}(role, chat_msg.get("content"))\n',
    )
    .replace(
        '        content = flatten_chat_text_content(chat_msg.get("content"))\n',
        '        content = _gptoss_patch_flatten_input_text(chat_msg.get("content"))  # gptoss-patch harmony_instructions_parser\n',
    )
    .replace(
        "        content = flatten_chat_text_content(content)\n",
        '        content = _gptoss_patch_flatten_input_text(content) or ""  # gptoss-patch harmony_instructions_parser\n',
    ),
    HELPER_SOURCE,
)


def test_rewrites_the_role_dispatch_and_both_content_flattenings():
    check(PARSER, PATCHED)


def test_noop_when_already_patched():
    assert is_applied(PATCHED, None)
    assert "not found" in check_drift(PATCHED)


@pytest.mark.parametrize(
    "source",
    [
        pytest.param(PARSER.replace('role = chat_msg.get("role")', 'role = chat_msg["role"]'), id="role-read-changed"),
        pytest.param(PARSER.replace('flatten_chat_text_content(chat_msg.get("content"))', "flat(chat_msg)"),
                     id="tool-call-flatten-changed"),
        pytest.param(PARSER.replace("content = flatten_chat_text_content(content)", "content = str(content)"),
                     id="tool-flatten-changed"),
        pytest.param(PARSER.replace(FUNCTION, "parse_one_message"), id="function-renamed"),
        pytest.param(PARSER.replace("    msgs = []\n", '    msgs = []\n    role = chat_msg.get("role")\n'),
                     id="role-read-twice"),
    ],
)
def test_drift_when_an_anchor_is_gone_or_ambiguous(source):
    assert "not found" in check_drift(source)


def test_drift_message_names_the_function():
    assert check_drift("x = 1\n").startswith(f"{FUNCTION}:")


def test_is_applied_needs_the_helper_called_from_the_function():
    assert not is_applied(PARSER, None)
    assert not is_applied(PARSER + "\n\n" + HELPER_SOURCE.lstrip("\n"), None)  # helper present, never called


def test_fixed_upstream_when_harmony_utils_has_get_system_or_developer_message(fake_package):
    fixed = fake_package({TARGET: "def get_system_or_developer_message(role, instructions):\n    return None\n"}, "fixed")
    mentioned = fake_package({TARGET: "# get_system_or_developer_message arrives in 0.23.0\n"}, "comment")
    assert "vllm#44330" in fixed_upstream(fixed)
    assert fixed_upstream(mentioned) is None
    assert fixed_upstream(fake_package({TARGET: fakesite.HARMONY_UTILS}, "stock")) is None


def test_status_from_0_23_0_looks_for_the_upstream_fix_instead_of_patching(tmp_path):
    fix = fakesite.HARMONY_UTILS + "\n\ndef get_system_or_developer_message(role, instructions):\n    return None\n"
    before = status_on_fake_site(tmp_path / "0.17.1", "0.17.1")[SPEC.id]
    fixed = status_on_fake_site(tmp_path / "fixed", "0.23.0", {TARGET: fix})[SPEC.id]
    missing = status_on_fake_site(tmp_path / "missing", "0.23.0")[SPEC.id]
    assert before == ("pending", "unpatched shape found in vllm 0.17.1")
    assert fixed[0] == "fixed-upstream" and "vllm#44330" in fixed[1]
    assert missing == ("drifted", "vllm 0.23.0 should carry the upstream fix (since 0.23.0) but it was not found")


RELEASES = [pytest.param(str(v), id=f"vllm-{v}") for v in KNOWN_RELEASES]


@pytest.mark.upstream
@pytest.mark.parametrize("version", RELEASES)
def test_the_function_lives_in_harmony_utils_in_every_release(version):
    assert f"def {FUNCTION}(" in wheel_source(version, f"vllm/{TARGET}")
