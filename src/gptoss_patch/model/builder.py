"""Writing a model directory: build_random.py run in the target interpreter into a temporary sibling, stamped,
then renamed into place, so the directory is either absent or a whole model."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from gptoss_patch import target, vocab
from gptoss_patch.errors import UsageError, WriteFailed
from gptoss_patch.fsutil import sha256
from gptoss_patch.model.checkpoint import MXFP4_SCALE_BYTES, checkpoint_bytes, shard_plan, tensor_plan
from gptoss_patch.model.recipe import BUILDER, Recipe

STAMP = "gptoss-patch-model.json"  # written last inside the model directory: what built it, and how
BUILD_TIMEOUT = 600  # seconds; the tiny build takes about 13 s on 2 cores, so this only catches a hung builder
BUILD_BYTES_PER_SECOND = 10 * 2**20  # plus this much time per checkpoint byte for the large shapes (CPU, slow disk)
# The stamp's "weights" (and `model random --json`'s): safetensors of random values, or none (--no-weights).
WEIGHTS_RANDOM, WEIGHTS_NONE = "random", "none"


def build(
    python: str | Path, out: Path, recipe: Recipe, vocab_file: Path, *, timeout: float | None = None, force: bool = False,
    weights: bool = True,
) -> Path:
    """Write the model for `recipe` to `out` with the interpreter `python`; returns `out`.

    `weights=False` writes everything but the weights (config.json, generation_config.json, the tokenizer: no
    safetensors, no index), for vLLM's `--load-format dummy`, which makes random weights of the config's shape at
    load; the tokenizer still needs the interpreter's transformers.

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
        timeout = BUILD_TIMEOUT + (checkpoint_bytes(recipe) / BUILD_BYTES_PER_SECOND if weights else 0)
    staging = _staging_dir(out)
    try:
        summary = _run_builder(python, _payload(recipe, Path(vocab_file), staging, weights=weights), timeout)
        _write_stamp(staging, recipe, python, summary, weights=weights)
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


def _payload(recipe: Recipe, vocab_file: Path, staging: Path, *, weights: bool = True) -> dict[str, Any]:
    return {
        "recipe": recipe.to_json(),
        "config": recipe.hf_config(),
        "vocab_file": str(vocab_file.resolve()),
        "out": str(staging),
        "shards": [[spec.to_json() for spec in shard] for shard in shard_plan(tensor_plan(recipe))] if weights else [],
        "mxfp4_scale_bytes": list(MXFP4_SCALE_BYTES),
        "weights": weights,
    }


def _run_builder(python: str | Path, payload: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run build_random.py in `python`; its summary. Raises InterpreterFailed naming its last stderr line."""
    started = time.monotonic()
    ran = target.call(
        python, BUILDER, what=f"building the model with {python} failed", timeout=timeout, stdin=json.dumps(payload),
        env=_builder_env(),
    )  # fmt: skip
    summary = ran.answer if isinstance(ran.answer, dict) else {}
    return {**summary, "wall_seconds": round(time.monotonic() - started, 1)}


def _make_readable(staging: Path) -> None:
    # mkdtemp (and safetensors, for its file) create private modes; a server may run as another user.
    os.chmod(staging, 0o755)
    for path in staging.iterdir():
        os.chmod(path, 0o644)


def _builder_env() -> dict[str, str]:
    # Offline by construction: nothing in the build may reach a model hub, even by accident.
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}


def _write_stamp(staging: Path, recipe: Recipe, python: str | Path, summary: dict[str, Any], *, weights: bool) -> None:
    stamp = {
        "recipe": recipe.to_json(),
        "digest": recipe.digest(),
        "weights": WEIGHTS_RANDOM if weights else WEIGHTS_NONE,
        "python": str(python),
        "parameters": summary.get("parameters"),
        "bytes": summary.get("bytes"),
        "device": summary.get("device"),
        "build_seconds": summary.get("wall_seconds"),
    }
    (staging / STAMP).write_text(json.dumps(stamp, indent=2) + "\n", encoding="utf-8")
