"""Decode token ids with openai_harmony's own gpt-oss encoding, in a venv that has it (never in this process)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

from gptoss_patch.vocab import venv_dir

_DECODE = r"""
import json, sys
from openai_harmony import HarmonyEncodingName, load_harmony_encoding
encoding = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
print(json.dumps([encoding.decode_utf8(ids) for ids in json.load(sys.stdin)]))
"""


def decode(python: Path, token_lists: Sequence[Sequence[int]]) -> list[str]:
    """Each list of ids as text, special tokens included (`<|start|>system<|message|>...`)."""
    vocab = str(venv_dir(Path(python).parent.parent))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIKTOKEN_")}
    env.update(TIKTOKEN_ENCODINGS_BASE=vocab, TIKTOKEN_RS_CACHE_DIR=vocab)
    proc = subprocess.run([str(python), "-c", _DECODE], input=json.dumps([list(t) for t in token_lists]),
                          capture_output=True, text=True, env=env, timeout=120, check=False)
    if proc.returncode != 0:
        raise AssertionError(f"openai_harmony could not decode in {python}: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout)
