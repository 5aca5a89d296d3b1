"""harmony_final_flush: a non-streaming output that ends inside a message header keeps its raw tail as content.

Snippets are hand-written in the shape of the harmony branch of `chat_completion_full_generator` (the chat
serving module, 0.15.1-0.23.x) and of `HarmonyParser.parse` (parser/harmony.py, 0.24.x). The behaviour tests
run the real non-streaming generator in CPU harness venvs (tests/support/chat_output.py): stock returns
`content: null` for the malformed final turn of vllm#45736, patched returns what stock 0.25.0 returns.
"""

from __future__ import annotations

from functools import partial

import pytest
from packaging.version import Version

from gptoss_patch.patches.harmony_final_flush import (
    FLUSH_SOURCE,
    MARK,
    PARSER_TARGET,
    RAW_TAIL_SOURCE,
    SERVING_TARGET,
    SPEC,
    WITH_RAW_TAIL_SOURCE,
    fixed_upstream,
    is_applied,
)
from gptoss_patch.versions import KNOWN_RELEASES
from tests.patches.helpers import round_trip_on_the_real_file, status_on_fake_site, wheel_source, with_helper
from tests.support import chat_output, harness, tools
from tests.support.markers import needs

check = partial(tools.check_transformed, spec=SPEC)
check_drift = partial(tools.check_drift, spec=SPEC)

SERVING = """\
class OpenAIServingChat:
    async def chat_completion_full_generator(self, request, outputs, tokenizer):
        for output in outputs:
            token_ids = output.token_ids
            if self.use_harmony:
                reasoning, content, _ = parse_chat_output(token_ids)
                if not request.include_reasoning:
                    reasoning = None

                if self.tool_parser is not None:
                    tool_call_info = self.tool_parser(tokenizer).extract_tool_calls("", request, token_ids)
                    content = tool_call_info.content
                    message = ChatMessage(content=content, tool_calls=tool_call_info.tool_calls)
                else:
                    message = ChatMessage(content=content)

                choices.append(message)
                continue
"""
SERVING_PATCHED = with_helper(
    SERVING.replace(
        "                    message = ChatMessage(content=content)\n",
        "                    message = ChatMessage(content=content)\n"
        f"                {MARK} an output that ends inside a message header keeps its raw tail as content "
        "(vLLM 0.25.0).\n"
        "                message.content = _gptoss_patch_with_raw_tail(message.content, token_ids, tokenizer)\n",
    ),
    RAW_TAIL_SOURCE + WITH_RAW_TAIL_SOURCE,
)
# 0.24.x: HarmonyParser.parse joins the completed messages, then the message left open.
PARSER = """\
class HarmonyParser(DelegatingParser):
    def parse(self, model_output, request, enable_auto_tools=False, model_output_token_ids=()):
        result = self.process_chunk(model_output_token_ids)
        content_parts = [s.completed_message.content[0].text for s in result.segments if s.completed_message]

        if (
            self.current_channel is not None
            or self.current_recipient is not None
            or self.current_content
        ):
            content_parts.append(self.current_content)

        return "\\n".join(content_parts) or None
"""
PARSER_PATCHED = with_helper(
    PARSER.replace(
        "            content_parts.append(self.current_content)\n",
        "            content_parts.append(self.current_content)\n"
        f"        {MARK} process_eos(), the raw tail of a non-terminal end as content, a fresh parser "
        "(vLLM 0.25.0's flush()).\n"
        "        content_parts.extend(_gptoss_patch_flush(self, model_output_token_ids))\n",
    ),
    RAW_TAIL_SOURCE + FLUSH_SOURCE,
)
# 0.25.0's flush() (vllm#46437, vllm#47062): process_eos() in a `try` that recovers from HarmonyError.
FLUSH_UPSTREAM = """\
class HarmonyParser(DelegatingParser):
    def flush(self):
        try:
            self._harmony_parser.process_eos()
            msg = self._poll_completed_message()
        except HarmonyError:
            msg = Message.from_role_and_content(Role.ASSISTANT, self.model_tokenizer.decode(self._tail))
        return msg
"""


def test_keeps_the_raw_tail_in_the_harmony_branch_of_the_chat_generator():
    check(SERVING, SERVING_PATCHED)


def test_flushes_at_the_end_of_harmony_parser_parse():
    check(PARSER, PARSER_PATCHED)


def test_noop_when_already_patched():
    assert is_applied(SERVING_PATCHED, None) and is_applied(PARSER_PATCHED, None)
    assert "not found" in check_drift(SERVING_PATCHED)
    assert "not found" in check_drift(PARSER_PATCHED)


@pytest.mark.parametrize(
    "source, message",
    [
        pytest.param(SERVING.replace("chat_completion_full_generator", "full_generator"), "not found", id="renamed"),
        pytest.param(SERVING.replace("parse_chat_output(token_ids)", "parse(token_ids)"), "not found", id="no-parse"),
        pytest.param(SERVING.replace("self.tool_parser is not None", "self.tool_parser"), "not found", id="no-branch"),
        pytest.param(
            SERVING.replace(
                "                choices.append",
                "                if self.tool_parser is not None:\n"
                "                    pass\n                choices.append",
            ),
            "not found",
            id="two-tool-branches",
        ),
        pytest.param(
            PARSER.replace("self.current_channel is not None", "self.channel"), "not found", id="no-open-check"
        ),
        pytest.param(PARSER.replace("    def parse(", "    def parse_all("), "not found", id="parse-renamed"),
        pytest.param(
            PARSER.replace(
                "\n        return",
                "\n        if self.current_channel is not None or x:\n            pass\n        return",
            ),
            "not found",
            id="open-check-twice",
        ),
        pytest.param(SERVING + "\n\n" + PARSER, "found 2 times", id="both-shapes"),
    ],
)
def test_drift_when_the_anchor_is_gone_or_ambiguous(source, message):
    assert message in check_drift(source)


def test_is_applied_needs_the_mark_the_helpers_and_the_call():
    assert not is_applied(SERVING, None) and not is_applied(PARSER, None)
    without_call = SERVING_PATCHED.replace("message.content = _gptoss_patch_with_raw_tail(", "message.content = (")
    assert not is_applied(without_call, None)
    assert not is_applied(SERVING_PATCHED.replace(MARK, "# a comment:"), None)
    assert not is_applied(FLUSH_UPSTREAM, None)  # upstream's own fix is not our patch


@pytest.mark.parametrize(
    "parser_module, fixed",
    [
        pytest.param(FLUSH_UPSTREAM, True, id="0.25-flush"),
        pytest.param(FLUSH_UPSTREAM.replace("except HarmonyError:", "except ValueError:"), False, id="other-error"),
        pytest.param(FLUSH_UPSTREAM.replace("process_eos()", "reset()"), False, id="no-process-eos"),
        pytest.param(PARSER, False, id="0.24-no-flush"),
        pytest.param(PARSER_PATCHED, False, id="our-patch"),
        pytest.param(None, False, id="no-parser-module-before-0.24"),
    ],
)
def test_fixed_upstream_when_flush_recovers_from_process_eos(parser_module, fixed, fake_package):
    reason = fixed_upstream(fake_package({PARSER_TARGET: parser_module} if parser_module else {}))
    assert bool(reason) is fixed
    if fixed:
        assert "vllm#47062" in reason


def test_status_at_0_25_0_looks_for_the_upstream_flush(tmp_path):
    fixed = status_on_fake_site(tmp_path / "fixed", "0.25.0", {PARSER_TARGET: FLUSH_UPSTREAM})[SPEC.id]
    missing = status_on_fake_site(tmp_path / "missing", "0.25.0", {PARSER_TARGET: PARSER})[SPEC.id]
    assert fixed[0] == "fixed-upstream" and "vllm#47062" in fixed[1]
    assert missing[0] == "drifted"


RELEASES = [pytest.param(str(v), id=f"vllm-{v}") for v in KNOWN_RELEASES]


@pytest.mark.upstream
@pytest.mark.parametrize("version", RELEASES)
def test_the_parse_without_an_end_of_output_flush_lives_in_the_bands_target(version):
    parser_module = wheel_source(version, f"vllm/{PARSER_TARGET}") or ""
    harmony_utils = wheel_source(version, "vllm/entrypoints/openai/parser/harmony_utils.py") or ""
    if Version(version) >= Version("0.25"):
        assert "def flush(" in parser_module and "process_eos()" in parser_module
        return
    band = SPEC.band_for(Version(version))
    assert band is not None
    source = wheel_source(version, f"vllm/{band.target}") or ""
    assert all("process_eos" not in text for text in (source, parser_module, harmony_utils))  # nothing ends the output
    if band.target == SERVING_TARGET:
        assert source.count("reasoning, content, _ = parse_chat_output(token_ids)") == 1
    else:
        assert source.count("self.current_channel is not None") == 1


@pytest.mark.upstream
@pytest.mark.parametrize("version", ["0.15.1", "0.17.1", "0.23.0", "0.24.0"])
def test_apply_is_idempotent_and_revert_restores_the_real_file(version, tmp_path):
    round_trip_on_the_real_file(SPEC, is_applied, version, tmp_path)


# -- behaviour: the real generator, stock and patched with the default set, against stock 0.25.0 ------------

FIXING_RELEASE = "0.25.0"  # HarmonyParser.flush(): the answers the patched releases must give
STOCK_RELEASES = ("0.17.1", "0.23.0", "0.24.0")  # both bands, both ends of the first
HARNESS_RELEASES = (*STOCK_RELEASES, FIXING_RELEASE)  # the CPU harness venvs it builds (tests/support/prewarm.py)


@pytest.fixture(scope="module")
@needs("harness")
def fixing_release(chat_outputs) -> dict:
    return chat_outputs(harness.cpu_venv(FIXING_RELEASE))


@pytest.fixture(scope="module", params=STOCK_RELEASES)
@needs("harness")
def stock_and_patched(request, applied, chat_outputs) -> tuple[dict, dict]:
    """Stock and after a plain `apply` (tests/conftest.py: the same runs tests/test_equivalence.py reads)."""
    return chat_outputs(harness.cpu_venv(request.param)), chat_outputs(applied(request.param))


@pytest.mark.harness
@pytest.mark.parametrize("case", chat_output.NON_TERMINAL)
def test_stock_drops_the_unfinished_message_and_patched_returns_the_0_25_0_answer(
    stock_and_patched, fixing_release, case
):
    stock, patched = stock_and_patched
    for tool_parser in chat_output.TOOL_PARSERS:
        key = f"{case}/{tool_parser}"
        answer, upstream = patched["results"][key], fixing_release["results"][key]
        assert stock["results"][key]["content"] != upstream["content"], key  # the check can fail: G44 on stock
        assert "<|channel|>final" in upstream["content"] and upstream["finish_reason"] == "stop"
        assert {k: answer[k] for k in ("status", "content", "finish_reason", "completion_tokens")} == {
            k: upstream[k] for k in ("status", "content", "finish_reason", "completion_tokens")
        }, key
    assert "gptoss-patch harmony_final_flush: the harmony parser ended in a non-terminal state" in patched["log"]


@pytest.mark.harness
def test_outputs_that_end_cleanly_answer_as_stock(stock_and_patched):
    stock, patched = stock_and_patched
    for case in set(chat_output.OUTPUT_TABLE) - set(chat_output.NON_TERMINAL):
        for tool_parser in chat_output.TOOL_PARSERS:
            key = f"{case}/{tool_parser}"
            assert patched["results"][key] == stock["results"][key], key
            if stock["vllm"] != "0.24.0":  # one request, two choices: 0.24.0's own bug (below)
                assert patched["results"][f"{key}/n2"] == stock["results"][f"{key}/n2"], key


@pytest.mark.harness
def test_two_choices_parse_each_from_a_fresh_parser_as_0_25_0(stock_and_patched, fixing_release):
    """n=2: 0.24.0's one HarmonyParser per request parses the second choice on top of the first (HarmonyError, a
    500); 0.25.0's flush() starts a fresh parser after each parse(), and so does the patch's."""
    stock, patched = stock_and_patched
    for case in chat_output.OUTPUT_TABLE:
        for tool_parser in chat_output.TOOL_PARSERS:
            key = f"{case}/{tool_parser}/n2"
            assert patched["results"][key] == fixing_release["results"][key], key
    if stock["vllm"] == "0.24.0":
        assert "HarmonyError" in stock["results"]["complete/none/n2"]["raised"]
