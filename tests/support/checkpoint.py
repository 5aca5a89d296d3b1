"""What a gpt-oss checkpoint must hold, read without torch: the tensor names and shapes transformers saves (and
vLLM's loader maps), and a safetensors file's header. Shared by tests/model/test_tiny_model.py and
test_model_random.py."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from gptoss_patch import model


def safetensors_header(path: Path) -> dict:
    """The JSON header of a safetensors file: an 8-byte little-endian length, then that much JSON."""
    with path.open("rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        return json.loads(handle.read(length))


def expected_tensors(recipe: model.Recipe) -> dict[str, list[int]]:
    """gpt-oss's (unquantized) tensor names, as transformers saves them and vLLM's loader maps them."""
    hidden, heads, kv_heads, head_dim = recipe.hidden_size, recipe.num_attention_heads, recipe.num_key_value_heads, recipe.head_dim
    experts, inter = recipe.num_local_experts, recipe.intermediate_size
    tensors = {
        "model.embed_tokens.weight": [recipe.vocab_size, hidden],
        "model.norm.weight": [hidden],
        "lm_head.weight": [recipe.vocab_size, hidden],
    }
    for layer in range(recipe.num_hidden_layers):
        prefix = f"model.layers.{layer}"
        tensors |= {
            f"{prefix}.input_layernorm.weight": [hidden],
            f"{prefix}.post_attention_layernorm.weight": [hidden],
            f"{prefix}.self_attn.q_proj.weight": [heads * head_dim, hidden],
            f"{prefix}.self_attn.q_proj.bias": [heads * head_dim],
            f"{prefix}.self_attn.k_proj.weight": [kv_heads * head_dim, hidden],
            f"{prefix}.self_attn.k_proj.bias": [kv_heads * head_dim],
            f"{prefix}.self_attn.v_proj.weight": [kv_heads * head_dim, hidden],
            f"{prefix}.self_attn.v_proj.bias": [kv_heads * head_dim],
            f"{prefix}.self_attn.o_proj.weight": [hidden, heads * head_dim],
            f"{prefix}.self_attn.o_proj.bias": [hidden],
            f"{prefix}.self_attn.sinks": [heads],
            f"{prefix}.mlp.router.weight": [experts, hidden],
            f"{prefix}.mlp.router.bias": [experts],
            # gate and up interleaved in one tensor, [experts, in, out]: the layout vLLM slices.
            f"{prefix}.mlp.experts.gate_up_proj": [experts, hidden, 2 * inter],
            f"{prefix}.mlp.experts.gate_up_proj_bias": [experts, 2 * inter],
            f"{prefix}.mlp.experts.down_proj": [experts, inter, hidden],
            f"{prefix}.mlp.experts.down_proj_bias": [experts, hidden],
        }
    return tensors
