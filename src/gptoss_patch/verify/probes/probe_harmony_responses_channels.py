"""Probe for harmony_responses_channels: which harmony channel does the installed converter give Responses input items?

Expected (vLLM 0.22.0, and our patch before it; G53): a function_call_output item renders as the tool's message to the
assistant on `commentary`, a reasoning item with two content parts as one assistant message on `analysis` (the parts
joined by a newline), and a reasoning item without content converts to None (the builder skips it). Stock 0.15.1-0.17.x
fail the reasoning items on `assert len(content) == 1` and, until 0.21.x, render the tool output without a channel.

The converter is called directly (parse_response_input in harmony_utils before 0.17.0, response_input_to_harmony in
responses/harmony.py from there): that function is what the patch rewrites, and it exists on every release from
0.15.1, where the Responses builder that calls it does not (0.30+ renders through OnlineRenderer).
"""

import importlib

from _builder import first_defining
from _common import exception_line

REQUIRES = ("vllm", "torch", "openai_harmony")
# (file under vllm/, module, function), newest first.
CONVERTERS = (
    ("entrypoints/openai/responses/harmony.py", "vllm.entrypoints.openai.responses.harmony", "response_input_to_harmony"),
    ("entrypoints/openai/parser/harmony_utils.py", "vllm.entrypoints.openai.parser.harmony_utils", "parse_response_input"),
)
CALL = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'}
TWO_PARTS = ("The user wants the weather.", "I should call get_weather.")
# name -> (input item, what vLLM 0.22.0's converter gives: the rendered message, or None for no message)
CASES: "dict[str, tuple[dict, str | None]]" = {
    "function_call_output": (
        {"type": "function_call_output", "call_id": "call_1", "output": "Sunny, 21 C"},
        "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>Sunny, 21 C<|end|>",
    ),
    "reasoning with two parts": (
        {"type": "reasoning", "id": "rs_1", "summary": [],
         "content": [{"type": "reasoning_text", "text": text} for text in TWO_PARTS]},
        "<|start|>assistant<|channel|>analysis<|message|>" + "\n".join(TWO_PARTS) + "<|end|>",
    ),
    "reasoning without content": ({"type": "reasoning", "id": "rs_2", "summary": [], "content": []}, None),
}


def run(verbose):
    where, module, convert = locate()
    from vllm.entrypoints.openai.parser.harmony_utils import get_encoding

    encoding = get_encoding()
    # What the builder collects from the function_call item before: the class the converter looks for (its own import).
    previous = [module.ResponseFunctionToolCall(**CALL)]
    problems, rendered = [], []
    for name, (item, expected) in CASES.items():
        try:
            message = convert(dict(item), previous)
        except Exception as exc:  # stock's assert on one content part: that case fails, the others still run
            problems.append(f"{name}: {exception_line(exc)}")
            continue
        got = None if message is None else encoding.decode_utf8(encoding.render(message))
        rendered.append(f"--- {name}\n{got}")
        if got != expected:
            problems.append(f"{name}: rendered {got!r}, expected {expected!r}")
    detail = "\n".join(rendered) if verbose else ""
    if problems:
        return {"passed": False, "evidence": f"{where}: " + "; ".join(problems), "detail": detail}
    evidence = (
        f"{where}: a function_call_output goes to=assistant on commentary, a reasoning item's two parts are one "
        "analysis message, a reasoning item without content is no message (as 0.22.0)"
    )
    return {"passed": True, "evidence": evidence, "detail": detail}


def locate():
    """(module.function, module, function) of the installed item converter, found by reading files before importing."""
    _relpath, module, function = first_defining(CONVERTERS)
    imported = importlib.import_module(module)
    return f"{module}.{function}", imported, getattr(imported, function)

