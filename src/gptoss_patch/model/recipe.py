"""The shape of a random gpt-oss: a Recipe (every field ends up in config.json or decides the weights), the
published shapes (tiny, 20b, 120b) and config.json as the released checkpoints spell it."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gptoss_patch import vocab
from gptoss_patch.errors import UsageError

BUILDER = Path(__file__).with_name("build_random.py")  # its code is part of the cache key (Recipe.digest)
# The release gpt-oss shipped with. transformers 4.57 warns about a "wrong tokenizer regex" for any
# model saved by a version after 4.57.2 or of unknown date; the real checkpoints say this.
TRANSFORMERS_VERSION = "4.55.0.dev0"


@dataclass(frozen=True)
class Recipe:
    """The shape of the model; every field ends up in config.json or decides the random weights."""

    name: str = "gpt-oss-tiny"
    num_hidden_layers: int = 2
    # gpt-oss alternates sliding and full attention, starting with sliding; vLLM hard-codes that
    # order (sliding on even layers), so the layer types must agree with it.
    layer_types: tuple[str, ...] = ("sliding_attention", "full_attention")
    sliding_window: int = 128
    hidden_size: int = 256
    intermediate_size: int = 256
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    num_local_experts: int = 4
    experts_per_token: int = 2
    vocab_size: int = 201088  # o200k_harmony: 199998 o200k_base ranks + 1090 special tokens, padded
    max_position_embeddings: int = 131072
    initial_context_length: int = 4096
    rope_theta: float = 150000.0
    yarn_factor: float = 32.0
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    yarn_truncate: bool = False
    swiglu_limit: float = 7.0
    bos_token_id: int = 199998  # <|startoftext|>
    eos_token_id: int = 200002  # <|return|>
    pad_token_id: int = 199999  # <|endoftext|>
    seed: int = 0
    dtype: str = "bfloat16"
    # "bf16": experts as bf16 gate_up_proj/down_proj; "mxfp4": as the released checkpoints store them,
    # *_blocks (two e2m1 values a byte) and *_scales (e8m0 exponent bytes), with a quantization_config.
    experts: str = "bf16"

    def to_json(self) -> dict[str, Any]:
        return {field: list(value) if isinstance(value, tuple) else value for field, value in dataclasses.asdict(self).items()}

    def hf_config(self) -> dict[str, Any]:
        """config.json as the published gpt-oss checkpoints spell it, minus the MXFP4 quantization."""
        return {
            "architectures": ["GptOssForCausalLM"],
            "model_type": "gpt_oss",
            "num_hidden_layers": self.num_hidden_layers,
            "layer_types": list(self.layer_types),
            "sliding_window": self.sliding_window,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "num_local_experts": self.num_local_experts,
            # vLLM reads num_experts_per_tok; the original checkpoints also carry experts_per_token.
            "num_experts_per_tok": self.experts_per_token,
            "experts_per_token": self.experts_per_token,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "initial_context_length": self.initial_context_length,
            "rope_theta": self.rope_theta,
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": self.yarn_factor,
                "beta_fast": self.yarn_beta_fast,
                "beta_slow": self.yarn_beta_slow,
                "truncate": self.yarn_truncate,
                "original_max_position_embeddings": self.initial_context_length,
            },
            "swiglu_limit": self.swiglu_limit,
            "attention_bias": True,
            "attention_dropout": 0.0,
            "hidden_act": "silu",
            "rms_norm_eps": 1e-05,
            "initializer_range": 0.02,
            "router_aux_loss_coef": 0.9,
            "output_router_logits": False,
            "tie_word_embeddings": False,
            "use_cache": True,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "pad_token_id": self.pad_token_id,
            "torch_dtype": self.dtype,
            "transformers_version": TRANSFORMERS_VERSION,
            **({"quantization_config": MXFP4_QUANTIZATION} if self.experts == "mxfp4" else {}),
        }

    def digest(self) -> str:
        """The cache key: changes with the recipe, the builder's code or the vocabulary."""
        hasher = hashlib.sha256()
        hasher.update(json.dumps(self.to_json(), sort_keys=True).encode())
        hasher.update(BUILDER.read_bytes())
        hasher.update(vocab.O200K.sha256.encode())
        return hasher.hexdigest()


TINY = Recipe()
# The published shapes (config.json of openai/gpt-oss-20b and -120b); only the weights are random.
GPT_OSS_20B = Recipe(
    name="gpt-oss-20b-random",
    num_hidden_layers=24,
    layer_types=tuple("sliding_attention" if i % 2 == 0 else "full_attention" for i in range(24)),
    hidden_size=2880,
    intermediate_size=2880,
    num_attention_heads=64,
    num_key_value_heads=8,
    num_local_experts=32,
    experts_per_token=4,
    experts="mxfp4",
)
GPT_OSS_120B = dataclasses.replace(
    GPT_OSS_20B,
    name="gpt-oss-120b-random",
    num_hidden_layers=36,
    layer_types=tuple("sliding_attention" if i % 2 == 0 else "full_attention" for i in range(36)),
    num_local_experts=128,
)
SHAPES = {"tiny": TINY, "20b": GPT_OSS_20B, "120b": GPT_OSS_120B}
EXPERT_DTYPES = ("bf16", "mxfp4")
MXFP4_QUANTIZATION = {
    "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"],
    "quant_method": "mxfp4",
}


def recipe_for(shape: str, experts: str | None = None) -> Recipe:
    """The recipe for `--shape` and `--dtype` (default: bf16 for tiny, mxfp4 as released for 20b/120b)."""
    if shape not in SHAPES:
        raise UsageError(f"--shape {shape}: expected one of {', '.join(SHAPES)}")
    if experts is not None and experts not in EXPERT_DTYPES:
        raise UsageError(f"--dtype {experts}: expected one of {', '.join(EXPERT_DTYPES)}")
    recipe = SHAPES[shape]
    return recipe if experts is None or experts == recipe.experts else dataclasses.replace(recipe, experts=experts)
