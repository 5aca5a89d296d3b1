"""Patched vLLM 0.17.1 (and 0.22.1) render gpt-oss chat prompts token-for-token like stock 0.23.0 (vllm#44330).

Every request of TABLE goes through the installed `_make_request_with_harmony` of CPU harness venvs
(stock 0.17.1; 0.17.1 and 0.22.1 patched with harmony_instructions, i.e. both bands of the patch:
OpenAIServingChat and OpenAIServingRender; stock 0.23.0), under both settings of
VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS, with VLLM_SYSTEM_START_DATE pinned.
"""

from __future__ import annotations

import difflib
from typing import Any

import pytest

from tests import harness

PIRATE = "You are a pirate. Answer every question like one."
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TOOL_CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}

TABLE: dict[str, dict[str, Any]] = {
    "no_system": {"messages": [{"role": "user", "content": "What is 2 + 2?"}]},
    "system_user": {"messages": [{"role": "system", "content": PIRATE}, {"role": "user", "content": "hi"}]},
    "developer_user": {"messages": [{"role": "developer", "content": "Answer in French."}, {"role": "user", "content": "hi"}]},
    "system_tools": {
        "messages": [{"role": "system", "content": PIRATE}, {"role": "user", "content": "Weather in Paris?"}],
        "tools": [WEATHER_TOOL],
    },
    "tools_no_system": {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER_TOOL]},
    "two_system": {
        "messages": [
            {"role": "system", "content": PIRATE},
            {"role": "system", "content": "Keep answers under ten words."},
            {"role": "user", "content": "hi"},
        ]
    },
    "system_after_assistant": {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "system", "content": "From now on, answer in French."},
            {"role": "user", "content": "What is the capital of Italy?"},
        ]
    },
    "developer_after_system": {
        "messages": [
            {"role": "system", "content": PIRATE},
            {"role": "developer", "content": "Never mention treasure."},
            {"role": "user", "content": "hi"},
        ]
    },
    "content_parts": {
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "You are a pirate. "}, {"type": "text", "text": "Say arr."}]},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        ]
    },
    "empty_system": {"messages": [{"role": "system", "content": ""}, {"role": "user", "content": "hi"}]},
    "reasoning_effort": {
        "messages": [{"role": "system", "content": PIRATE}, {"role": "user", "content": "hi"}],
        "reasoning_effort": "high",
    },
    "tool_round_trip": {
        "messages": [
            {"role": "system", "content": PIRATE},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"},
        ],
        "tools": [WEATHER_TOOL],
    },
}
SETTINGS = ("unset", "1")
PATCHED_VERSIONS = ("0.17.1", "0.22.1")  # one per band of harmony_instructions


@pytest.fixture(scope="module")
def upstream() -> dict[str, Any]:
    return harness.render_table(harness.cpu_venv("0.23.0"), TABLE, settings=SETTINGS)


@pytest.fixture(scope="module")
def stock() -> dict[str, Any]:
    return harness.render_table(harness.cpu_venv("0.17.1"), TABLE, settings=SETTINGS)


@pytest.fixture(scope="module", params=[pytest.param(v, id=f"vllm-{v}") for v in PATCHED_VERSIONS])
def patched(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    python = harness.clone_venv(harness.cpu_venv(request.param), tmp_path_factory.mktemp("eq") / "venv")
    harness.apply_patches(python, ["harmony_instructions"])
    return harness.render_table(python, TABLE, settings=SETTINGS)


def rendered(payload: dict[str, Any], setting: str, case: str) -> dict[str, Any]:
    got = payload["results"][setting][case]
    assert "error" not in got, f"vllm {payload['vllm']} could not render {case}: {got['error']}"
    return got


def explain(a: dict[str, Any], b: dict[str, Any]) -> str:
    ours, theirs = f"patched {a['vllm']}", "stock 0.23.0"
    return "\n".join(difflib.unified_diff(a["text"].split("<|"), b["text"].split("<|"), ours, theirs, lineterm=""))


@pytest.mark.harness
@pytest.mark.parametrize("setting", [pytest.param(s, id=f"flag-{s}") for s in SETTINGS])
@pytest.mark.parametrize("case", [pytest.param(name, id=name) for name in TABLE])
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

