"""How fast decode at concurrency 1 could be on this GPU: the memory-bandwidth bound, and how close a server gets.

At one stream a decode step is a matrix-vector product per weight: every byte a token needs is read once
from GPU memory, so no kernel can beat (bytes a token reads) / (the GPU's copy bandwidth). The bytes come
from the model's config.json through the same tensor plan `model random` writes (the released layout), so
the bound holds for a real checkpoint of that shape as well as for a random one. The bandwidth is measured on
the target's GPU by a device-to-device copy, in the target interpreter (this process never imports torch).

Engine only: data back, commands/bench.py prints.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gptoss_patch import target
from gptoss_patch.errors import InterpreterFailed, UsageError, cause, detail_of
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
    """The shape of a local gpt-oss checkpoint, from its config.json (released keys, as `model random` writes)."""
    config_file = Path(model) / "config.json"
    if not config_file.is_file():
        raise UsageError(f"--bound needs a local model directory with a config.json: {model} has none")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"--bound: cannot read {config_file}: {cause(exc)}", detail=detail_of(exc)) from None
    if config.get("model_type") != "gpt_oss":
        raise UsageError(f"--bound knows gpt-oss only: {config_file} says model_type {config.get('model_type')!r}")
    try:
        layers = int(config["num_hidden_layers"])
        return Recipe(
            name=str(config.get("_name_or_path") or Path(model).name),
            num_hidden_layers=layers,
            layer_types=tuple(config.get("layer_types") or _alternating(layers)),
            sliding_window=int(config["sliding_window"]),
            hidden_size=int(config["hidden_size"]),
            intermediate_size=int(config["intermediate_size"]),
            num_attention_heads=int(config["num_attention_heads"]),
            num_key_value_heads=int(config["num_key_value_heads"]),
            head_dim=int(config["head_dim"]),
            num_local_experts=int(config["num_local_experts"]),
            experts_per_token=int(config.get("num_experts_per_tok") or config["experts_per_token"]),
            vocab_size=int(config["vocab_size"]),
            experts="mxfp4" if (config.get("quantization_config") or {}).get("quant_method") == "mxfp4" else "bf16",
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise UsageError(f"--bound: {config_file} lacks what a gpt-oss config holds ({exc})") from None


def _alternating(layers: int) -> tuple[str, ...]:
    return tuple("sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers))


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
