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

# Upstream-style Chat Completions cases the in-process equivalence table adds to TABLE (the real-server
# tests keep TABLE): arrays of content parts, system/developer combinations with tools, an empty developer message.
MORE_CHAT: dict[str, dict[str, Any]] = {
    "developer_content_parts": {
        "messages": [
            {"role": "developer", "content": [{"type": "text", "text": "Rule 1."}, {"type": "text", "text": "Rule 2."}]},
            {"role": "user", "content": "hi"},
        ]
    },
    "system_parts_then_developer_parts": {
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": PIRATE}]},
            {"role": "developer", "content": [{"type": "text", "text": "Answer in French."}]},
            {"role": "user", "content": [{"type": "text", "text": "Part one. "}, {"type": "text", "text": "Part two."}]},
        ]
    },
    "developer_tools": {
        "messages": [{"role": "developer", "content": "Answer in French."}, {"role": "user", "content": "Weather in Paris?"}],
        "tools": [WEATHER_TOOL],
    },
    "developer_after_system_tools": {
        "messages": [
            {"role": "system", "content": PIRATE},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "developer", "content": "Use Celsius."},
        ],
        "tools": [WEATHER_TOOL],
    },
    "empty_developer": {"messages": [{"role": "developer", "content": ""}, {"role": "user", "content": "hi"}]},
    # `"tool_calls": null` in the history (issue #25): an assistant's (vLLM turns it into [] before the builder)
    # and a leading system message's (0.23.0 peels that message off before it looks at tool calls).
    "assistant_tool_calls_null": {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "Arr, hello.", "tool_calls": None},
            {"role": "user", "content": "Weather in Paris?"},
        ],
        "tools": [WEATHER_TOOL],
    },
    "system_tool_calls_null": {
        "messages": [{"role": "system", "content": PIRATE, "tool_calls": None}, {"role": "user", "content": "hi"}]
    },
}
EQUIVALENCE_TABLE = {**TABLE, **MORE_CHAT}

# Responses API requests (ResponsesRequest fields) rendered through OpenAIServingResponses: `instructions`,
# and system/developer input items (strings and arrays of input_text parts), with and without tools.
RESPONSES_WEATHER_TOOL = {"type": "function", **WEATHER_TOOL["function"]}
FRENCH = "Answer in French."


def _item(role: str, content: Any) -> dict[str, Any]:
    return {"type": "message", "role": role, "content": content}


# A reasoning item as a client sends it back, with two summary and two content parts (harmony_responses_channels, G53).
TWO_PART_REASONING = {
    "type": "reasoning", "id": "rs_1",
    "summary": [{"type": "summary_text", "text": "Adding."}, {"type": "summary_text", "text": "It is 4."}],
    "content": [{"type": "reasoning_text", "text": "2 + 2 is 4."}, {"type": "reasoning_text", "text": "Answer 4."}],
}


RESPONSES_TABLE: dict[str, dict[str, Any]] = {
    "no_instructions": {"input": "What is 2 + 2?"},
    "instructions": {"instructions": PIRATE, "input": "hi"},
    "instructions_items": {"instructions": PIRATE, "input": [_item("user", "hi")]},
    "instructions_tools": {"instructions": PIRATE, "input": "Weather in Paris?", "tools": [RESPONSES_WEATHER_TOOL]},
    "tools_no_instructions": {"input": "Weather in Paris?", "tools": [RESPONSES_WEATHER_TOOL]},
    "system_item": {"input": [_item("system", PIRATE), _item("user", "hi")]},
    "developer_item": {"input": [_item("developer", FRENCH), _item("user", "hi")]},
    "system_item_no_type": {"input": [{"role": "system", "content": PIRATE}, {"role": "user", "content": "hi"}]},
    "system_then_developer_items": {"input": [_item("system", PIRATE), _item("developer", FRENCH), _item("user", "hi")]},
    "developer_then_system_items": {"input": [_item("developer", FRENCH), _item("system", PIRATE), _item("user", "hi")]},
    "two_system_items": {"input": [_item("system", PIRATE), _item("system", "Keep answers short."), _item("user", "hi")]},
    "instructions_and_system_item": {"instructions": "Be brief.", "input": [_item("system", PIRATE), _item("user", "hi")]},
    "instructions_and_developer_item": {"instructions": "Be brief.", "input": [_item("developer", FRENCH), _item("user", "hi")]},
    "system_item_later": {"input": [_item("user", "hi"), _item("system", "From now on, answer in French."), _item("user", "Capital of Italy?")]},
    "content_parts_items": {
        "input": [
            _item("system", [{"type": "input_text", "text": "You are a pirate. "}, {"type": "input_text", "text": "Say arr."}]),
            _item("developer", [{"type": "input_text", "text": "Rule 1."}, {"type": "input_text", "text": "Rule 2."}]),
            _item("user", [{"type": "input_text", "text": "Part one. "}, {"type": "input_text", "text": "Part two."}]),
        ]
    },
    "empty_system_item": {"input": [_item("system", ""), _item("user", "hi")]},
    "empty_developer_item_later": {"input": [_item("user", "hi"), _item("developer", "")]},
    "system_item_tools": {"input": [_item("system", PIRATE), _item("user", "Weather in Paris?")], "tools": [RESPONSES_WEATHER_TOOL]},
    "instructions_reasoning_effort": {"instructions": PIRATE, "input": "hi", "reasoning": {"effort": "high"}},
    # An earlier answer sent back as an assistant item, with a refusal part (no `text`): 0.23.0 reads it as empty
    # text; stock 0.15.1-0.22.x raise KeyError (a 500) unless harmony_responses_input is applied (issue #25).
    "assistant_refusal_item": {
        "input": [
            _item("user", "hi"),
            {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
             "content": [{"type": "output_text", "text": "Arr.", "annotations": []},
                         {"type": "refusal", "refusal": "I can't help with that."}]},
            _item("user", "Why not?"),
        ]
    },
    "function_call_round_trip": {
        "instructions": PIRATE,
        "input": [
            _item("user", "Weather in Paris?"),
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "Sunny, 21 C"},
        ],
        "tools": [RESPONSES_WEATHER_TOOL],
    },
    # The reasoning item of an earlier turn sent back before its function call: on `analysis` from 0.18.0 (two parts
    # joined), and the tool output `to=assistant` on `commentary` from 0.22.0 (harmony_responses_channels before).
    "reasoning_function_call_round_trip": {
        "input": [
            _item("user", "Weather in Paris?"),
            {"type": "reasoning", "id": "rs_1", "summary": [],
             "content": [{"type": "reasoning_text", "text": "The user wants the weather."},
                         {"type": "reasoning_text", "text": "I should call get_weather."}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "Sunny, 21 C"},
        ],
        "tools": [RESPONSES_WEATHER_TOOL],
    },
    # Reasoning items as clients send them back (harmony_responses_channels, G53): two summary parts beside two content
    # parts (only the content is rendered, joined on `analysis`; before a final answer the builder drops it, last it
    # stays), and items with empty or no content, which 0.18.0 on skips (stock 0.15.1-0.17.x fail the request on
    # `assert len(content) == 1` or a KeyError).
    "reasoning_two_parts_last": {
        "input": [
            _item("user", "What is 2 + 2?"),
            TWO_PART_REASONING,
        ]
    },
    "reasoning_two_parts_then_answer": {
        "input": [
            _item("user", "What is 2 + 2?"),
            TWO_PART_REASONING,
            {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
             "content": [{"type": "output_text", "text": "4", "annotations": []}]},
            _item("user", "And 3 + 3?"),
        ]
    },
    "reasoning_empty_content": {
        "input": [
            _item("user", "What is 2 + 2?"),
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Adding."}], "content": []},
            _item("user", "And 3 + 3?"),
        ]
    },
    "reasoning_without_content": {
        "input": [_item("user", "What is 2 + 2?"), {"type": "reasoning", "id": "rs_1", "summary": []}, _item("user", "hi")]
    },
    "function_call_empty_output": {
        "input": [
            _item("user", "Weather in Paris?"),
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": ""},
        ],
        "tools": [RESPONSES_WEATHER_TOOL],
    },
}
