"""Patched vLLM 0.17.1 (and 0.22.1) render gpt-oss prompts token-for-token like stock 0.23.0 (vllm#44330).

Every request of EQUIVALENCE_TABLE goes through the installed Chat Completions `_make_request_with_harmony`
of CPU harness venvs (stock 0.17.1; 0.17.1 and 0.22.1 patched with the default set, which holds both bands
of harmony_instructions: OpenAIServingChat and OpenAIServingRender; stock 0.23.0), and every request of
RESPONSES_TABLE through OpenAIServingResponses' (harmony_responses_instructions), under both settings of
VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS, with VLLM_SYSTEM_START_DATE pinned. Opt-in patches are left
out, as `apply` leaves them out: the claim is about what a plain `apply` gives. The harmony_final_flush rows (at the
end) compare generated outputs instead: what the non-streaming generator answers, against stock 0.25.0.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support import chat_output, harness
from tests.support.chat_cases import EQUIVALENCE_TABLE, PIRATE, RESPONSES_TABLE, SETTINGS
from tests.support.markers import needs

PATCHED_VERSIONS = ("0.17.1", "0.22.1")  # one per band of harmony_instructions


@pytest.fixture(scope="module")
@needs("harness")
def upstream() -> dict[str, Any]:
    return harness.render_table(harness.cpu_venv("0.23.0"), EQUIVALENCE_TABLE, settings=SETTINGS)


@pytest.fixture(scope="module")
@needs("harness")
def stock() -> dict[str, Any]:
    return harness.render_table(harness.cpu_venv("0.17.1"), EQUIVALENCE_TABLE, settings=SETTINGS)


@pytest.fixture(scope="module", params=[pytest.param(v, id=f"vllm-{v}") for v in PATCHED_VERSIONS])
@needs("harness")
def patched_python(request: pytest.FixtureRequest, applied: Callable[[str], Path]) -> Path:
    return applied(request.param)  # tests/conftest.py: after a plain `apply`, shared with the final-flush tests


@pytest.fixture(scope="module")
def patched(patched_python: Path) -> dict[str, Any]:
    return harness.render_table(patched_python, EQUIVALENCE_TABLE, settings=SETTINGS)


@pytest.fixture(scope="module")
@needs("harness")
def upstream_responses() -> dict[str, Any]:
    return harness.render_table(harness.cpu_venv("0.23.0"), RESPONSES_TABLE, settings=SETTINGS, api="responses")


@pytest.fixture(scope="module")
@needs("harness")
def stock_responses() -> dict[str, Any]:
    return harness.render_table(harness.cpu_venv("0.17.1"), RESPONSES_TABLE, settings=SETTINGS, api="responses")


@pytest.fixture(scope="module")
def patched_responses(patched_python: Path) -> dict[str, Any]:
    return harness.render_table(patched_python, RESPONSES_TABLE, settings=SETTINGS, api="responses")


def rendered(payload: dict[str, Any], setting: str, case: str) -> dict[str, Any]:
    got = payload["results"][setting][case]
    assert "error" not in got, f"vllm {payload['vllm']} could not render {case}: {got['error']}"
    return got


def explain(a: dict[str, Any], b: dict[str, Any]) -> str:
    ours, theirs = f"patched {a['vllm']}", "stock 0.23.0"
    return "\n".join(difflib.unified_diff(a["text"].split("<|"), b["text"].split("<|"), ours, theirs, lineterm=""))


@pytest.mark.harness
@pytest.mark.parametrize("setting", [pytest.param(s, id=f"flag-{s}") for s in SETTINGS])
@pytest.mark.parametrize("case", [pytest.param(name, id=name) for name in EQUIVALENCE_TABLE])
def test_patched_prompt_ids_equal_stock_0230(patched: dict[str, Any], upstream: dict[str, Any], case: str, setting: str) -> None:
    ours, theirs = rendered(patched, setting, case), rendered(upstream, setting, case)
    assert ours["ids"] == theirs["ids"], explain(dict(ours, vllm=patched["vllm"]), theirs)


@pytest.mark.harness
def test_the_venvs_are_the_versions_compared(stock: dict[str, Any], upstream: dict[str, Any]) -> None:
    assert (stock["vllm"], upstream["vllm"]) == ("0.17.1", "0.23.0")
    assert stock["where"].endswith("OpenAIServingChat._make_request_with_harmony")
    assert upstream["where"].endswith("OpenAIServingRender._make_request_with_harmony")


@pytest.mark.harness
@pytest.mark.parametrize("setting", [pytest.param(s, id=f"flag-{s}") for s in SETTINGS])
def test_stock_0171_differs_from_0230_on_system_user(stock: dict[str, Any], upstream: dict[str, Any], setting: str) -> None:
    # The comparison can fail: without the patch, the client system text is a second system message.
    ours, theirs = rendered(stock, setting, "system_user"), rendered(upstream, setting, "system_user")
    assert ours["ids"] != theirs["ids"]
    assert f"<|start|>system<|message|>{PIRATE}<|end|>" in ours["text"]


@pytest.mark.harness
def test_stock_0171_already_matches_0230_without_system_messages(stock: dict[str, Any], upstream: dict[str, Any]) -> None:
    # Control: the table's differences come from system/developer handling, not from the versions.
    for setting in SETTINGS:
        for case in ("no_system", "tools_no_system"):
            assert rendered(stock, setting, case)["ids"] == rendered(upstream, setting, case)["ids"], (case, setting)



# Before 0.22.0 a function_call_output item has no `to=assistant` and no channel, and before 0.18.0 a reasoning item
# no channel (harmony_responses_channels gives both, as 0.22.0 does).
TOOL_OUTPUT_0230 = "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"
TOOL_OUTPUT_BEFORE_0220 = "<|start|>functions.get_weather<|message|>"
REASONING_0230 = "<|start|>assistant<|channel|>analysis<|message|>The user wants the weather.\nI should call get_weather.<|end|>"


@pytest.mark.harness
@pytest.mark.parametrize("setting", [pytest.param(s, id=f"flag-{s}") for s in SETTINGS])
@pytest.mark.parametrize("case", [pytest.param(name, id=name) for name in RESPONSES_TABLE])
def test_patched_responses_prompt_ids_equal_stock_0230(
    patched_responses: dict[str, Any], upstream_responses: dict[str, Any], case: str, setting: str
) -> None:
    ours, theirs = rendered(patched_responses, setting, case), rendered(upstream_responses, setting, case)
    assert ours["ids"] == theirs["ids"], explain(dict(ours, vllm=patched_responses["vllm"]), theirs)


@pytest.mark.harness
def test_stock_0171_renders_tool_outputs_and_reasoning_items_without_their_channels(
    stock_responses: dict[str, Any], upstream_responses: dict[str, Any]
) -> None:
    # The comparison can fail: stock 0.17.1 renders the tool output's header bare (G53); its reasoning item fails.
    ours, theirs = rendered(stock_responses, "unset", "function_call_round_trip"), rendered(upstream_responses, "unset", "function_call_round_trip")
    assert TOOL_OUTPUT_0230 in theirs["text"]
    assert ours["text"] == theirs["text"].replace(TOOL_OUTPUT_0230, TOOL_OUTPUT_BEFORE_0220)
    assert REASONING_0230 in rendered(upstream_responses, "unset", "reasoning_function_call_round_trip")["text"]
    assert "error" in stock_responses["results"]["unset"]["reasoning_function_call_round_trip"]


@pytest.mark.harness
def test_the_responses_builders_are_the_ones_compared(stock_responses: dict[str, Any], upstream_responses: dict[str, Any]) -> None:
    assert (stock_responses["vllm"], upstream_responses["vllm"]) == ("0.17.1", "0.23.0")
    for payload in (stock_responses, upstream_responses):
        assert payload["where"].endswith("OpenAIServingResponses._make_request_with_harmony")


@pytest.mark.harness
@pytest.mark.parametrize("setting", [pytest.param(s, id=f"flag-{s}") for s in SETTINGS])
def test_stock_0171_responses_differ_from_0230_on_a_system_item(
    stock_responses: dict[str, Any], upstream_responses: dict[str, Any], setting: str
) -> None:
    # The comparison can fail: stock drops a system item and makes its text the model identity (G03).
    ours, theirs = rendered(stock_responses, setting, "system_item"), rendered(upstream_responses, setting, "system_item")
    assert ours["ids"] != theirs["ids"]
    assert ours["text"].startswith(f"<|start|>system<|message|>{PIRATE}\n")


@pytest.mark.harness
def test_stock_0171_responses_ignore_instructions_without_tools(stock_responses: dict[str, Any], upstream_responses: dict[str, Any]) -> None:
    # G03 itself: unset, stock renders `instructions` nowhere; 0.23.0 puts them in the developer message.
    ours, theirs = rendered(stock_responses, "unset", "instructions"), rendered(upstream_responses, "unset", "instructions")
    assert PIRATE not in ours["text"]
    assert f"<|start|>developer<|message|># Instructions\n\n{PIRATE}" in theirs["text"]


# harmony_final_flush: generated outputs, not prompts. Each output of chat_output.OUTPUT_TABLE goes through the real
# non-streaming Chat Completions generator (tests/support/chat_output.py) of the patched venvs above and of stock
# 0.25.0, the release of vllm#47062: the client gets the same status, content, finish_reason and usage.
FINAL_FLUSH_FIELDS = ("status", "content", "finish_reason", "completion_tokens")


@pytest.fixture(scope="module")
@needs("harness")
def harmony_final_flush_upstream(chat_outputs: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
    return chat_outputs(harness.cpu_venv("0.25.0"))


@pytest.fixture(scope="module")
def harmony_final_flush_patched(patched_python: Path, chat_outputs: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
    return chat_outputs(patched_python)


@pytest.mark.harness
@pytest.mark.parametrize("tool_parser", chat_output.TOOL_PARSERS)
@pytest.mark.parametrize("case", [pytest.param(name, id=name) for name in chat_output.OUTPUT_TABLE])
def test_harmony_final_flush_patched_answer_equals_stock_0250(
    harmony_final_flush_patched: dict[str, Any], harmony_final_flush_upstream: dict[str, Any], case: str, tool_parser: str
) -> None:
    ours = harmony_final_flush_patched["results"][f"{case}/{tool_parser}"]
    theirs = harmony_final_flush_upstream["results"][f"{case}/{tool_parser}"]
    assert harmony_final_flush_upstream["vllm"] == "0.25.0"
    assert {k: ours.get(k) for k in FINAL_FLUSH_FIELDS} == {k: theirs.get(k) for k in FINAL_FLUSH_FIELDS}
    two = f"{case}/{tool_parser}/n2"  # the same output as both choices of one request
    assert harmony_final_flush_patched["results"][two] == harmony_final_flush_upstream["results"][two]
