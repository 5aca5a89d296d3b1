"""harmony_responses_input: the Responses converters render system/developer items as harmony instructions.

Snippets are hand-written in the shape of `parse_response_input` (harmony_utils, 0.15.1-0.16.x),
`response_input_to_harmony` and `_parse_chat_format_message` (responses/harmony.py, 0.17.0-0.22.x):
the statements the codemod anchors on and enough around them to place them.
"""

from __future__ import annotations

from functools import partial

import pytest
from packaging.version import Version

from gptoss_patch.patches._base import run_codemod
from gptoss_patch.patches.harmony_responses_input import (
    HARMONY_UTILS,
    HELPER,
    HELPER_SOURCE,
    RESPONSES_HARMONY,
    SPEC,
    fixed_upstream,
    is_applied,
)
from gptoss_patch.versions import KNOWN_RELEASES
from tests.patches.helpers import status_on_fake_site, wheel_source, with_helper
from tests.support import fakesite, tools

check = partial(tools.check_transformed, spec=SPEC)
check_drift = partial(tools.check_drift, spec=SPEC)

ITEM = """\
def {name}(response_msg, prev_responses):
    if not isinstance(response_msg, dict):
        response_msg = response_msg.model_dump()
    if "type" not in response_msg or response_msg["type"] == "message":
        role = response_msg["role"]
        content = response_msg["content"]
        text_prefix = "Instructions:\\n" if role == "developer" else ""
        if isinstance(content, str):
            msg = Message.from_role_and_content(role, text_prefix + content)
        else:
            contents = [TextContent(text=text_prefix + c["text"]) for c in content]
            msg = Message.from_role_and_contents(role, contents)
    elif response_msg["type"] == "function_call":
        content = response_msg["content"]
        msg = call(response_msg)
    else:
        raise ValueError(response_msg["type"])
    return msg
"""
ITEM_RETURN = (
    '        content = response_msg["content"]\n'
    "        # gptoss-patch harmony_responses_input: system/developer items become harmony instructions (vllm#44330).\n"
    '        if role in ("system", "developer"):\n'
    f"            return {HELPER}(role, content)\n"
)
CHAT_FORMAT = """\
def _parse_chat_format_message(chat_msg):
    role = chat_msg.get("role")
    if role == "tool":
        return [tool_output(chat_msg)]

    # Default: user/assistant/system messages
    return [Message.from_role_and_content(role, chat_msg.get("content", ""))]
"""
CHAT_FORMAT_RETURN = (
    "        return [tool_output(chat_msg)]\n"
    "    # gptoss-patch harmony_responses_input: system/developer messages become harmony instructions (vllm#44330).\n"
    '    if role in ("system", "developer"):\n'
    f'        instructions = {HELPER}(role, chat_msg.get("content"))\n'
    "        return [instructions] if instructions is not None else []\n"
)

HARMONY_UTILS_016 = ITEM.format(name="parse_response_input")  # 0.15.1-0.16.x
RESPONSES_017 = CHAT_FORMAT + "\n\n" + ITEM.format(name="response_input_to_harmony")  # 0.17.0-0.22.x


PART_TEXT = '            contents = [TextContent(text=text_prefix + c["text"]) for c in content]\n'
PART_TEXT_PATCHED = (
    '            contents = [TextContent(text=text_prefix + c.get("text", "")) for c in content]'
    "  # gptoss-patch harmony_responses_input: a part without text is empty text, as in 0.23.0 (not a KeyError)\n"
)


def patched_item(source: str) -> str:
    # The message branch's read is rewritten; the function_call branch's same-looking read is not. A content
    # part is read with .get("text", ""), as 0.23.0 reads it (stock's c["text"] is a KeyError, a 500, without text).
    return source.replace('        content = response_msg["content"]\n', ITEM_RETURN, 1).replace(PART_TEXT, PART_TEXT_PATCHED)


def test_rewrites_parse_response_input_in_harmony_utils():
    check(HARMONY_UTILS_016, with_helper(patched_item(HARMONY_UTILS_016), HELPER_SOURCE))


def test_rewrites_both_converters_in_responses_harmony():
    patched = patched_item(RESPONSES_017).replace("        return [tool_output(chat_msg)]\n", CHAT_FORMAT_RETURN)
    check(RESPONSES_017, with_helper(patched, HELPER_SOURCE))


@pytest.mark.parametrize(
    "source, message",
    [
        pytest.param(HARMONY_UTILS_016.replace('content = response_msg["content"]', "content = body(response_msg)"),
                     "not found", id="content-read-changed"),
        pytest.param(HARMONY_UTILS_016.replace('role = response_msg["role"]', "role = response_msg.get('role')"),
                     "not found", id="role-read-changed"),
        pytest.param(HARMONY_UTILS_016.replace('response_msg["type"] == "message"', 'response_msg["type"] in MESSAGES'),
                     "not found", id="message-branch-changed"),
        pytest.param(HARMONY_UTILS_016.replace("parse_response_input", "convert_item"), "not found", id="function-renamed"),
        # responses/harmony.py: both converters must be rewritten; one of two is drift too.
        pytest.param(RESPONSES_017.replace('if role == "tool":', 'if role in ("tool",):'), "found 1 times",
                     id="chat-format-tool-branch-changed"),
        pytest.param(RESPONSES_017.replace("_parse_chat_format_message", "_chat_format"), "found 1 times",
                     id="chat-format-renamed"),
        pytest.param(RESPONSES_017.replace("        text_prefix", '        content = response_msg["content"]\n        text_prefix'),
                     "found 1 times", id="content-read-twice"),
        pytest.param(HARMONY_UTILS_016.replace('c["text"]', 'c.get("text", "")'), "not found", id="part-text-read-changed"),
        pytest.param(RESPONSES_017.replace(PART_TEXT, PART_TEXT + PART_TEXT), "found 1 times", id="part-text-read-twice"),
    ],
)
def test_drift_when_an_anchor_is_gone_or_ambiguous(source, message):
    assert message in check_drift(source)


class FakeMessage:
    """openai_harmony's Message as far as the converter snippets use it: (role, the texts)."""

    @staticmethod
    def from_role_and_content(role: str, text: str) -> tuple[str, list[str]]:
        return (role, [text])

    @staticmethod
    def from_role_and_contents(role: str, contents: list[str]) -> tuple[str, list[str]]:
        return (role, list(contents))


def convert(source: str, item: dict) -> object:
    """parse_response_input of `source` run on one input item, with fake harmony types."""
    namespace: dict[str, object] = {"Message": FakeMessage, "TextContent": lambda text: text}
    exec(compile(source, "harmony_utils.py", "exec"), namespace)
    namespace[HELPER] = lambda role, content: ("instructions", role)  # the real one imports vllm
    return namespace["parse_response_input"](item, [])  # type: ignore[operator]


REFUSAL = {"type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": "I can't."}]}
PARTS = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi "}, {"type": "input_text", "text": "there"}]}


def test_a_part_without_text_reads_as_empty_text_where_stock_raises_a_key_error():
    """make fuzz: an earlier answer's refusal sent back as input was a KeyError (a 500) in the stock converter;
    patched reads it as 0.23.0 does. Parts with text and string content convert exactly as on stock."""
    patched = run_codemod(SPEC.codemod(), HARMONY_UTILS_016, None)
    with pytest.raises(KeyError, match="text"):
        convert(HARMONY_UTILS_016, REFUSAL)
    assert convert(patched, REFUSAL) == ("assistant", [""])
    for item in (PARTS, {"type": "message", "role": "user", "content": "Hi"}):
        assert convert(patched, item) == convert(HARMONY_UTILS_016, item)
    assert convert(patched, {"role": "developer", "content": "Be brief."}) == ("instructions", "developer")


def test_drift_message_names_the_converters():
    assert check_drift("x = 1\n").startswith("parse_response_input / response_input_to_harmony:")


def test_is_applied_needs_every_converter_to_call_the_helper():
    half = patched_item(RESPONSES_017)  # response_input_to_harmony rewritten, _parse_chat_format_message not
    assert not is_applied(RESPONSES_017, None)
    assert not is_applied(with_helper(half, HELPER_SOURCE), None)
    assert not is_applied(HARMONY_UTILS_016 + "\n\n" + HELPER_SOURCE.lstrip("\n"), None)  # helper never called


def test_fixed_upstream_when_response_input_to_harmony_calls_get_system_or_developer_message(fake_package):
    fixed = fake_package({RESPONSES_HARMONY: (
        "def response_input_to_harmony(response_msg, prev_responses):\n"
        "    return get_system_or_developer_message(response_msg['role'], 'x')\n")}, "fixed")
    defined_only = fake_package({RESPONSES_HARMONY: "def get_system_or_developer_message(role, text):\n    return None\n"}, "def")
    assert "vllm#44330" in fixed_upstream(fixed)
    assert fixed_upstream(defined_only) is None
    assert fixed_upstream(fake_package({RESPONSES_HARMONY: fakesite.RESPONSES_HARMONY}, "stock")) is None


def test_status_from_0_23_0_looks_for_the_upstream_fix_instead_of_patching(tmp_path):
    fix = fakesite.RESPONSES_HARMONY.replace(
        '        text_prefix = "Instructions:\\n" if role == "developer" else ""\n',
        "        return get_system_or_developer_message(role, content)\n",
    )
    before = status_on_fake_site(tmp_path / "0.17.1", "0.17.1")[SPEC.id]
    fixed = status_on_fake_site(tmp_path / "fixed", "0.23.0", {RESPONSES_HARMONY: fix})[SPEC.id]
    missing = status_on_fake_site(tmp_path / "missing", "0.23.0")[SPEC.id]
    assert before == ("pending", "unpatched shape found in vllm 0.17.1")
    assert fixed[0] == "fixed-upstream" and "vllm#44330" in fixed[1]
    assert missing == ("drifted", "vllm 0.23.0 should carry the upstream fix (since 0.23.0) but it was not found")


RELEASES = [pytest.param(str(v), id=f"vllm-{v}") for v in KNOWN_RELEASES]


@pytest.mark.upstream
@pytest.mark.parametrize("version", RELEASES)
def test_the_converter_lives_where_the_band_says(version):
    """parse_response_input in harmony_utils up to 0.16.x; response_input_to_harmony in responses/harmony.py from 0.17.0."""
    moved = Version(version) >= Version("0.17.0")
    utils = wheel_source(version, f"vllm/{HARMONY_UTILS}")
    responses = wheel_source(version, f"vllm/{RESPONSES_HARMONY}")
    assert ("def parse_response_input(" in utils) is not moved
    assert (responses is not None and "def response_input_to_harmony(" in responses) is moved
