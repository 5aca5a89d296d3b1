"""Probe for marlin_atomic_add_sm121: call the installed should_use_atomic_add_reduce as if on a GPU.

Sizes pass the function's other guards (n < 2048, k >= 2048, a cuda device, float16), and
torch.cuda.get_device_capability is replaced for the call: no GPU is needed, nothing is allocated.
"""

from _common import EnvVar

REQUIRES = ("vllm", "torch")
ENV = "VLLM_MARLIN_USE_ATOMIC_ADD"
SIZES = {"m": 1, "n": 1024, "k": 4096}
# (compute capability, VLLM_MARLIN_USE_ATOMIC_ADD, expected); (9, 0) unset is stock's answer.
CASES = (((12, 1), None, True), ((12, 1), "0", False), ((9, 0), None, False))
SIBLINGS = ("marlin_utils_fp4", "marlin_utils_fp8")  # import the function by name


def run(verbose):
    import importlib

    import torch

    package = "vllm.model_executor.layers.quantization.utils"
    marlin_utils = importlib.import_module(package + ".marlin_utils")
    function = marlin_utils.should_use_atomic_add_reduce
    observed = [(cap, value, expected, _call(torch, function, cap, value)) for cap, value, expected in CASES]
    lines = [f"cc {cap} {_label(value)}: {got}" for cap, value, _, got in observed]
    problems = [
        f"cc {cap} {_label(value)} returned {got}, expected {want}"
        for cap, value, want, got in observed
        if got is not want
    ]
    for sibling in SIBLINGS:
        module = importlib.import_module(package + "." + sibling)
        if getattr(module, "should_use_atomic_add_reduce", function) is not function:
            problems.append(f"{sibling}.should_use_atomic_add_reduce is not marlin_utils' function")
    call = "should_use_atomic_add_reduce(m=1, n=1024, k=4096, cuda:0, float16)"
    detail = "\n".join(lines) if verbose else ""
    if problems:
        return {"passed": False, "evidence": "{}: {}".format(call, "; ".join(problems)), "detail": detail}
    evidence = "{}: {}; {} share the function".format(call, ", ".join(lines), " and ".join(SIBLINGS))
    return {"passed": True, "evidence": evidence, "detail": detail}


def _call(torch, function, capability, value):
    saved = torch.cuda.get_device_capability
    torch.cuda.get_device_capability = lambda device=None: capability
    try:
        with EnvVar(ENV, value):
            return function(SIZES["m"], SIZES["n"], SIZES["k"], torch.device("cuda", 0), torch.float16)
    finally:
        torch.cuda.get_device_capability = saved


def _label(value):
    return f"{ENV} unset" if value is None else f"{ENV}={value}"
