"""Where a decode step's GPU time goes at one stream: the gap between `bench --bound` and the bound.

`gptoss-patch bench --bound` reports decode at concurrency 1 as a fraction of the memory-bandwidth bound.
This script says where the rest goes. Run it with the *target* interpreter (it imports vLLM and torch),
on a GPU, with no server running:

    $PY bench/gpu_decode_breakdown.py MODEL [--tokens 256] [--json OUT] [-- moe_backend=marlin ...]

It starts vLLM in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, so the profiler sees the engine's
kernels), with CUDA graphs as `vllm serve` uses them and the engine arguments given after `--` (`key=value`,
values read as JSON where they parse). It times greedy generations of one prompt (time per output token
from a 1-token and an N-token run, medians of 3), then profiles one N-token generation with
torch.profiler (GPU activity only) and sums kernel time per decode step by kind. For the kinds that read
the weights `bench --bound` counts (experts, attention projections, lm_head), it prints the bytes and the
bandwidth achieved; "idle" is the step's wall time that no kernel covers.

Not part of `make bench` (which needs no GPU): it measures, it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

# Kernel name patterns, first match wins. Names differ between vLLM and torch builds; the top kernels are
# printed by name too, so the grouping can be checked.
KINDS = (
    ("experts (MoE GEMMs)", r"marlin|matmul_ogs|fused_moe|moe_gemm|grouped_gemm|cutlass_moe"),
    ("routing (top-k, align, sum)", r"topk|gating|moe_align|moe_sum|routing|sort_tokens|count_and_sort|expert"),
    ("attention (kernel, KV write)", r"flash|fmha|attn|attention|reshape_and_cache|paged|splitkv|combine"),
    (
        "dense GEMMs (q/k/v/o, router, lm_head)",
        r"gemm|gemv|nvjet|xmma|cublas|cutlass|sm90_|splitk|onednn_mm|aten::(add)?mm",
    ),
    (
        "norms, rotary, fused elementwise",
        r"norm|rotary|rope|triton_(poi|red|per)|elementwise|vectorized|act_and_mul|silu|swiglu",
    ),
    ("sampling, logits", r"argmax|sampl|softmax|logit|cumsum|gather|scatter|penalt|top_p|top_k"),
    ("copies, memsets", r"memcpy|memset|copy"),
)


def kind_of(name: str) -> str:
    for kind, pattern in KINDS:
        if re.search(pattern, name, re.IGNORECASE):
            return kind
    return "other"


def engine_kwargs(pairs: list[str]) -> dict:
    kwargs = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            sys.exit(f"engine argument {pair!r}: expected key=value, e.g. moe_backend=marlin")
        try:
            kwargs[key] = json.loads(value)
        except json.JSONDecodeError:
            kwargs[key] = value
    return kwargs


def timed_generation(llm, prompt, tokens: int) -> float:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.generate([prompt], params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    produced = len(outputs[0].outputs[0].token_ids)
    if produced != tokens:
        sys.exit(f"asked for {tokens} tokens, vLLM produced {produced}")
    return elapsed


def tpot_ms(llm, prompt, tokens: int) -> float:
    one = statistics.median(timed_generation(llm, prompt, 1) for _ in range(3))
    many = statistics.median(timed_generation(llm, prompt, tokens) for _ in range(3))
    return (many - one) / (tokens - 1) * 1000


def kernel_times_us(llm, prompt, tokens: int) -> dict[str, float]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    gpu = torch.cuda.is_available()
    activities = [ProfilerActivity.CUDA] if gpu else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        timed_generation(llm, prompt, tokens)
    times: dict[str, float] = {}
    for event in prof.key_averages():
        total = event.self_device_time_total if gpu else event.self_cpu_time_total
        if total > 0:
            times[event.key] = times.get(event.key, 0.0) + total
    return times


def weight_bytes(model: str, context: int) -> dict[str, int]:
    try:
        from gptoss_patch.bench.bound import decode_bytes, recipe_from_model
    except ImportError:
        return {}
    counted = decode_bytes(recipe_from_model(model), context)
    return {
        "experts (MoE GEMMs)": counted.experts,
        "dense GEMMs (q/k/v/o, router, lm_head)": counted.attention + counted.lm_head + counted.other,
    }


def breakdown(model: str, tokens: int, kwargs: dict) -> dict:
    from vllm import LLM
    from vllm.inputs import TokensPrompt

    llm = LLM(model=model, **{"max_model_len": 4096, "gpu_memory_utilization": 0.5, **kwargs})
    prompt = TokensPrompt(prompt_token_ids=[(7919 * i) % 200000 + 1000 for i in range(128)])
    timed_generation(llm, prompt, 16)  # warm-up
    step_ms = tpot_ms(llm, prompt, tokens)
    times = kernel_times_us(llm, prompt, tokens)
    steps = tokens - 1  # the prefill's kernels are counted too: about one step's worth, under 1 %
    by_kind: dict[str, float] = {}
    for name, total in times.items():
        by_kind[kind_of(name)] = by_kind.get(kind_of(name), 0.0) + total / steps / 1000
    busy = sum(by_kind.values())
    top = sorted(times.items(), key=lambda item: -item[1])[:25]
    return {
        "model": model,
        "engine_kwargs": kwargs,
        "tokens": tokens,
        "tpot_ms": step_ms,
        "kernel_ms_per_step": by_kind,
        "busy_ms_per_step": busy,
        "idle_ms_per_step": step_ms - busy,
        "weight_bytes": weight_bytes(model, context=128 + tokens // 2),
        "top_kernels_ms_per_step": [(name, total / steps / 1000) for name, total in top],
    }


def report(result: dict) -> str:
    lines = [
        f"time per output token {result['tpot_ms']:.3f} ms; kernels {result['busy_ms_per_step']:.3f} ms a step, "
        f"idle {result['idle_ms_per_step']:.3f} ms",
        f"{'kind':42} {'ms/step':>8} {'share':>6} {'GB read':>8} {'GB/s':>7}",
    ]
    for kind, ms in sorted(result["kernel_ms_per_step"].items(), key=lambda item: -item[1]):
        read = result["weight_bytes"].get(kind)
        rate = f"{read / ms / 1e6:7.0f}" if read else ""
        gigabytes = f"{read / 1e9:8.3f}" if read else ""
        lines.append(f"{kind:42} {ms:8.3f} {ms / result['tpot_ms']:6.1%} {gigabytes:>8} {rate:>7}")
    lines.append("top kernels (ms a step):")
    lines += [f"  {ms:7.3f}  {name[:110]}" for name, ms in result["top_kernels_ms_per_step"]]
    return "\n".join(lines)


def main() -> None:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--tokens", type=int, default=256, help="output tokens per generation (default 256)")
    parser.add_argument("--json", metavar="OUT", help="also write the result as JSON to OUT")
    args = parser.parse_args(own)
    if args.tokens < 2:
        parser.error("--tokens must be at least 2")
    result = breakdown(args.model, args.tokens, engine_kwargs(extra))
    print(report(result))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=1)


if __name__ == "__main__":
    main()
