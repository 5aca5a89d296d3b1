"""Probe for harmony_reasoning_effort_none: can the effort map take `none` on Chat Completions?

Through the installed `_make_request_with_harmony` (as vLLM 0.33.0's --reasoning-effort-map): with
GPTOSS_PATCH_REASONING_EFFORT_MAP='{"none": "low"}' a request with `reasoning_effort: none` must render
`Reasoning: low`; a chained map ('{"none": "low", "low": "medium"}') must apply once (still low); and with
'{}' `none` must be rejected as on stock ("Harmony does not support reasoning_effort='none'").
"""

import re

from _builder import Builder, NoBuilder
from _common import EnvVar, exception_line, vllm_release

REQUIRES = ("vllm", "torch", "openai_harmony")
ENV = "GPTOSS_PATCH_REASONING_EFFORT_MAP"
MESSAGES = [{"role": "user", "content": "hi"}]
MAPPED = (('{"none": "low"}', "low"), ('{"none": "low", "low": "medium"}', "low"))
FIRST, RENDERER = (0, 18, 0), (0, 25, 0)  # the patch's first release; from RENDERER the builder is OnlineRenderer's



def run(verbose):
    release = vllm_release()
    if release is None or release < FIRST:
        raise NoBuilder("before vLLM 0.18.0 Chat Completions does not accept reasoning_effort none")
    if release >= RENDERER:
        raise NoBuilder("from vLLM 0.25.0 the check is in OnlineRenderer, which this probe cannot call")
    builder = Builder()
    request = builder.request({"messages": MESSAGES, "reasoning_effort": "none"})
    seen, problems, prompts = [], [], []
    for effort_map, expected in MAPPED:
        with EnvVar(ENV, effort_map):
            try:
                text = builder.decode(builder.build(request))
            except Exception as exc:  # noqa: BLE001 - the probe reports any failure inside vLLM
                problems.append(f"{ENV}={effort_map}: none failed: {exception_line(exc)}")
                continue
        prompts.append(f"--- {ENV}={effort_map}\n{text}")
        found = re.search(r"^Reasoning: (\w+)$", text, re.MULTILINE)
        got = found.group(1) if found else None
        seen.append(f"{effort_map}: none -> Reasoning: {got}")
        if got != expected:
            problems.append(f"{ENV}={effort_map}: none rendered Reasoning: {got}, expected {expected}")
    with EnvVar(ENV, "{}"):
        try:
            builder.build(request)
            problems.append(f"{ENV}='{{}}': none was accepted (stock rejects it)")
        except Exception as exc:  # noqa: BLE001 - stock's rejection is the expected outcome
            if "does not support" not in str(exc):
                problems.append(f"{ENV}='{{}}': none failed otherwise than stock: {exception_line(exc)}")
            else:
                seen.append(f"'{{}}': none rejected ({type(exc).__name__})")
    detail = "\n".join(prompts) if verbose else ""
    if problems:
        return {"passed": False, "evidence": "; ".join(problems), "detail": detail}
    return {"passed": True, "evidence": "; ".join(seen), "detail": detail}
