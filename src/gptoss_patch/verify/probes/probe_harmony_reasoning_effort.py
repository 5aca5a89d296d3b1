"""Probe for harmony_reasoning_effort: the `Reasoning:` line the installed get_system_message renders.

`minimal`, `xhigh` and `max` (accepted by the request models, rejected by harmony on stock) must render
as `Reasoning: low` / `high` / `high`, `medium` must stay `medium`, and with
GPTOSS_PATCH_REASONING_EFFORT_MAP='{}' `minimal` must fail as on stock (the map can be switched off).
"""

import re

from _builder import NoBuilder
from _common import EnvVar, exception_line, vllm_release

REQUIRES = ("vllm", "openai_harmony")
ENV = "GPTOSS_PATCH_REASONING_EFFORT_MAP"
CASES = (("minimal", "low"), ("xhigh", "high"), ("max", "high"), ("medium", "medium"))
FIRST, FIXED = (0, 18, 0), (0, 33, 0)  # the patch's band; from FIXED vLLM maps with --reasoning-effort-map



def run(verbose):
    release = vllm_release()
    if release is None or release < FIRST:
        raise NoBuilder("before vLLM 0.18.0 the request models and harmony accept the same efforts")
    if release >= FIXED:
        raise NoBuilder("from vLLM 0.33.0 efforts are mapped by the server flag --reasoning-effort-map")
    from vllm.entrypoints.openai.parser import harmony_utils

    encoding = harmony_utils.get_encoding()
    seen, problems, prompts = [], [], []
    with EnvVar(ENV, None):
        for effort, expected in CASES:
            try:
                prompt = encoding.decode(encoding.render(harmony_utils.get_system_message(reasoning_effort=effort)))
            except Exception as exc:  # noqa: BLE001 - the probe reports any failure inside vLLM
                problems.append(f"{effort}: {exception_line(exc)}")
                continue
            prompts.append(prompt)
            found = re.search(r"^Reasoning: (\w+)$", prompt, re.MULTILINE)
            got = found.group(1) if found else None
            seen.append(f"{effort} -> Reasoning: {got}")
            if got != expected:
                problems.append(f"{effort} rendered Reasoning: {got}, expected {expected}")
    with EnvVar(ENV, "{}"):
        try:
            harmony_utils.get_system_message(reasoning_effort="minimal")
            problems.append(f"{ENV}='{{}}' still mapped minimal (stock rejects it)")
        except Exception as exc:  # noqa: BLE001 - stock's rejection is the expected outcome
            seen.append(f"{ENV}='{{}}': minimal rejected ({type(exc).__name__})")
    detail = "\n\n".join(prompts) if verbose else ""
    if problems:
        return {"passed": False, "evidence": "; ".join(problems), "detail": detail}
    return {"passed": True, "evidence": "; ".join(seen), "detail": detail}
