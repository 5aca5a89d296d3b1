"""A model's shape, read in one place for every command: a local checkpoint's config.json, or the published shape of
a released gpt-oss model id, as a Recipe (model/recipe.py).

Pre-flight's memory estimate (launcher/parallel.py), numerics' kernel layer (numerics/kernels.py) and `bench --bound`
(bench/bound.py) all read it here: one set of defaults for the keys a config may leave out, one check that it is
gpt-oss, one recognition of the released names. Reading files only: no torch, no target interpreter.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gptoss_patch.errors import UsageError, cause, detail_of
from gptoss_patch.model.recipe import GPT_OSS_20B, GPT_OSS_120B, Recipe

# Released ids, and names made from them (`openai/gpt-oss-120b`, `my-gpt-oss-120b`, `gpt-oss-120b-mxfp4`).
RELEASED = (("gpt-oss-120b", GPT_OSS_120B), ("gpt-oss-20b", GPT_OSS_20B))
REQUIRED = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
            "num_local_experts")  # fmt: skip


@dataclass(frozen=True)
class ModelShape:
    recipe: Recipe
    source: str  # "its config.json" or "the published gpt-oss-120b shape"
    config: Path | None  # the config.json read; None for a released name


def read(model: str | None) -> ModelShape | None:
    """The shape of `model`: its config.json when it is a local directory that has one, else the published shape when
    it names a released gpt-oss. None when neither; UsageError, naming the file and what is wrong, when a config.json
    is there but is not a readable gpt-oss config."""
    if not model:
        return None
    directory = Path(model).expanduser()
    config = directory / "config.json"
    if config.is_file():
        return ModelShape(recipe_from_config(_load(config), name=directory.name, where=str(config)), "its config.json", config)
    released = released_recipe(model)
    if released is None:
        return None
    tag, recipe = released
    return ModelShape(recipe, f"the published {tag} shape", None)


def released_recipe(model: str) -> tuple[str, Recipe] | None:
    """(tag, recipe) of the released gpt-oss that `model` names, else None."""
    lowered = model.lower().rstrip("/")
    base = lowered.rsplit("/", 1)[-1]
    for tag, recipe in RELEASED:
        if base.endswith(tag) or f"{tag}-" in base:
            return tag, recipe
    return None


def recipe_from_config(config: dict[str, Any], *, name: str, where: str) -> Recipe:
    """A Recipe from config.json's keys as the released checkpoints spell them; what a config may leave out takes
    gpt-oss's value (alternating layers from sliding, a 128-token window, head_dim 64, the o200k_harmony
    vocabulary, a 131072-token context, swiglu limit 7.0)."""
    if config.get("model_type") != "gpt_oss":
        raise UsageError(f"{where}: model_type {config.get('model_type')!r} is not gpt-oss (gpt_oss)")
    missing = [key for key in REQUIRED if key not in config]
    per_token = config.get("num_experts_per_tok") or config.get("experts_per_token")
    if missing or per_token is None:
        lacking = missing + ([] if per_token is not None else ["num_experts_per_tok"])
        raise UsageError(f"{where} lacks what a gpt-oss config holds: {', '.join(lacking)}")
    try:
        layers = int(config["num_hidden_layers"])
        return Recipe(
            name=name,
            num_hidden_layers=layers,
            layer_types=tuple(config.get("layer_types") or _alternating(layers)),
            sliding_window=int(config.get("sliding_window") or 128),
            hidden_size=int(config["hidden_size"]),
            intermediate_size=int(config["intermediate_size"]),
            num_attention_heads=int(config["num_attention_heads"]),
            num_key_value_heads=int(config["num_key_value_heads"]),
            head_dim=int(config.get("head_dim") or 64),  # gpt-oss's (transformers' GptOssConfig); not hidden / heads
            num_local_experts=int(config["num_local_experts"]),
            experts_per_token=int(per_token),
            vocab_size=int(config.get("vocab_size") or 201088),
            max_position_embeddings=int(config.get("max_position_embeddings") or 131072),
            swiglu_limit=float(config.get("swiglu_limit") or 7.0),
            experts="mxfp4" if (config.get("quantization_config") or {}).get("quant_method") == "mxfp4" else "bf16",
        )
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{where}: a value is not what a gpt-oss config holds ({cause(exc)})") from None


def _load(config: Path) -> dict[str, Any]:
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"cannot read {config}: {cause(exc)}", detail=detail_of(exc)) from None
    if not isinstance(data, dict):
        raise UsageError(f"{config} is not a JSON object")
    return data


def _alternating(layers: int) -> tuple[str, ...]:
    """gpt-oss's layer order, sliding first (vLLM hard-codes it)."""
    return tuple("sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers))
