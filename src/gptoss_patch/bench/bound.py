"""How fast decode at concurrency 1 could be on this GPU: the memory-bandwidth bound, and how close a server gets.

At one stream a decode step is a matrix-vector product per weight: every byte a token needs is read once
from GPU memory, so no kernel can beat (bytes a token reads) / (the GPU's copy bandwidth). The bytes come
from the model's config.json through the same tensor plan `model random` writes (the released layout), so
the bound holds for a real checkpoint of that shape as well as for a random one. The bandwidth is measured on
the target's GPU by a device-to-device copy, in the target interpreter (this process never imports torch).

Engine only: data back, commands/bench.py prints.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gptoss_patch import target
from gptoss_patch.errors import InterpreterFailed, UsageError
from gptoss_patch.model import Recipe, TensorSpec, tensor_plan

KV_BYTES = 2  # bf16 KV cache, vLLM's default for gpt-oss ("auto" follows the model's dtype)
PROBE_TIMEOUT = 120.0  # seconds for the copy-bandwidth probe (torch's import and CUDA's start included)
# Two 1 GiB buffers: far beyond the L2 cache (50 MB on an H100), small enough to fit beside anything.
COPY_PROBE = r"""
import json, sys
try:
    import torch
except ImportError as exc:
    print(json.dumps({"error": f"torch cannot be imported: {exc}"})); sys.exit(0)
if not torch.cuda.is_available():
    print(json.dumps({"error": "torch sees no CUDA GPU"})); sys.exit(0)
size = 1 << 30
src = torch.empty(size, dtype=torch.uint8, device="cuda")
dst = torch.empty_like(src)
for _ in range(3):
    dst.copy_(src)
torch.cuda.synchronize()
best = 0.0
for _ in range(5):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1000
    best = max(best, 2 * size * 10 / seconds / 1e9)  # bytes read + bytes written
print(json.dumps({"gb_per_s": best, "device": torch.cuda.get_device_name()}))
""".replace("print(json.dumps(", f"print({target.ANSWER!r} + json.dumps(")  # target.call's framing


@dataclass(frozen=True)
class DecodeBytes:
    """What one output token reads at concurrency 1, in bytes, by kind."""

    experts: int  # the routed experts of every layer: top-k of num_local_experts
    attention: int  # q/k/v/o weights and biases, sinks
    lm_head: int
    other: int  # router, norms, one embedding row
    kv_cache: int  # keys and values up to the mean context (sliding layers: at most the window)
    context: int

    @property
    def total(self) -> int:
        return self.experts + self.attention + self.lm_head + self.other + self.kv_cache


@dataclass(frozen=True)
class Bandwidth:
    gb_per_s: float
    device: str


@dataclass(frozen=True)
class Bound:
    """The bound for one model on one GPU; `fraction(tpot)` is how close a measured step time gets."""

    bytes: DecodeBytes
    bandwidth: Bandwidth

    @property
    def ms_per_token(self) -> float:
        return self.bytes.total / (self.bandwidth.gb_per_s * 1e9) * 1000

    def fraction(self, tpot_ms: float, gpus: int = 1) -> float:
        """The bound over a measured step time for a server on `gpus` GPUs (TP, PP, DP: each reads its share of
        the bytes at the measured per-GPU bandwidth, so the bound is `gpus` times shorter)."""
        return self.ms_per_token / max(1, gpus) / tpot_ms if tpot_ms > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "bytes": {**asdict(self.bytes), "total": self.bytes.total},
            "bandwidth": asdict(self.bandwidth),
            "ms_per_token": round(self.ms_per_token, 4),
        }


def recipe_from_model(model: str) -> Recipe:
    """The shape of a local gpt-oss checkpoint, from its config.json (model/shape.py, the one reader)."""
    from gptoss_patch.model import shape as model_shapes

    if not (Path(model) / "config.json").is_file():
        raise UsageError(f"--bound needs a local model directory with a config.json: {model} has none")
    try:
        found = model_shapes.read(model)
    except UsageError as exc:
        raise UsageError(f"--bound: {exc}", hint=exc.hint, detail=exc.detail) from None
    assert found is not None  # a directory with a config.json always has a shape or an error
    return found.recipe


def decode_bytes(recipe: Recipe, context: int) -> DecodeBytes:
    """Bytes one token reads at concurrency 1 with `context` tokens in the KV cache."""
    kinds = {"experts": 0, "attention": 0, "lm_head": 0, "other": 0}
    for spec in tensor_plan(recipe):
        kind, nbytes = _share(recipe, spec)
        kinds[kind] += nbytes
    kv = 0
    for layer_type in recipe.layer_types:
        tokens = min(context, recipe.sliding_window) if layer_type == "sliding_attention" else context
        kv += tokens * recipe.num_key_value_heads * recipe.head_dim * 2 * KV_BYTES  # keys and values
    return DecodeBytes(**kinds, kv_cache=kv, context=context)


def _share(recipe: Recipe, spec: TensorSpec) -> tuple[str, int]:
    """Which kind a tensor is, and how many of its bytes one token reads."""
    if ".mlp.experts." in spec.name:  # first dimension: the experts; a token visits top-k of them
        return "experts", spec.nbytes * recipe.experts_per_token // recipe.num_local_experts
    if ".self_attn." in spec.name:
        return "attention", spec.nbytes
    if spec.name == "lm_head.weight":
        return "lm_head", spec.nbytes
    if spec.name == "model.embed_tokens.weight":  # one row: the token's own embedding
        return "other", spec.nbytes // recipe.vocab_size
    return "other", spec.nbytes


def measure_bandwidth(python: str) -> Bandwidth:
    """The GPU's device-to-device copy bandwidth (bytes read + written), best of 5 x 10 copies of 1 GiB."""
    what = f"--bound needs a CUDA GPU in {python}"
    try:
        answer = target.call(python, COPY_PROBE, what=what, timeout=PROBE_TIMEOUT).answer
    except InterpreterFailed as exc:  # no torch that runs, no GPU: a usage error (exit 2), as the probe's own answer
        raise UsageError(str(exc), detail=exc.detail, last_lines=exc.last_lines) from None
    if not isinstance(answer, dict) or "gb_per_s" not in answer:
        reason = answer.get("error") if isinstance(answer, dict) else None
        raise UsageError(f"{what}: {reason or 'no answer'}")
    return Bandwidth(float(answer["gb_per_s"]), str(answer.get("device", "")))
