"""The chat requests whose rendered gpt-oss prompts the equivalence tests compare, in-process and on real servers."""

from __future__ import annotations

from typing import Any

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
    # The case: a client's system persona, then its developer instructions. Under the flag (1)
    # stock 0.23.0 puts the system text into the system message and emits an EMPTY developer message:
    # the French instruction is lost. Unset, both land in the developer message's instructions.
    "system_then_developer": {
        "messages": [
            {"role": "system", "content": PIRATE},
            {"role": "developer", "content": "Answer in French."},
            {"role": "user", "content": "hi"},
        ]
    },
    "system_after_developer": {
        "messages": [
            {"role": "developer", "content": "Answer in French."},
            {"role": "system", "content": PIRATE},
            {"role": "user", "content": "hi"},
        ]
    },
    "two_developer": {
        "messages": [
            {"role": "developer", "content": "Answer in French."},
            {"role": "developer", "content": "Keep answers under ten words."},
            {"role": "user", "content": "hi"},
        ]
    },
    "system_developer_tools": {
        "messages": [
            {"role": "system", "content": PIRATE},
            {"role": "developer", "content": "Answer in French."},
            {"role": "user", "content": "Weather in Paris?"},
        ],
        "tools": [WEATHER_TOOL],
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
