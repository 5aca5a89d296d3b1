"""Generated gpt-oss outputs through the real non-streaming Chat Completions generator of a harness venv.

`parse_table(python)` feeds each harmony string of OUTPUT_TABLE, as token ids, to the installed
`OpenAIServingChat.chat_completion_full_generator` (a server object made without an engine: object.__new__ and
the attributes the generator reads; a stand-in RequestOutput with finish_reason "stop") and returns what the
client gets per case and tool parser: status, content, reasoning, finish_reason, completion_tokens; under
`<case>/<tool parser>/n2` the same output as the two choices of one request (`n: 2`). 0.24.0 on,
the generator parses through the release's HarmonyParser (with the `openai_gptoss` reasoning parser, as a
server started with `--reasoning-parser openai_gptoss`); before, through parse_chat_output and the `openai`
tool parser. The tokenizer is the tiny gpt-oss's (o200k_base with harmony's special tokens at harmony's ids),
which vLLM 0.25.0's HarmonyParser.flush() decodes a recovered tail with.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support import harness, tiny_model

# Harmony strings a model generates after the prompt's `<|start|>assistant`. The malformed final turn of
# vllm#45736 (a `final` header with no `<|message|>`), alone and after completed messages; vLLM 0.25.0's own
# test output (tests/parser/test_harmony.py, malformed_msgs_str); an output cut off inside a header; controls
# that end cleanly or inside a message's content.
OUTPUT_TABLE = {
    "malformed_final": "<|channel|>final The answer is 42.<|return|>",
    "malformed_final_after_reasoning": (
        "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final The answer is 42.<|return|>"
    ),
    "malformed_final_after_preamble": (
        "<|channel|>analysis<|message|>thinking<|end|>"
        "<|start|>assistant<|channel|>commentary<|message|>thinking<|end|>"
        '<|start|>assistant<|channel|>final {"answer": "hi"}<|return|>'
    ),
    "cut_inside_header": "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final",
    "cut_inside_content": "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Half",
    "complete": "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>42<|return|>",
}
# The cases whose output ends inside a message header: the ones vllm#45736 and vllm#47062 are about.
NON_TERMINAL = (
    "malformed_final",
    "malformed_final_after_reasoning",
    "malformed_final_after_preamble",
    "cut_inside_header",
)
TOOL_PARSERS = ("none", "openai")

DRIVER = r"""
import asyncio, inspect, json, os, sys
from transformers import AutoTokenizer
from vllm.entrypoints.openai.chat_completion import serving
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.parser.harmony_utils import get_encoding

TOKENIZER = AutoTokenizer.from_pretrained(os.environ["GPTOSS_TINY_MODEL"])
TABLE, TOOL_PARSERS = json.loads(sys.stdin.read())


class Anything:
    # RequestOutput / CompletionOutput / request metadata: what the generator reads, None for the rest.
    def __init__(self, **fields):
        self.__dict__.update(fields)

    def __getattr__(self, name):
        return None


def server(tool_parser):
    # Attributes the constructor would set; any other one reads None (no logger, no usage extras).
    cls = type("Chat", (serving.OpenAIServingChat,), {"__getattr__": lambda self, name: None})
    s = object.__new__(cls)
    s.use_harmony, s.enable_auto_tools, s.response_role = True, False, "assistant"
    s.tool_call_id_type, s.default_sampling_params, s.tool_parser, s.parser_cls = "random", {}, None, None
    try:
        from vllm.parser.parser_manager import ParserManager
        from vllm.parser.harmony import HarmonyParser  # noqa: F401 (0.24.0 on)
        s.parser_cls = ParserManager.get_parser(tool_parser_name=tool_parser, reasoning_parser_name="openai_gptoss",
                                                enable_auto_tools=False, model_name="openai/gpt-oss-20b", is_harmony=True)
    except ImportError:
        if tool_parser:
            from vllm.tool_parsers import ToolParserManager
            s.tool_parser = ToolParserManager.get_tool_parser(tool_parser)
    return s


async def answer(text, tool_parser, n):
    s = server(tool_parser)
    ids = get_encoding().encode(text, allowed_special="all")
    outputs = [Anything(index=i, token_ids=ids, text="", finish_reason="stop") for i in range(n)]
    final = Anything(outputs=outputs, prompt_token_ids=[1, 2, 3], num_cached_tokens=0)

    async def results():
        yield final

    kwargs = dict(request=ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}]),
                  result_generator=results(), request_id="r", model_name="m", conversation=[], tokenizer=TOKENIZER,
                  request_metadata=Anything())
    accepted = inspect.signature(s.chat_completion_full_generator).parameters
    if "parser" in accepted and s.parser_cls is not None:
        kwargs["parser"] = s.parser_cls(TOKENIZER, None)
    response = await s.chat_completion_full_generator(**kwargs)
    if not hasattr(response, "choices"):
        error = getattr(response, "error", response)
        return {"status": getattr(error, "code", None), "message": getattr(error, "message", str(error))}
    choices = [{"content": c.message.content, "reasoning": c.message.reasoning, "finish_reason": c.finish_reason}
               for c in response.choices]
    if n > 1:
        return {"status": 200, "choices": choices}
    return {"status": 200, **choices[0], "completion_tokens": response.usage.completion_tokens}


out = {}
for name, text in TABLE.items():
    for tool_parser in TOOL_PARSERS:
        for n, suffix in ((1, ""), (2, "/n2")):
            key = f"{name}/{tool_parser}{suffix}"
            try:
                out[key] = asyncio.run(answer(text, None if tool_parser == "none" else tool_parser, n))
            except Exception as exc:  # a 500 in the server
                out[key] = {"raised": f"{type(exc).__name__}: {exc}"}
print("RESULT " + json.dumps(out))
"""


def offline_env(python: Path) -> dict[str, str]:
    """The environment of a script in harness venv `python` that loads the tiny gpt-oss's tokenizer (its path in
    GPTOSS_TINY_MODEL) and the venv's own harmony vocabulary, offline, with none of the caller's vLLM settings."""
    env = {k: v for k, v in harness.script_env(python).items() if not k.startswith("HF_")}
    env.update(
        GPTOSS_TINY_MODEL=str(tiny_model.tiny_model(python, prefix="upstream-")),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    return env


def parse_table(python: Path, table: dict[str, str] = OUTPUT_TABLE) -> dict[str, Any]:
    """{"vllm": version, "results": {"case/tool_parser": answer}, "log": its output} from `python`'s generator."""
    results, log = harness.script_result(python, DRIVER, env=offline_env(python), stdin=json.dumps([table, TOOL_PARSERS]))
    return {
        "vllm": harness.installed_vllm(python),
        "results": results,
        "log": log,
    }  # vLLM's logger writes to stdout
