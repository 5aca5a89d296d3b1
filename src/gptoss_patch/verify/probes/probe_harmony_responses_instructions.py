"""Probe for harmony_responses_instructions: where does the installed Responses builder put `instructions`?

Expected (vllm#44330, and our backport): a request with `instructions` and no tools, and one whose input
starts with a system item, carry the text under the developer message's `# Instructions` with
VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS unset, and in vLLM's system message with it at 1; the system
item never replaces the model identity (the G03 bug: unset, stock renders `instructions` nowhere).
"""

from _builder import ResponsesBuilder, sections
from _common import EnvVar

REQUIRES = ("vllm", "torch", "openai_harmony")
FLAG = "VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS"
TEXT = "Always answer like a pirate."
IDENTITY = "You are ChatGPT"
REQUESTS = {
    "instructions": {"instructions": TEXT, "input": "hi"},
    "system item": {"input": [{"type": "message", "role": "system", "content": TEXT}, {"type": "message", "role": "user", "content": "hi"}]},
}
SETTINGS = ((None, " unset"), ("1", "=1"))


def run(verbose):
    builder = ResponsesBuilder()
    problems, rendered = [], []
    for value, label in SETTINGS:
        for name, fields in REQUESTS.items():
            with EnvVar(FLAG, value):
                text = builder.decode(builder.build(builder.request(fields)))
            problems += [f"{FLAG}{label}, {name}: {p}" for p in check(sections(text), to_system=value == "1")]
            rendered.append(f"--- {FLAG}{label}, {name}\n{text}")
    detail = "\n".join(rendered) if verbose else ""
    if problems:
        return {"passed": False, "evidence": "; ".join(problems), "detail": detail}
    evidence = (
        "Responses `instructions` and a leading system item under the developer # Instructions when unset, "
        "in vLLM's system message after the model identity with =1"
    )
    return {"passed": True, "evidence": evidence, "detail": detail}


def check(parts, to_system):
    systems = [body for role, body in parts if role == "system"]
    developers = [body for role, body in parts if role == "developer"]
    problems = []
    if len(systems) != 1:
        return [f"{len(systems)} system messages, expected one"]
    if not systems[0].startswith(IDENTITY):
        problems.append("the model identity was replaced")
    if to_system:
        if TEXT not in systems[0]:
            problems.append("the text is not in vLLM's system message")
        if any(TEXT in body for body in developers):
            problems.append("the text is in a developer message")
    else:
        if not any("# Instructions\n\n" + TEXT in body for body in developers):
            problems.append("no developer message carries the text under # Instructions")
        if TEXT in systems[0]:
            problems.append("the text is in vLLM's system message")
    return problems
