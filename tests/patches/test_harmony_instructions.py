"""harmony_instructions: the gpt-oss chat builder routes client system/developer messages to instructions.

Snippets are hand-written in the shape of `_make_request_with_harmony` (OpenAIServingChat in
0.15.1-0.17.x, OpenAIServingRender in 0.18.0-0.22.x): just the statements the codemod anchors on.
"""

from __future__ import annotations

import ast
from functools import partial

import pytest
from packaging.version import Version

from gptoss_patch.patches.harmony_instructions import HELPER, HELPER_SOURCE, METHOD, SPEC, fixed_upstream, is_applied
from gptoss_patch.versions import KNOWN_RELEASES
from tests.patches.helpers import status_on_fake_site, wheel_source, with_helper
from tests.support import fakesite, tools

check = partial(tools.check_transformed, spec=SPEC)
check_drift = partial(tools.check_drift, spec=SPEC)
CHAT_TARGET = "entrypoints/openai/chat_completion/serving.py"
RENDER_TARGET = "entrypoints/serve/render/serving.py"
HARMONY_UTILS = "entrypoints/openai/parser/harmony_utils.py"

# The 0.15.1-0.17.x shape: the builder is a method of the chat server.
CHAT_BUILDER = """\
class OpenAIServingChat:
    def _make_request_with_harmony(self, request, should_include_tools=True):
        messages = []
        # the system message always comes first
        sys_msg = get_system_message(
            reasoning_effort=request.reasoning_effort,
            with_custom_tools=should_include_tools,
        )
        messages.append(sys_msg)

        if request.tools:
            dev_msg = get_developer_message(tools=request.tools if should_include_tools else None)
            messages.append(dev_msg)

        messages.extend(parse_chat_inputs_to_harmony_messages(request.messages))
        return messages, render(messages)
"""

# The 0.18.0-0.22.x shape: the same statements in the render server, after a reasoning-effort check.
RENDER_BUILDER = """\
class OpenAIServingRender:
    def _make_request_with_harmony(self, request, should_include_tools=True):
        messages = []
        if (reasoning_effort := request.reasoning_effort) == "none":
            raise ValueError("no effort")
        sys_msg = get_system_message(reasoning_effort=reasoning_effort, with_custom_tools=should_include_tools)
        messages.append(sys_msg)
        if request.tools:
            messages.append(get_developer_message(tools=request.tools))
        messages.extend(parse_chat_inputs_to_harmony_messages(request.messages))
        return messages, render(messages)
"""

CALL = f"""\
        # gptoss-patch harmony_instructions: system/developer messages become harmony instructions.
        messages.extend(
            {HELPER}(
                request.messages,
                tools=request.tools if should_include_tools else None,
                reasoning_effort=request.reasoning_effort,
                with_custom_tools=should_include_tools,
            )
        )
"""


def patched(builder: str, first_line: str) -> str:
    """The builder with its four anchored statements replaced by the helper call, plus the helper."""
    lines = builder.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(first_line))
    end = next(i for i, line in enumerate(lines) if "parse_chat_inputs_to_harmony_messages" in line)
    return with_helper("".join([*lines[:start], CALL, *lines[end + 1 :]]), HELPER_SOURCE)


@pytest.mark.parametrize(
    "builder, first_line",
    [
        pytest.param(CHAT_BUILDER, "# the system message", id="chat-completion-0.15-0.17"),
        pytest.param(RENDER_BUILDER, "sys_msg =", id="serve-render-0.18-0.22"),
    ],
)
def test_rewrites_the_builder_in_both_bands(builder, first_line):
    check(builder, patched(builder, first_line))


def test_noop_when_already_patched():
    result = patched(CHAT_BUILDER, "# the system message")
    assert is_applied(result, None)
    assert "not found" in check_drift(result)


DOUBLED_BLOCK = CHAT_BUILDER.replace(
    "        return messages,",
    "        sys_msg = get_system_message(reasoning_effort=None)\n"
    "        messages.append(sys_msg)\n"
    "        if request.tools:\n"
    "            messages.append(get_developer_message(tools=request.tools))\n"
    "        messages.extend(parse_chat_inputs_to_harmony_messages(request.messages))\n"
    "        return messages,",
)


@pytest.mark.parametrize(
    "source, message",
    [
        pytest.param(CHAT_BUILDER.replace("if request.tools:", "if request.tools and ok:"), "not found", id="developer-if-changed"),
        pytest.param(CHAT_BUILDER.replace("parse_chat_inputs_to_harmony_messages", "to_harmony"), "not found", id="inputs-call-changed"),
        pytest.param(CHAT_BUILDER.replace(METHOD, "_render_harmony"), "not found", id="method-renamed"),
        pytest.param(DOUBLED_BLOCK, "not found", id="anchor-block-twice-in-one-method"),
        pytest.param(CHAT_BUILDER + "\n\n" + RENDER_BUILDER, "found 2 times", id="two-builders-in-one-module"),
    ],
)
def test_drift_when_the_anchor_is_gone_or_ambiguous(source, message):
    assert message in check_drift(source)


def test_drift_message_names_the_anchor():
    assert check_drift("x = 1\n").startswith("_make_request_with_harmony:")


def test_is_applied_needs_our_helper_called_from_the_builder():
    result = patched(RENDER_BUILDER, "sys_msg =")
    assert is_applied(result, None)
    assert not is_applied(RENDER_BUILDER, None)
    assert not is_applied("class OpenAIServingRender:\n    pass\n", None)  # anchor absent is not "applied"
    helper_only = RENDER_BUILDER + "\n\n" + HELPER_SOURCE.lstrip("\n")
    assert not is_applied(helper_only, None)


def test_fixed_upstream_when_harmony_utils_builds_the_preamble(fake_package):
    fixed = fake_package({HARMONY_UTILS: "def build_harmony_preamble(*, instructions, tools):\n    return []\n"}, "fixed")
    stock = fake_package({HARMONY_UTILS: "def get_system_message(instructions=None):\n    return None\n"}, "stock")
    mentioned = fake_package({HARMONY_UTILS: "# build_harmony_preamble arrives in 0.23.0\n"}, "comment")
    assert "vllm#44330" in fixed_upstream(fixed)
    assert fixed_upstream(stock) is None
    assert fixed_upstream(mentioned) is None  # a mention is not a definition
    assert fixed_upstream(fake_package({}, "empty")) is None


def test_status_from_0_23_0_looks_for_the_upstream_fix_instead_of_patching(tmp_path):
    """Before 0.23.0 the builder gets the patch; from 0.23.0 (fixed_in) `status` wants vllm#44330's preamble."""
    fix = fakesite.HARMONY_UTILS + "\n\ndef build_harmony_preamble(*, instructions, tools):\n    return []\n"
    before = status_on_fake_site(tmp_path / "0.17.1", "0.17.1")[SPEC.id]
    fixed = status_on_fake_site(tmp_path / "fixed", "0.23.0", {HARMONY_UTILS: fix})[SPEC.id]
    missing = status_on_fake_site(tmp_path / "missing", "0.23.0")[SPEC.id]
    assert before == ("pending", "unpatched shape found in vllm 0.17.1")
    assert fixed[0] == "fixed-upstream" and "vllm#44330" in fixed[1]
    assert missing == ("drifted", "vllm 0.23.0 should carry the upstream fix (since 0.23.0) but it was not found")


RELEASES = [pytest.param(str(v), id=f"vllm-{v}") for v in KNOWN_RELEASES]


@pytest.mark.upstream
@pytest.mark.parametrize("version", RELEASES)
def test_the_builder_lives_where_the_band_says(version):
    band = SPEC.band_for(Version(version))
    if band is None:
        assert "def build_harmony_preamble(" in wheel_source(version, f"vllm/{HARMONY_UTILS}")
        return
    owner = "OpenAIServingChat" if band.target == CHAT_TARGET else "OpenAIServingRender"
    tree = ast.parse(wheel_source(version, f"vllm/{band.target}"))
    classes = [c for c in tree.body if isinstance(c, ast.ClassDef)]
    owners = [c.name for c in classes if any(getattr(m, "name", None) == METHOD for m in c.body)]
    assert owners == [owner]
