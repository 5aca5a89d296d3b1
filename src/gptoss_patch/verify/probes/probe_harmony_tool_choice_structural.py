"""Probe for harmony_tool_choice_structural: required/named tool_choice must constrain gpt-oss to a tool call (G52).

A Chat Completions request with two tools goes through the installed HarmonyParser.adjust_request; its structural
tag is compiled with the installed xgrammar and harmony strings are checked against it, as vLLM 0.27.0's own
TestAdjustRequest does: after an analysis message, a call in either header order gpt-oss and openai_harmony write
(channel first, recipient first) is admitted; a final prose message, arguments that break the tool's schema and, for
a named choice, a call of the other tool are not. The request must also carry the per-request flag that makes vLLM
apply the grammar from the first token. HarmonyParser needs a tokenizer to build, which the patched method never
reads, so the probe calls it on an instance made without one: 0.24.0-0.26.x only (0.27.0's method is upstream's).
"""

import importlib

from _builder import NoBuilder
from _common import vllm_release

REQUIRES = ("vllm", "xgrammar", "openai_harmony")
ANALYSIS = "<|channel|>analysis<|message|>Let me check.<|end|><|start|>assistant"
CALL = '{"city": "Paris"}<|call|>'
SAMPLES = {  # name: (text after the analysis message, admitted for `required`, admitted for a named get_weather)
    "channel-first call": ("<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>" + CALL, True, True),
    "recipient-first call": (" to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>" + CALL, True, True),
    "call of the other tool": ("<|channel|>commentary to=functions.ping <|constrain|>json<|message|>{}<|call|>", True, False),
    "final prose": ("<|channel|>final<|message|>It is sunny in Paris.<|end|>", False, False),
    "arguments against the schema": (
        "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>" + '{"town": 1}<|call|>', False, False),
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}},
]
CHOICES = {"required": "required", "named get_weather": {"type": "function", "function": {"name": "get_weather"}}}


def run(verbose):
    release = vllm_release()
    if release is None or not (0, 24) <= release[:2] < (0, 27):
        raise NoBuilder("the probe calls HarmonyParser.adjust_request of vLLM 0.24.0-0.26.x (before 0.24.0 there is no "
                        "HarmonyParser; from 0.27.0 the method is upstream's, which `status` reports as fixed-upstream)")
    from vllm.parser.harmony import HarmonyParser

    if "adjust_request" not in vars(HarmonyParser):
        return {"passed": False, "evidence": "HarmonyParser has no adjust_request of its own: required and named "
                                             "tool_choice are not constrained (G52)"}
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    # by name: xgrammar is the target's (vLLM's dependency), not installed where gptoss-patch is type-checked
    xgrammar = importlib.import_module("xgrammar")
    accepts = importlib.import_module("xgrammar.testing")._is_grammar_accept_string

    wrong, lines = [], []
    for column, (label, choice) in enumerate(CHOICES.items(), start=1):
        request = ChatCompletionRequest(model="gpt-oss", messages=[{"role": "user", "content": "Weather in Paris?"}],
                                        tools=TOOLS, tool_choice=choice)
        request = HarmonyParser.adjust_request(object.__new__(HarmonyParser), request)
        tag = request.structured_outputs.structural_tag if request.structured_outputs else None
        if tag is None or not request._grammar_from_tool_parser:
            return {"passed": False, "evidence": f"{label}: no structural tag, or the per-request flag unset: the "
                                                 "grammar would not apply from the first token"}
        grammar = xgrammar.Grammar.from_structural_tag(tag)
        for name, sample in SAMPLES.items():
            admitted = accepts(grammar, ANALYSIS + sample[0], require_termination=False)
            lines.append(f"{label}, {name}: {'admitted' if admitted else 'rejected'}")
            if admitted is not sample[column]:
                wrong.append(lines[-1])
    if wrong:
        return {"passed": False, "evidence": "the tag admits the wrong harmony: " + "; ".join(wrong)}
    return {
        "passed": True,
        "evidence": "required and a named tool: analysis, then only a call of an allowed tool with schema-valid "
                    "arguments (both header orders); no final prose; the grammar applies from the first token",
        "detail": "\n".join(lines) if verbose else "",
    }
