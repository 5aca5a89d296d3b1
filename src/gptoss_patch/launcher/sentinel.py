"""Recognise the MXFP4 MoE backend selection in vLLM's startup log (the only place it is visible, G14).

Line shapes, by version (docs/vllm-layouts.md#mxfp4-moe-backend-selection):
- 0.15-0.18, `quantization/mxfp4.py`: `[mxfp4.py:165] Using Marlin backend`, `... Using FlashInfer MXFP4 MXFP8
  TRTLLM backend for SM100`, `[get_mxfp4_backend_with_lora] Using Triton backend`;
- 0.19+, the MoE oracle: `Using 'MARLIN' Mxfp4 MoE backend.`;
- fork patch sets (spark-vllm-docker style): `[MXFP4] Auto-selected: CUTLASS_FP4 (...)`, `[MXFP4] Using backend: marlin`;
- vLLM's CPU build with bf16 experts (the tiny test model): `Using CPU backend for Unquantized MoE`.
"""

from __future__ import annotations

import re

_ORACLE = re.compile(r"Using '(?P<name>[A-Za-z0-9_]+)' Mxfp4 MoE backend")
_LEGACY = re.compile(r"\[(?:mxfp4\.py:\d+|get_mxfp4_backend_with_lora)\].*?Using (?P<name>Marlin|Triton) backend")
_LEGACY_FLASHINFER = re.compile(r"Using FlashInfer MXFP4 (?P<name>BF16|MXFP8 CUTLASS|MXFP8 TRTLLM) backend for (?P<sm>SM\d+)")
_FORK = re.compile(r"\[MXFP4\] (?:Auto-selected|Using backend):\s*(?P<name>[A-Za-z0-9_]+)")
_UNQUANTIZED = re.compile(r"Using (?P<name>[A-Za-z0-9_]+) backend for Unquantized MoE")


def moe_backend_in(line: str) -> str | None:
    """The backend a log line announces, upper-case (`MARLIN`, `FLASHINFER_TRTLLM_MXFP4_MXFP8`...), or None."""
    for pattern in (_ORACLE, _LEGACY, _FORK, _UNQUANTIZED):
        match = pattern.search(line)
        if match:
            return match["name"].upper()
    match = _LEGACY_FLASHINFER.search(line)
    if match:
        return f"{match['sm']}_FLASHINFER_MXFP4_{match['name'].replace(' ', '_')}".upper()
    return None


def family(backend: str) -> str:
    """BATCHED_MARLIN is Marlin too; everything else is its own family."""
    return "MARLIN" if backend.endswith("MARLIN") else backend


def contradicts(backend: str, expected: str | None) -> bool:
    return expected is not None and family(backend) != expected
