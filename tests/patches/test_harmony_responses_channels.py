"""harmony_responses_channels: reasoning input items on `analysis`, tool outputs on `commentary` to the assistant.

Snippets are hand-written in the shape of `parse_response_input` (harmony_utils, 0.15.1-0.16.x) and
`response_input_to_harmony` (responses/harmony.py, 0.17.0 on): the branches the codemod anchors on and enough
around them to place them. The version gate and the verdict on every real wheel are generated from the SPEC
(tests/patches/test_verdicts.py); where the code lives and which branch is stock in each wheel is checked here.
"""

from __future__ import annotations

from functools import partial

import pytest
from packaging.version import Version

from gptoss_patch.patches._base import run_codemod
from gptoss_patch.patches.harmony_responses_channels import (
    HARMONY_UTILS,
    MARK,
    RESPONSES_HARMONY,
    SPEC,
    fixed_upstream,
    is_applied,
)
from gptoss_patch.versions import KNOWN_RELEASES
from tests.patches.helpers import status_on_fake_site, wheel_source
from tests.support import fakesite, tools

check = partial(tools.check_transformed, spec=SPEC)
check_drift = partial(tools.check_drift, spec=SPEC)

MESSAGE = """\
def {name}(response_msg, prev_responses):
    if not isinstance(response_msg, dict):
        response_msg = response_msg.model_dump()
    if "type" not in response_msg or response_msg["type"] == "message":
        role = response_msg["role"]
        msg = Message.from_role_and_content(role, response_msg["content"])
    elif response_msg["type"] == "function_call_output":
        call_response = prev_responses[-1]
        msg = Message.from_author_and_content(
            Author.new(Role.TOOL, f"functions.{{call_response.name}}"),
            response_msg["output"],
        )
"""
STOCK_REASONING = """\
    elif response_msg["type"] == "reasoning":
        content = response_msg["content"]
        assert len(content) == 1
        msg = Message.from_role_and_content(Role.ASSISTANT, content[0]["text"])
"""
UPSTREAM_REASONING = """\
    elif response_msg["type"] == "reasoning":
        content = response_msg.get("content")
        if content and len(content) >= 1:
            reasoning_text = "\\n".join(item["text"] for item in content)
            msg = Message.from_role_and_content(Role.ASSISTANT, reasoning_text)
            msg = msg.with_channel("analysis")
        else:
            return None
"""
REST = """\
    elif response_msg["type"] == "function_call":
        msg = Message.from_role_and_content(Role.ASSISTANT, response_msg["arguments"])
        msg = msg.with_channel("commentary")
    else:
        raise ValueError(response_msg["type"])
    return msg
"""

HARMONY_UTILS_016 = MESSAGE.format(name="parse_response_input") + STOCK_REASONING + REST  # 0.15.1-0.16.x
RESPONSES_017 = MESSAGE.format(name="response_input_to_harmony") + STOCK_REASONING + REST  # 0.17.x
RESPONSES_018 = MESSAGE.format(name="response_input_to_harmony") + UPSTREAM_REASONING + REST  # 0.18.0-0.21.x

TOOL_MESSAGE_END = '            response_msg["output"],\n        )\n'
PATCHED_TOOL_OUTPUT = TOOL_MESSAGE_END + (
    f"        {MARK} a tool output goes to the assistant on commentary, as in vLLM 0.22.0.\n"
    '        msg = msg.with_channel("commentary")\n'
    '        msg = msg.with_recipient("assistant")\n'
)
PATCHED_REASONING = UPSTREAM_REASONING.replace(
    '        content = response_msg.get("content")\n',
    f"        {MARK} reasoning goes on the analysis channel, as in vLLM 0.18.0.\n"
    '        content = response_msg.get("content")\n',
)
UPSTREAM_TOOL_OUTPUT = PATCHED_TOOL_OUTPUT.replace(f"        {MARK} a tool output goes to the assistant on commentary, as in vLLM 0.22.0.\n", "")


def patched(source: str) -> str:
    return source.replace(TOOL_MESSAGE_END, PATCHED_TOOL_OUTPUT).replace(STOCK_REASONING, PATCHED_REASONING)


def test_rewrites_both_branches_of_parse_response_input():
    check(HARMONY_UTILS_016, patched(HARMONY_UTILS_016))


def test_rewrites_both_branches_of_response_input_to_harmony_before_0_18_0():
    check(RESPONSES_017, patched(RESPONSES_017))


def test_rewrites_only_the_tool_output_where_the_reasoning_branch_is_0_18_0s():
    after = patched(RESPONSES_018)
    assert after.count(MARK) == 1
    check(RESPONSES_018, after)


@pytest.mark.parametrize(
    "source, message",
    [
        pytest.param(RESPONSES_017.replace("parse_response_input", "x").replace("response_input_to_harmony", "convert"),
                     "not found", id="function-renamed"),
        pytest.param(RESPONSES_017.replace("Author.new(Role.TOOL,", "tool_author("), "found 1 times", id="tool-message-changed"),
        pytest.param(RESPONSES_017.replace('"function_call_output"', '"tool_output"'), "found 1 times", id="tool-branch-renamed"),
        pytest.param(RESPONSES_017.replace("        assert len(content) == 1\n", ""), "found 1 times", id="reasoning-read-changed"),
        pytest.param(RESPONSES_017.replace(STOCK_REASONING, STOCK_REASONING.replace('"reasoning"', '"thinking"')),
                     "found 1 times", id="reasoning-branch-renamed"),
        pytest.param(RESPONSES_018.replace('msg = msg.with_channel("analysis")', "pass"), "found 1 times", id="reasoning-channel-changed"),
        # A tool output that already sets its channel is 0.22.0's converter: out of the bands, and never rewritten twice.
        pytest.param(RESPONSES_018.replace(TOOL_MESSAGE_END, UPSTREAM_TOOL_OUTPUT), "not found", id="tool-output-already-addressed"),
        pytest.param(RESPONSES_017.replace(STOCK_REASONING, STOCK_REASONING + STOCK_REASONING), "found 1 times", id="reasoning-twice"),
    ],
)
def test_drift_when_an_anchor_is_gone_changed_or_ambiguous(source, message):
    assert message in check_drift(source)


def test_drift_message_names_the_converters_and_both_branches():
    message = check_drift("x = 1\n")
    assert message.startswith("parse_response_input / response_input_to_harmony:")
    assert "function_call_output" in message and "analysis channel" in message


class FakeMessage:
    """openai_harmony's Message as far as the converter snippets use it."""

    def __init__(self, author: str, texts: list[str], channel: str | None = None, recipient: str | None = None) -> None:
        self.author, self.texts, self.channel, self.recipient = author, texts, channel, recipient

    @classmethod
    def from_role_and_content(cls, role: str, text: str) -> FakeMessage:
        return cls(role, [text])

    @classmethod
    def from_author_and_content(cls, author: str, text: str) -> FakeMessage:
        return cls(author, [text])

    def with_channel(self, channel: str) -> FakeMessage:
        return FakeMessage(self.author, self.texts, channel, self.recipient)

    def with_recipient(self, recipient: str) -> FakeMessage:
        return FakeMessage(self.author, self.texts, self.channel, recipient)

    def shape(self) -> tuple[str, list[str], str | None, str | None]:
        return (self.author, self.texts, self.channel, self.recipient)


class FakeRole:
    ASSISTANT, TOOL = "assistant", "tool"


class FakeAuthor:
    @staticmethod
    def new(role: str, name: str) -> str:
        return f"{role}:{name}"


class Call:
    name = "get_weather"


def convert(source: str, item: dict) -> object:
    """parse_response_input of `source` run on one input item, with fake harmony types."""
    namespace: dict[str, object] = {"Message": FakeMessage, "Role": FakeRole, "Author": FakeAuthor}
    exec(compile(source, "harmony_utils.py", "exec"), namespace)
    message = namespace["parse_response_input"](item, [Call()])  # type: ignore[operator]
    return message.shape() if message is not None else None


PATCHED_016 = run_codemod(SPEC.codemod(), HARMONY_UTILS_016, None)
TOOL_OUTPUT = {"type": "function_call_output", "call_id": "call_1", "output": "18 C"}


def reasoning(*texts: str) -> dict:
    return {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": t} for t in texts]}


def test_a_tool_output_is_addressed_to_the_assistant_on_commentary_where_stock_gives_neither():
    assert convert(HARMONY_UTILS_016, TOOL_OUTPUT) == ("tool:functions.get_weather", ["18 C"], None, None)
    assert convert(PATCHED_016, TOOL_OUTPUT) == ("tool:functions.get_weather", ["18 C"], "commentary", "assistant")


def test_reasoning_goes_on_analysis_with_its_parts_joined_and_none_without_content():
    assert convert(HARMONY_UTILS_016, reasoning("Think.")) == ("assistant", ["Think."], None, None)
    assert convert(PATCHED_016, reasoning("Think.")) == ("assistant", ["Think."], "analysis", None)
    assert convert(PATCHED_016, reasoning("One.", "Two.")) == ("assistant", ["One.\nTwo."], "analysis", None)
    for empty in (reasoning(), {"type": "reasoning", "summary": []}, {**reasoning(), "content": None}):
        assert convert(PATCHED_016, empty) is None  # 0.18.0's converter: nothing to render, the builder skips it
    with pytest.raises(AssertionError):  # stock: a 500 for two parts (and for none)
        convert(HARMONY_UTILS_016, reasoning("One.", "Two."))


def test_every_other_item_converts_as_on_stock():
    for item in ({"type": "message", "role": "user", "content": "hi"},
                 {"type": "function_call", "name": "get_weather", "arguments": "{}"}):
        assert convert(PATCHED_016, item) == convert(HARMONY_UTILS_016, item)


def test_is_applied_needs_the_mark_and_both_channels():
    upstream_0220 = RESPONSES_018.replace(TOOL_MESSAGE_END, UPSTREAM_TOOL_OUTPUT)
    assert not is_applied(RESPONSES_017, None)
    assert not is_applied(upstream_0220, None)  # 0.22.0's own converter is fixed upstream, not patched
    assert not is_applied(patched(RESPONSES_017).replace(PATCHED_REASONING, STOCK_REASONING), None)  # half patched
    assert is_applied(patched(RESPONSES_018), None)


def test_fixed_upstream_when_the_converter_addresses_the_tool_output_itself(fake_package):
    upstream_0220 = RESPONSES_018.replace(TOOL_MESSAGE_END, UPSTREAM_TOOL_OUTPUT)
    fixed = fake_package({RESPONSES_HARMONY: upstream_0220}, "fixed")
    assert "as from 0.22.0" in fixed_upstream(fixed)
    assert fixed_upstream(fake_package({RESPONSES_HARMONY: RESPONSES_018}, "018")) is None
    assert fixed_upstream(fake_package({RESPONSES_HARMONY: patched(RESPONSES_018)}, "patched")) is None
    assert fixed_upstream(fake_package({RESPONSES_HARMONY: fakesite.RESPONSES_HARMONY}, "stock")) is None


def test_status_from_0_22_0_looks_for_the_upstream_fix_instead_of_patching(tmp_path):
    fix = fakesite.RESPONSES_HARMONY.replace(
        '            response_msg["output"],\n        )\n',
        '            response_msg["output"],\n        )\n'
        '        msg = msg.with_channel("commentary")\n        msg = msg.with_recipient("assistant")\n',
    ).replace(
        '        content = response_msg["content"]\n        assert len(content) == 1\n',
        '        content = response_msg["content"]\n',
    ).replace(
        'msg = Message.from_role_and_content(Role.ASSISTANT, content[0]["text"])\n',
        'msg = Message.from_role_and_content(Role.ASSISTANT, content[0]["text"]).with_channel("analysis")\n',
    )
    assert fix.count("with_") == 3
    before = status_on_fake_site(tmp_path / "0.17.1", "0.17.1")[SPEC.id]
    fixed = status_on_fake_site(tmp_path / "fixed", "0.22.0", {RESPONSES_HARMONY: fix})[SPEC.id]
    missing = status_on_fake_site(tmp_path / "missing", "0.22.0")[SPEC.id]
    assert before == ("pending", "unpatched shape found in vllm 0.17.1")
    assert fixed[0] == "fixed-upstream" and "as from 0.22.0" in fixed[1]
    assert missing == ("drifted", "vllm 0.22.0 should carry the upstream fix (since 0.22.0) but it was not found")


RELEASES = [pytest.param(str(v), id=f"vllm-{v}") for v in KNOWN_RELEASES]


@pytest.mark.upstream
@pytest.mark.parametrize("version", RELEASES)
def test_each_branch_is_stock_or_upstreams_where_the_bands_say(version):
    """The converter's reasoning branch gains the analysis channel in 0.18.0 and its tool output `to=assistant` on
    commentary in 0.22.0; the converter lives in harmony_utils up to 0.16.x and in responses/harmony.py from 0.17.0."""
    v = Version(version)
    relpath = RESPONSES_HARMONY if v >= Version("0.17.0") else HARMONY_UTILS
    source = wheel_source(version, f"vllm/{relpath}")
    assert source is not None
    start = source.index("def response_input_to_harmony(" if v >= Version("0.17.0") else "def parse_response_input(")
    converter = source[start : source.index("\ndef ", start + 1)]
    assert ('msg = msg.with_channel("analysis")' in converter) is (v >= Version("0.18.0"))
    assert ("assert len(content) == 1" in converter) is (v < Version("0.18.0"))
    assert ('msg = msg.with_recipient("assistant")' in converter) is (v >= Version("0.22.0"))
    assert "Author.new(Role.TOOL," in converter
