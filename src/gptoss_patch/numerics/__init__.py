"""`gptoss-patch numerics`: does a faster configuration serve the same model? Kernel error against a float64
reference, run-to-run determinism and batch invariance, and agreement between servers.

    kernels.py       the kernel level: the model's layer shape, kernel_check.py run in the target interpreter
    kernel_check.py  one MoE layer (each MoE backend vLLM offers here) and the dense projections against float64,
                     beside the same layers computed exactly with bf16 intermediates (the floor kernels.gate judges
                     them by; run in the target interpreter, never imported here)
    served.py        the server level: the same prompts twice to each server (bench's servers), prompt logprobs
                     and greedy generations compared pass against pass

Engine only: results come back as data; commands/numerics.py and numerics/render.py print.
"""

from gptoss_patch.numerics.kernels import KernelReport, LayerShape, layer_shape, parse_backends, parse_tokens
from gptoss_patch.numerics.served import Agreement, Pass, PromptResult, ServedReport, agreements, compare

__all__ = [
    "Agreement", "KernelReport", "LayerShape", "Pass", "PromptResult", "ServedReport", "agreements", "compare",
    "layer_shape", "parse_backends", "parse_tokens",
]  # fmt: skip
