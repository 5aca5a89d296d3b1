"""Behaviour probe of example_envs_marker, run by `gptoss-patch verify --behaviour` in the *target* interpreter.

The contract of a probe (the same as the built-ins' verify/probes/probe_<id>.py): the standard library only
at module level (it runs where vLLM is installed, not where gptoss-patch is), `REQUIRES` names the modules
it needs there, and `run(verbose)` returns {"passed": True/False/None, "evidence": "..."}: passed only on
positive evidence, None when it cannot tell. The SPEC points at this file with `probe=`.
"""

REQUIRES = ("vllm",)


def run(verbose):
    import importlib

    envs = importlib.import_module("vllm.envs")  # the module the patch changes, as vLLM imports it
    value = getattr(envs, "GPTOSS_EXAMPLE_PATCHES", None)
    if value is True:
        return {"passed": True, "evidence": f"vllm.envs.GPTOSS_EXAMPLE_PATCHES is True (from {envs.__file__})"}
    return {"passed": False, "evidence": f"vllm.envs.GPTOSS_EXAMPLE_PATCHES is {value!r}: the marker is not in the imported module"}
