"""The kernel check's exact-bf16 floor against variants with more bf16 roundings, on the check's own MoE layer and
inputs (seed 0, as `gptoss-patch numerics --level kernels` draws them): how much each further rounding of a whole
intermediate tensor raises the error against float64, the figures behind kernels.FLOOR_MULTIPLE.

    $PY bench/gpu_floor_variants.py 20b 120b      # $PY: the target interpreter (torch; vLLM is not needed)

Variants, each against the float64 reference (relative error, as the check reports it):
  floor                     kernel_check's floor: each GEMM with its bias exact, then one rounding to bf16; the
                            activation from those bf16 values, rounded; expert outputs in bf16; fp32 top-k sum
  weighted_bf16             the floor, each weighted expert output also rounded to bf16 before the fp32 sum
  act_bf16_ops              the floor, the activation computed in bf16 operations (each rounded) instead of exactly
  bias_after_round          each GEMM's output rounded to bf16 before its bias is added, the sum rounded again
  bias_after_round+weighted both of the above
  output_rounded_once       the float64 result rounded once to bf16 (the least any bf16 output can have)
It needs a CUDA GPU (the layer is drawn there, as the check draws it), prints one JSON line per shape and token
count, measures, asserts nothing, and is not part of `make bench`.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

VARIANTS = ("floor", "weighted_bf16", "act_bf16_ops", "bias_after_round", "bias_after_round+weighted_bf16")


def load_kernel_check():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("kernel_check", ROOT / "src/gptoss_patch/numerics/kernel_check.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def variants(torch, kc, x, logits, layer: dict, topk: int, limit: float) -> dict[str, float]:  # type: ignore[no-untyped-def]
    def bf(t):  # type: ignore[no-untyped-def]
        return kc.to_bf16(torch, t).double()

    weights, ids = kc.route(torch, logits.cpu(), topk)
    device = layer["w13_blocks"].device
    x64, w32 = x.double().to(device), weights.to(device)
    ref = torch.zeros_like(x64)
    outs = {name: torch.zeros(*ids.shape, x64.shape[1], dtype=torch.float64, device=device) for name in VARIANTS}
    for expert in torch.unique(ids).tolist():
        token, slot = (ids == expert).nonzero(as_tuple=True)
        td, sd = token.to(device), slot.to(device)
        w13 = kc.dequantize(torch, layer["w13_blocks"][expert], layer["w13_scales"][expert])
        w2 = kc.dequantize(torch, layer["w2_blocks"][expert], layer["w2_scales"][expert])
        b13, b2 = layer["b13"][expert], layer["b2"][expert]
        gemm1 = x64[td] @ w13.T
        y = kc.swiglu(torch, gemm1 + b13, limit) @ w2.T + b2
        ref.index_add_(0, td, w32[token, slot].double().unsqueeze(-1) * y)
        h16 = bf(gemm1 + b13)
        y16 = bf(bf(kc.swiglu(torch, h16, limit)) @ w2.T + b2)
        outs["floor"][td, sd] = outs["weighted_bf16"][td, sd] = y16
        hs = bf(bf(gemm1) + b13)
        ys = bf(bf(bf(kc.swiglu(torch, hs, limit)) @ w2.T) + b2)
        outs["bias_after_round"][td, sd] = outs["bias_after_round+weighted_bf16"][td, sd] = ys
        hb = h16.to(torch.bfloat16)
        gate, up = hb[:, ::2].clamp(max=limit), hb[:, 1::2].clamp(min=-limit, max=limit)
        act = (gate * torch.sigmoid(kc.ALPHA * gate) * (up + 1)).double()  # bf16 operations, each rounded
        outs["act_bf16_ops"][td, sd] = bf(act @ w2.T + b2)
    found = {}
    for name, out in outs.items():
        if "weighted_bf16" in name:
            products = (w32.unsqueeze(-1) * out.float()).to(torch.bfloat16).float()
            total = products[:, 0]
            for k in range(1, products.shape[1]):
                total = total + products[:, k]
            final = total.to(torch.bfloat16)
        else:
            final = kc.topk_sum_bf16(torch, out.to(torch.bfloat16), w32)
        found[name] = ((final.double() - ref).norm() / ref.norm()).item()
    found["output_rounded_once"] = ((bf(ref) - ref).norm() / ref.norm()).item()
    return found


def main() -> int:
    import torch

    from gptoss_patch.model.checkpoint import MXFP4_SCALE_BYTES
    from gptoss_patch.numerics.kernels import DEFAULT_TOKENS, layer_shape

    kc = load_kernel_check()
    for name in sys.argv[1:] or ["20b"]:
        shape = layer_shape(None, name).shape
        started = time.monotonic()
        layer = kc.make_weights(torch, shape, MXFP4_SCALE_BYTES, "cuda", seed=1)  # the check's seed 0, plus one
        layer64 = {**layer, "b13": layer["b13"].double(), "b2": layer["b2"].double()}
        for n in DEFAULT_TOKENS:
            torch.manual_seed(1 + n)  # as kernel_check.experts draws the batch of n tokens
            x = torch.randn(n, shape["hidden_size"]).to(torch.bfloat16)
            logits = torch.randn(n, shape["num_local_experts"], dtype=torch.float32)
            errors = variants(torch, kc, x, logits, layer64, shape["experts_per_token"], layer["limit"])
            ratios = {f"{k} / floor": round(v / errors["floor"], 3) for k, v in errors.items() if k != "floor"}
            print(json.dumps({"shape": name, "tokens": n, **{k: round(v, 6) for k, v in errors.items()}, **ratios}))
        print(json.dumps({"shape": name, "seconds": round(time.monotonic() - started, 1)}))
        del layer, layer64
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
