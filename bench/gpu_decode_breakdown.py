"""Where a step's GPU time goes: one decode step at one stream, and one prompt pass of P prompts, against the bound.

`gptoss-patch bench --bound` reports decode at concurrency 1 as a fraction of the memory-bandwidth bound.
This script says where the rest goes. Run it with the *target* interpreter (it imports vLLM and torch),
on a GPU, with no server running:

    $PY bench/gpu_decode_breakdown.py MODEL [--tokens 256] [--prefill 16x128] [--json OUT] [-- moe_backend=marlin ...]
    python bench/gpu_decode_breakdown.py --report OUT.json     # print a saved result again (no vLLM, no GPU)

It starts vLLM in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, so the profiler sees the engine's
kernels), with CUDA graphs as `vllm serve` uses them and the engine arguments given after `--` (`key=value`,
values read as JSON where they parse). Before the engine starts it measures the GPU's two ceilings: the
device-to-device copy bandwidth (as `bench --bound` does) and a bf16 matrix product's rate.

Decode (unless `--tokens 0`): greedy generations of one prompt; the time per output token from a 1-token
and an N-token run (medians of 3); then both runs are profiled with torch.profiler (GPU activity only), and
the difference, over N - 1, is one decode step's kernel time, so the prompt's own step is left out.

Prompt pass (`--prefill PxN`): P prompts of N random tokens each (new tokens every run, so the prefix cache
never answers), one output token each: one engine step that computes P x N tokens. The first such pass
after start-up is timed on its own (what a server's first users wait for: Triton's kernels compile for
new batch sizes), then 3 more (median), then one is profiled.

Kernel time is summed by kind (MoE GEMMs, routing, attention, dense GEMMs, norms, sampling, copies). For
each kind the script counts the bytes its kernels must read and the FLOPs they must do (from config.json,
through the project's tensor plan: the bytes `bench --bound` counts), and the time that takes at the
measured ceilings; "loss" is the time over that bound. "idle" is the step's time that no kernel covers:
launch gaps and host work. Every kernel's name, time and count is kept in the JSON, so the grouping can be
changed and the saved result printed again with `--report`.

Not part of `make bench` (which needs no GPU): it measures, it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import sys
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

EXPERTS = "experts (MoE GEMMs)"
ROUTING = "routing (top-k, align, sum)"
ATTENTION = "attention (kernel, KV write)"
DENSE = "dense GEMMs (q/k/v/o, router, lm_head)"
NORMS = "norms, rotary, activation (fused)"
GLUE = "elementwise glue (casts, fills, index)"
SAMPLING = "sampling, logits"
COPIES = "copies, memsets"
OTHER = "other"
IDLE = "idle (no kernel running)"

# Kernel name patterns, first match wins. Names differ between vLLM, Triton and torch builds; every kernel
# is kept by name in the JSON, so the grouping can be checked and changed (`--report`).
KINDS = (
    (EXPERTS, r"marlin|matmul_ogs|fused_moe|moe_gemm|grouped_gemm|cutlass_moe"),
    (
        ROUTING,
        r"topk|gating|moe_align|moe_sum|routing|sort_tokens|count_and_sort|expert|bitmatrix|memset_indx"
        r"|compute_writeback|combined_routing|finalize_scatter|_sum_|_stage2|^_reduce$|ragged_tensor_metadata",  # triton_kernels' top-k sum: _reduce
    ),
    (ATTENTION, r"flash|fmha|attn|attention|reshape_and_cache|paged|splitkv|combine"),
    (DENSE, r"gemm|gemv|nvjet|xmma|cublas|cutlass|sm90_|splitk|onednn_mm|aten::(add)?mm"),
    (NORMS, r"norm|rotary|rope|triton_(poi|red|per)|act_and_mul|silu|swiglu"),
    (GLUE, r"elementwise|vectorized|fillfunctor|direct_copy|index_"),
    (SAMPLING, r"argmax|sampl|softmax|logit|cumsum|gather|scatter|penalt|top_p|top_k"),
    (COPIES, r"memcpy|memset|copy"),
)

COPY_PROBE_BYTES = 1 << 30  # two 1 GiB buffers, far beyond the L2 (50-60 MB), as `bench --bound` measures
MATMUL_PROBE_SIZE = 8192  # an 8192^3 bf16 product: the dense tensor-core rate on random data


def kind_of(name: str) -> str:
    for kind, pattern in KINDS:
        if re.search(pattern, name, re.IGNORECASE):
            return kind
    return OTHER


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


def prefill_shape(text: str) -> tuple[int, int]:
    """`16x128` -> (16 prompts, 128 tokens each)."""
    match = re.fullmatch(r"(\d+)[x*](\d+)", text.strip())
    if not match or int(match.group(1)) < 1 or int(match.group(2)) < 1:
        raise argparse.ArgumentTypeError(f"expected PROMPTSxTOKENS such as 16x128, got {text!r}")
    return int(match.group(1)), int(match.group(2))


# ---- the GPU's ceilings --------------------------------------------------------------------------------------


def ceilings() -> dict:
    """Copy bandwidth (bytes read + written, GB/s) and bf16 matrix rate (TFLOP/s): best of 5 x 10 each."""
    import torch

    if not torch.cuda.is_available():
        return {}
    copy_s, matmul_s = _copy_seconds(), _matmul_seconds()
    torch.cuda.empty_cache()  # give it all back before vLLM sizes its memory
    return {
        "device": torch.cuda.get_device_name(),
        "copy_gb_per_s": 2 * COPY_PROBE_BYTES / copy_s / 1e9,
        "bf16_tflop_per_s": 2 * MATMUL_PROBE_SIZE**3 / matmul_s / 1e12,
    }


def _copy_seconds() -> float:
    import torch

    src = torch.empty(COPY_PROBE_BYTES, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return _best_seconds(lambda: dst.copy_(src))


def _matmul_seconds() -> float:
    import torch

    a, b = (torch.randn(MATMUL_PROBE_SIZE, MATMUL_PROBE_SIZE, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    return _best_seconds(lambda: a @ b)


def _best_seconds(work) -> float:
    """Seconds for one `work()`: the best of 5 timings of 10 after 3 warm-ups."""
    import torch

    for _ in range(3):
        work()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            work()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / 1000 / 10)
    return best


# ---- what each kind must read and compute ---------------------------------------------------------------------


def work_by_kind(model: str, prompts: int, new_tokens: int, past: int) -> dict[str, dict[str, float]]:
    """Bytes read and FLOPs per kind for one step of `prompts` x `new_tokens` after `past` cached tokens each.

    Weights are read once a step; experts only where a token is routed (uniform routing: each of E experts is
    hit by some of T tokens with probability 1 - (1 - k/E)^T); `lm_head` computes one row per prompt (vLLM
    computes logits for each sequence's last token only). Attention reads the queries and the cached keys and
    values it attends to. Norms, routing and sampling move activations only: no bound is counted for them.
    """
    try:
        from gptoss_patch.bench.bound import recipe_from_model
        from gptoss_patch.model import tensor_plan
    except ImportError:
        return {}
    recipe = recipe_from_model(model)
    tokens = prompts * new_tokens
    hidden, inter, k, experts = (
        recipe.hidden_size,
        recipe.intermediate_size,
        recipe.experts_per_token,
        recipe.num_local_experts,
    )
    q_size, kv_size = recipe.num_attention_heads * recipe.head_dim, recipe.num_key_value_heads * recipe.head_dim
    touched = 1 - (1 - k / experts) ** tokens
    nbytes = {EXPERTS: 0.0, DENSE: 0.0}
    for spec in tensor_plan(recipe):
        if ".mlp.experts." in spec.name:
            nbytes[EXPERTS] += spec.nbytes * touched
        elif spec.name == "model.embed_tokens.weight":
            nbytes[DENSE] += spec.nbytes / recipe.vocab_size * tokens  # the tokens' own rows
        else:
            nbytes[DENSE] += spec.nbytes
    layers = recipe.num_hidden_layers
    projections = hidden * (2 * q_size + 2 * kv_size)  # q, k, v, o weights
    pairs, kv_read = 0, 0  # (query, key) pairs attended to; cached tokens read
    for layer_type in recipe.layer_types:
        window = recipe.sliding_window if layer_type == "sliding_attention" else None
        for position in range(past, past + new_tokens):
            pairs += min(position + 1, window) if window else position + 1
        kv_read += min(past + new_tokens, window) if window else past + new_tokens
    pairs, kv_read = pairs * prompts, kv_read * prompts
    return {
        EXPERTS: {"bytes": nbytes[EXPERTS], "flops": 2.0 * tokens * k * 3 * hidden * inter * layers},
        DENSE: {
            "bytes": nbytes[DENSE],
            "flops": 2.0 * tokens * (projections + experts * hidden) * layers
            + 2.0 * prompts * recipe.vocab_size * hidden,
        },
        ATTENTION: {
            "bytes": 2.0 * (kv_read * kv_size * 2 + 2 * tokens * q_size * layers),  # bf16 K and V; queries in, out
            "flops": 4.0 * pairs * recipe.num_attention_heads * recipe.head_dim,
        },
    }


def bound_ms(work: dict[str, float], limits: dict) -> float:
    """The time at the ceilings: whichever of reading the bytes and doing the FLOPs takes longer."""
    if not work or not limits:
        return 0.0
    return max(work["bytes"] / limits["copy_gb_per_s"] / 1e6, work["flops"] / limits["bf16_tflop_per_s"] / 1e9)


# ---- profiling --------------------------------------------------------------------------------------------------


def profiled(run) -> list[tuple[str, float, float]]:
    """The GPU activities (kernels, copies, memsets) while `run()` runs: (name, start us, end us)."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    gpu = torch.cuda.is_available()
    wanted = DeviceType.CUDA if gpu else DeviceType.CPU
    with profile(activities=[ProfilerActivity.CUDA if gpu else ProfilerActivity.CPU]) as prof:
        run()
    return [
        (event.name, event.time_range.start, event.time_range.end)
        for event in prof.events()
        if event.device_type == wanted and event.time_range.end > event.time_range.start
    ]


def per_name(activities: list[tuple[str, float, float]]) -> dict[str, list[float]]:
    """name -> [total us, count]."""
    totals: dict[str, list[float]] = {}
    for name, start, end in activities:
        entry = totals.setdefault(name, [0.0, 0])
        entry[0] += end - start
        entry[1] += 1
    return totals


def span_and_busy_us(activities: list[tuple[str, float, float]]) -> tuple[float, float]:
    """First start to last end, and the time at least one activity runs (overlaps counted once)."""
    if not activities:
        return 0.0, 0.0
    intervals = sorted((start, end) for _, start, end in activities)
    busy, (current_start, current_end) = 0.0, intervals[0]
    for start, end in intervals[1:]:
        if start > current_end:
            busy += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    busy += current_end - current_start
    return max(end for _, end in intervals) - intervals[0][0], busy


# ---- the runs ---------------------------------------------------------------------------------------------------


def generate(llm, prompts: list, tokens: int) -> float:
    """Greedy generation of `tokens` tokens for each prompt; its wall time in seconds."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    for output in outputs:
        if len(output.outputs[0].token_ids) != tokens:
            sys.exit(f"asked for {tokens} tokens, vLLM produced {len(output.outputs[0].token_ids)}")
    return elapsed


def random_prompts(count: int, length: int, rng: random.Random) -> list:
    from vllm.inputs import TokensPrompt

    # Ordinary tokens only: gpt-oss's special tokens sit at the top of the 201088-token vocabulary.
    return [TokensPrompt(prompt_token_ids=[rng.randrange(1000, 199000) for _ in range(length)]) for _ in range(count)]


def decode_step(llm, model: str, tokens: int) -> dict:
    """One decode step at one stream: (N-token run) - (1-token run), over N - 1."""
    prompt = random_prompts(1, 128, random.Random(0))
    generate(llm, prompt, 16)  # warm-up
    one = statistics.median(generate(llm, prompt, 1) for _ in range(3))
    many = statistics.median(generate(llm, prompt, tokens) for _ in range(3))
    tpot = (many - one) / (tokens - 1) * 1000
    short, long = (
        per_name(profiled(lambda: generate(llm, prompt, 1))),
        per_name(profiled(lambda: generate(llm, prompt, tokens))),
    )
    kernels = {
        name: [
            (total - short.get(name, [0.0, 0])[0]) / (tokens - 1),
            (count - short.get(name, [0.0, 0])[1]) / (tokens - 1),
        ]
        for name, (total, count) in long.items()
    }
    return {
        "what": "decode step at 1 stream",
        "tokens": tokens,
        "step_ms": tpot,
        "step_note": "time per output token in this process: (N-token run - 1-token run) / (N - 1), medians of 3",
        "kernels_us": kernels,
        "work": work_by_kind(model, prompts=1, new_tokens=1, past=128 + tokens // 2),
    }


def prompt_pass(llm, model: str, prompts: int, length: int) -> dict:
    """One engine step over `prompts` new prompts of `length` tokens (first pass timed apart).

    One step as long as prompts x length fits vLLM's --max-num-batched-tokens; beyond, the span covers the chunks.
    """
    rng = random.Random(1)
    first = generate(llm, random_prompts(prompts, length, rng), 1)
    warm = statistics.median(generate(llm, random_prompts(prompts, length, rng), 1) for _ in range(3))
    batch = random_prompts(prompts, length, rng)
    activities = profiled(lambda: generate(llm, batch, 1))
    span, busy = span_and_busy_us(activities)
    return {
        "what": f"prompt pass of {prompts} prompts x {length} tokens",
        "prompts": prompts,
        "prompt_tokens": length,
        "first_pass_ms": first * 1000,
        "wall_ms": warm * 1000,
        "step_ms": span / 1000,
        "step_note": "GPU span of the profiled pass: first kernel's start to last kernel's end",
        "gpu_busy_ms": busy / 1000,
        "kernels_us": {name: [total, count] for name, (total, count) in per_name(activities).items()},
        "work": work_by_kind(model, prompts=prompts, new_tokens=length, past=0),
    }


def breakdown(model: str, tokens: int, prefill: tuple[int, int] | None, kwargs: dict) -> dict:
    from vllm import LLM, __version__

    limits = ceilings()
    llm = LLM(model=model, **{"max_model_len": 4096, "gpu_memory_utilization": 0.5, **kwargs})
    passes = []
    if prefill:  # first: the first prompt pass after start-up is part of what it measures
        passes.append(prompt_pass(llm, model, *prefill))
    if tokens:
        passes.insert(0, decode_step(llm, model, tokens))
    return {"model": model, "vllm": __version__, "engine_kwargs": kwargs, "ceilings": limits, "passes": passes}


# ---- the report -------------------------------------------------------------------------------------------------


def by_kind(one_pass: dict) -> dict[str, dict[str, float]]:
    """Per kind: ms and kernel launches a step, and the bound's ms (0 where no bound is counted)."""
    kinds: dict[str, dict[str, float]] = {}
    for name, (total_us, count) in one_pass["kernels_us"].items():
        entry = kinds.setdefault(kind_of(name), {"ms": 0.0, "calls": 0.0})
        entry["ms"] += total_us / 1000
        entry["calls"] += count
    return kinds


def rows(one_pass: dict, limits: dict) -> list[dict]:
    """The table: each kind, then idle, with its time, bound and loss (time over the bound), largest first."""
    kinds = by_kind(one_pass)
    out = []
    for kind, entry in kinds.items():
        work = one_pass["work"].get(kind, {})
        bound = bound_ms(work, limits)
        out.append({"kind": kind, **entry, **work, "bound_ms": bound, "loss_ms": entry["ms"] - bound})
    kernels = sum(entry["ms"] for entry in kinds.values())
    idle = one_pass["step_ms"] - (one_pass.get("gpu_busy_ms") or kernels)
    out.sort(key=lambda row: -row["ms"])
    out.append({"kind": IDLE, "ms": idle, "calls": 0.0, "bound_ms": 0.0, "loss_ms": idle})
    return out


def report(result: dict) -> str:
    limits = result.get("ceilings") or {}
    lines = [f"model {result['model']}, vLLM {result.get('vllm', '?')}, engine {json.dumps(result['engine_kwargs'])}"]
    if limits:
        lines.append(
            f"{limits['device']}: copy {limits['copy_gb_per_s']:.0f} GB/s, bf16 {limits['bf16_tflop_per_s']:.0f} TFLOP/s"
        )
    for one_pass in result["passes"]:
        lines += ["", _pass_report(one_pass, limits)]
    return "\n".join(lines)


def _pass_report(one_pass: dict, limits: dict) -> str:
    table = rows(one_pass, limits)
    kernels = sum(row["ms"] for row in table if row["kind"] != IDLE)
    bound = sum(row["bound_ms"] for row in table)
    lines = [f"== {one_pass['what']}: step {one_pass['step_ms']:.3f} ms ({one_pass['step_note']})"]
    if "first_pass_ms" in one_pass:
        lines.append(
            f"   wall: first pass after start-up {one_pass['first_pass_ms']:.1f} ms, then {one_pass['wall_ms']:.1f} ms "
            f"(median of 3); GPU busy {one_pass['gpu_busy_ms']:.3f} ms of the span"
        )
    lines.append(f"   kernels {kernels:.3f} ms; bound {bound:.3f} ms = {bound / one_pass['step_ms']:.1%} of the step")
    lines.append(
        f"   {'kind':40} {'ms':>8} {'share':>6} {'calls':>6} {'GB':>7} {'GFLOP':>8} {'bound':>7} {'loss':>7} "
        f"{'GB/s':>6} {'TFLOP/s':>7}"
    )
    for row in table:
        read, flops = row.get("bytes"), row.get("flops")
        rate = f"{read / row['ms'] / 1e6:6.0f}" if read and row["ms"] > 0 else ""
        compute = f"{flops / row['ms'] / 1e9:7.1f}" if flops and row["ms"] > 0 else ""
        lines.append(
            f"   {row['kind']:40} {row['ms']:8.3f} {row['ms'] / one_pass['step_ms']:6.1%} {row['calls']:6.0f} "
            f"{read / 1e9 if read else 0:7.3f} {flops / 1e9 if flops else 0:8.1f} {row['bound_ms']:7.3f} "
            f"{row['loss_ms']:7.3f} {rate:>6} {compute:>7}"
        )
    lines.append("   top kernels (ms a step, calls, kind):")
    top = sorted(one_pass["kernels_us"].items(), key=lambda item: -item[1][0])[:25]
    lines += [
        f"   {total / 1000:8.3f} {count:5.0f}  {kind_of(name)[:12]:12} {name[:100]}" for name, (total, count) in top
    ]
    return "\n".join(lines)


def main() -> None:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?")
    parser.add_argument(
        "--tokens", type=int, default=256, help="decode: output tokens per generation (default 256; 0: no decode)"
    )
    parser.add_argument(
        "--prefill", type=prefill_shape, metavar="PxN", help="also profile one pass of P prompts of N tokens"
    )
    parser.add_argument("--json", metavar="OUT", help="also write the result as JSON to OUT")
    parser.add_argument("--report", metavar="JSON", help="print a saved result again (the current grouping) and exit")
    args = parser.parse_args(own)
    if args.report:
        with open(args.report) as saved:
            print(report(json.load(saved)))
        return
    if not args.model:
        parser.error("MODEL is required (or --report JSON)")
    if args.tokens == 1 or args.tokens < 0:
        parser.error("--tokens must be 0 (no decode) or at least 2")
    if not args.tokens and not args.prefill:
        parser.error("nothing to measure: --tokens 0 and no --prefill")
    result = breakdown(args.model, args.tokens, args.prefill, engine_kwargs(extra))
    if args.json:  # first: the report is read from it
        with open(args.json, "w") as out:
            json.dump(result, out, indent=1)
    print(report(result))


if __name__ == "__main__":
    main()
