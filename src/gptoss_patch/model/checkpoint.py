"""The checkpoint's tensors in the released layout (names, shapes, dtypes, how each is filled), planned without
allocating any, and their split into safetensors files."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gptoss_patch.errors import UsageError
from gptoss_patch.model.recipe import Recipe

MXFP4_BLOCK = 32  # values per e8m0 scale (OCP MX); 16 bytes of two e2m1 nibbles each
# e8m0 scale bytes are 2^(byte-127): 118..122 keeps |weight| <= 6 * 2^-5, about a bf16 init's range.
MXFP4_SCALE_BYTES = (118, 122)
SHARD_BYTES = 2 * 2**30  # a new safetensors file once this much is in the current one


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of the checkpoint: its name in the released layout, shape, dtype and how it is filled."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # "bf16" | "uint8"
    init: str  # "normal" (std 0.02) | "ones" | "nibbles" (any byte) | "scales" (MXFP4_SCALE_BYTES)

    @property
    def nbytes(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count * (2 if self.dtype == "bf16" else 1)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype, "init": self.init}


def tensor_plan(recipe: Recipe) -> list[TensorSpec]:
    """Every tensor of the checkpoint, in file order, without allocating any (tests check it against vLLM)."""
    hidden, inter, experts = recipe.hidden_size, recipe.intermediate_size, recipe.num_local_experts
    q_size, kv_size = recipe.num_attention_heads * recipe.head_dim, recipe.num_key_value_heads * recipe.head_dim
    if recipe.experts == "mxfp4" and (hidden % MXFP4_BLOCK or inter % MXFP4_BLOCK):
        raise UsageError(f"{recipe.name}: MXFP4 needs hidden and intermediate sizes divisible by {MXFP4_BLOCK}")
    specs = [TensorSpec("model.embed_tokens.weight", (recipe.vocab_size, hidden), "bf16", "normal")]
    for layer in range(recipe.num_hidden_layers):
        p = f"model.layers.{layer}."
        specs += [
            TensorSpec(p + "input_layernorm.weight", (hidden,), "bf16", "ones"),
            TensorSpec(p + "self_attn.q_proj.weight", (q_size, hidden), "bf16", "normal"),
            TensorSpec(p + "self_attn.q_proj.bias", (q_size,), "bf16", "normal"),
            TensorSpec(p + "self_attn.k_proj.weight", (kv_size, hidden), "bf16", "normal"),
            TensorSpec(p + "self_attn.k_proj.bias", (kv_size,), "bf16", "normal"),
            TensorSpec(p + "self_attn.v_proj.weight", (kv_size, hidden), "bf16", "normal"),
            TensorSpec(p + "self_attn.v_proj.bias", (kv_size,), "bf16", "normal"),
            TensorSpec(p + "self_attn.o_proj.weight", (hidden, q_size), "bf16", "normal"),
            TensorSpec(p + "self_attn.o_proj.bias", (hidden,), "bf16", "normal"),
            TensorSpec(p + "self_attn.sinks", (recipe.num_attention_heads,), "bf16", "normal"),
            TensorSpec(p + "post_attention_layernorm.weight", (hidden,), "bf16", "ones"),
            TensorSpec(p + "mlp.router.weight", (experts, hidden), "bf16", "normal"),
            TensorSpec(p + "mlp.router.bias", (experts,), "bf16", "normal"),
        ]
        e = p + "mlp.experts."
        if recipe.experts == "mxfp4":
            specs += [
                TensorSpec(e + "gate_up_proj_blocks", (experts, 2 * inter, hidden // MXFP4_BLOCK, MXFP4_BLOCK // 2), "uint8", "nibbles"),
                TensorSpec(e + "gate_up_proj_scales", (experts, 2 * inter, hidden // MXFP4_BLOCK), "uint8", "scales"),
                TensorSpec(e + "down_proj_blocks", (experts, hidden, inter // MXFP4_BLOCK, MXFP4_BLOCK // 2), "uint8", "nibbles"),
                TensorSpec(e + "down_proj_scales", (experts, hidden, inter // MXFP4_BLOCK), "uint8", "scales"),
            ]
        else:
            specs += [
                TensorSpec(e + "gate_up_proj", (experts, hidden, 2 * inter), "bf16", "normal"),
                TensorSpec(e + "down_proj", (experts, inter, hidden), "bf16", "normal"),
            ]
        specs += [
            TensorSpec(e + "gate_up_proj_bias", (experts, 2 * inter), "bf16", "normal"),
            TensorSpec(e + "down_proj_bias", (experts, hidden), "bf16", "normal"),
        ]
    specs += [
        TensorSpec("model.norm.weight", (hidden,), "bf16", "ones"),
        TensorSpec("lm_head.weight", (recipe.vocab_size, hidden), "bf16", "normal"),
    ]
    return specs


def shard_plan(specs: list[TensorSpec], limit: int = SHARD_BYTES) -> list[list[TensorSpec]]:
    """Consecutive groups of at most `limit` bytes (a larger tensor gets a file of its own)."""
    shards: list[list[TensorSpec]] = [[]]
    size = 0
    for spec in specs:
        if shards[-1] and size + spec.nbytes > limit:
            shards.append([])
            size = 0
        shards[-1].append(spec)
        size += spec.nbytes
    return shards


def checkpoint_bytes(recipe: Recipe) -> int:
    return sum(spec.nbytes for spec in tensor_plan(recipe))
