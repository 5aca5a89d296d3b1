"""Probe for harmony_instructions: where does the installed builder put a client system message?

Expected (vllm#44330, and our backport): with VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS=1 the text is
in vLLM's own system message; unset, it is under the developer message's `# Instructions`; and in
both cases no raw client system message follows the built-in one (the G02 bug).
"""

from _builder import Builder, sections
from _common import EnvVar

REQUIRES = ("vllm", "torch", "openai_harmony")
FLAG = "VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS"
TEXT = "Always answer like a pirate."
MESSAGES = [{"role": "system", "content": TEXT}, {"role": "user", "content": "hi"}]
SETTINGS = ((None, " unset"), ("1", "=1"))


def run(verbose):
    builder = Builder()
    problems, seen, rendered = [], [], []
    for value, label in SETTINGS:
        with EnvVar(FLAG, value):
            text = builder.decode(builder.build(builder.request({"messages": MESSAGES})))
        parts = sections(text)
        seen.append("{}{}: {}".format(FLAG, label, ", ".join(role for role, _ in parts)))
        problems += [f"{FLAG}{label}: {p}" for p in check(parts, to_system=value == "1")]
        rendered.append(f"--- {FLAG}{label}\n{text}")
    detail = "\n".join(rendered) if verbose else ""
    if problems:
        return {"passed": False, "evidence": "; ".join(problems), "detail": detail}
    evidence = (
        "client system text under the developer # Instructions when unset, in vLLM's system message with =1, "
        "no second system message ({})".format("; ".join(seen))
    )
    return {"passed": True, "evidence": evidence, "detail": detail}


def check(parts, to_system):
    roles = [role for role, _ in parts]
    systems = [body for role, body in parts if role == "system"]
    developers = [body for role, body in parts if role == "developer"]
    problems = []
    if len(systems) != 1:
        raw = any(TEXT in body for body in systems[1:])
        what = "the client's text is a raw system message after vLLM's own" if raw else "expected exactly one"
        problems.append("{} system messages ({}): {}".format(len(systems), ", ".join(roles), what))
    builtin = systems[0] if systems else ""
    if to_system:
        if TEXT not in builtin:
            problems.append("the client's text is not in vLLM's system message")
        if any(TEXT in body for body in developers):
            problems.append("the client's text is in a developer message")
    else:
        if not any("# Instructions\n\n" + TEXT in body for body in developers):
            problems.append("no developer message carries the client's text under # Instructions")
        if TEXT in builtin:
            problems.append("the client's text is in vLLM's system message")
    return problems
