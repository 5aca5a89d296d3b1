"""GPU profiles: what to add to `vllm serve` for gpt-oss on each GPU family, limited to what this vLLM supports.

Every setting carries the reason it is there (a known-issue id from docs/known-issues.md where one
applies). A profile item the installed version cannot express becomes a note saying so, never a guess.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gptoss_patch.errors import UsageError
from gptoss_patch.launcher import PROFILES, gpus
from gptoss_patch.launcher.options import GpuChoice
from gptoss_patch.launcher.results import Setting
from gptoss_patch.launcher.static import Capabilities

SM12X = ("sm120", "sm121")
# nvidia-smi's compute_cap -> profile. B200/GB200 report 10.0, B300 10.3, RTX 50xx/PRO 12.0, GB10 12.1.
CAPABILITY_PROFILES = {"9.0": "sm90", "10.0": "sm100", "10.3": "sm100", "12.0": "sm120", "12.1": "sm121"}

# gpt-oss raises the maximum CUDA-graph capture size to 1024; vLLM's default list up to it has 83 sizes (G20).
MAX_CAPTURE_SIZE = 1024
MAX_CAPTURE_FLAG = "--max-cudagraph-capture-size"
# The Hopper profile captures up to 2048 tokens, the maximum of vLLM's own recipe (bench/recipe.py): a prompt pass of
# 16 prompts x 128 tokens then replays a graph instead of running eagerly (docs/performance.md, G20).
PROMPT_CAPTURE_SIZE = 2048
PROMPT_CAPTURE_WHY = (
    f"capture CUDA graphs up to {PROMPT_CAPTURE_SIZE} tokens (the maximum of vLLM's GPT-OSS_Hopper.yaml recipe) instead "
    f"of vLLM's {MAX_CAPTURE_SIZE} for gpt-oss, so that a prompt pass of up to {PROMPT_CAPTURE_SIZE} batched tokens "
    "(16 prompts of 128) replays a graph instead of running eagerly: that pass took 28-33 % of its time on an H100 "
    "(20b) and an H200 (120b shape), vLLM 0.20.2, docs/performance.md; it costs start-up time (76 s more on the 20b "
    "on an H100) and graph memory. "
    f"vLLM's choice back: {MAX_CAPTURE_FLAG} {MAX_CAPTURE_SIZE} after -- (G20)"
)
MARLIN_FAMILY = "MARLIN"
GB10_MEMORY_UTILIZATION = "0.85"

# What Marlin's MXFP4 MoE kernel trades against the Triton one vLLM picks on Hopper: the one place for the
# figures (issue #24; vLLM 0.20.2). Speed: `bench`, generation at one stream. Error: `numerics --level kernels`
# on an H200, gpt-oss-20b layer shape, random MXFP4 experts, relative error against float64 at 1, 8, 64 and 512
# tokens: Marlin 4.98e-3 to 5.90e-3, Triton 3.23e-3 to 4.50e-3; Marlin's reruns of one 512-token batch differ
# (max 6.25e-2) and a token's output depends on its batch (1.56e-2 at 512 tokens), Triton's are bitwise equal
# and batch-invariant at every size.
MARLIN_SPEED = "1.29× generation at one stream on the 20b shape on an H100, 1.86× on 120b at TP=1 on an H200"
MARLIN_ERROR = "1.5× the kernel error against float64 of vLLM's Triton kernel"
MARLIN_UNREPRODUCIBLE = "its prompt pass is not reproducible run to run"
SM90_MOE_NOTE = (
    "MXFP4 MoE kernel left to vLLM (Triton on Hopper), the more accurate one, batch-invariant in the MoE. "
    f"--fast-moe pins Marlin: faster ({MARLIN_SPEED}), but {MARLIN_ERROR}, and {MARLIN_UNREPRODUCIBLE}"
)


@dataclass(frozen=True)
class ProfileResult:
    settings: tuple[Setting, ...]
    notes: tuple[str, ...]
    moe_pin: Setting | None  # the setting that pins the MXFP4 MoE backend to Marlin, if any


# -- choosing the profile ------------------------------------------------------------------------


def choose_gpu(requested: str | None, *, run: Callable[..., Any] | None = None) -> GpuChoice:
    if requested is not None:
        if requested not in PROFILES:
            raise UsageError(f"unknown GPU profile {requested!r}; choose one of {', '.join(PROFILES)}")
        return GpuChoice(requested, "--gpu", detected=True)
    return detect_gpu(run=run)


def detect_gpu(*, environ: Mapping[str, str] | None = None, run: Callable[..., Any] | None = None) -> GpuChoice:
    """The profile of the GPUs a CUDA process will see (launcher/gpus.py: nvidia-smi and CUDA_VISIBLE_DEVICES; all of
    nvidia-smi's GPUs when that selection leaves none, which the `gpus` check then explains); no nvidia-smi means no
    NVIDIA GPU to configure."""
    found = gpus.inventory(os.environ if environ is None else environ, run=run)
    if found is None:
        return GpuChoice("cpu", "no nvidia-smi on PATH", detected=False)
    if found.problem:
        raise UsageError(f"{found.problem}; pass --gpu to choose a profile")
    capabilities = sorted({gpu.capability for gpu in found.visible or found.gpus})
    if len(capabilities) != 1:
        listed = ", ".join(capabilities) or "no GPU"
        raise UsageError(f"nvidia-smi reports {listed}; pass --gpu {'|'.join(PROFILES)} to choose a profile")
    cap = capabilities[0]
    if cap not in CAPABILITY_PROFILES:
        raise UsageError(f"compute capability {cap} has no gpt-oss profile; pass --gpu {'|'.join(PROFILES)}")
    return GpuChoice(CAPABILITY_PROFILES[cap], f"nvidia-smi: compute capability {cap}", detected=True)


# -- CUDA-graph capture sizes (G20) --------------------------------------------------------------


def parse_concurrency(text: str | None, *, max_size: int = MAX_CAPTURE_SIZE) -> tuple[int, ...]:
    """`1,5,10` -> (1, 5, 10): the batch sizes the user runs at, each to get its own CUDA graph."""
    if text is None:
        return ()
    try:
        sizes = tuple(int(item) for item in text.split(","))
    except ValueError:
        sizes = ()
    if not sizes or any(not 1 <= size <= max_size for size in sizes):
        raise UsageError(f"--concurrency {text!r}: expected comma-separated batch sizes from 1 to {max_size}, e.g. 1,5,10")
    return tuple(sorted(set(sizes)))


def default_capture_sizes(max_size: int = MAX_CAPTURE_SIZE, batched_tokens: int | None = None) -> list[int]:
    """vLLM's default list: [1, 2, 4] + 8..248 step 8 + 256..max step 16 (G20; 83 sizes up to 1024, 147 up to 2048),
    cut at --max-num-batched-tokens and ending on it when it fits, as VllmConfig._set_cudagraph_sizes builds it."""
    ceiling = min(max_size, batched_tokens) if batched_tokens else max_size
    sizes = [size for size in (1, 2, 4, *range(8, 256, 8), *range(256, ceiling + 1, 16)) if size <= ceiling]
    return sorted({*sizes, ceiling}) if batched_tokens and batched_tokens <= max_size else sizes


CAPTURE_SIZE_FLAGS = ("--cudagraph-capture-sizes", "--cuda-graph-sizes")  # 0.11.2+, then 0.10.x-0.11.x


def is_capture_setting(setting: Setting) -> bool:
    """The capture sizes in any spelling, or the profile's maximum capture size (prompt_capture)."""
    if setting.name == "--compilation-config":
        return "cudagraph_capture_size" in "".join(setting.values)
    return setting.name in (*CAPTURE_SIZE_FLAGS, MAX_CAPTURE_FLAG)


def capture_sizes_setting(
    concurrency: tuple[int, ...], caps: Capabilities, max_size: int = MAX_CAPTURE_SIZE, batched_tokens: int | None = None
) -> Setting:
    """The explicit list: vLLM's own sizes up to `max_size` (and --max-num-batched-tokens) plus the --concurrency
    values; the list alone fixes the maximum, so it replaces prompt_capture's flag (plan._capture_sizes)."""
    defaults = default_capture_sizes(max_size, batched_tokens)
    added = [size for size in concurrency if size not in defaults]
    sizes = [str(size) for size in sorted({*defaults, *concurrency})]
    why = (
        f"capture CUDA graphs for batch sizes {', '.join(map(str, added)) or 'already in the list'} on top of vLLM's "
        f"{len(defaults)} sizes up to {defaults[-1]}: a batch of 5 would pad to 8 and 10 to 16 (-5 % and -9 % "
        "generation on an H100, G20)"
    )
    if max_size > MAX_CAPTURE_SIZE and defaults[-1] > MAX_CAPTURE_SIZE:
        why += f"; up to {defaults[-1]} so that prompt passes replay graphs too ({MAX_CAPTURE_FLAG} {MAX_CAPTURE_SIZE} after -- for vLLM's {MAX_CAPTURE_SIZE})"
    for flag in CAPTURE_SIZE_FLAGS:
        if caps.has_flag(flag):
            return Setting.flag(flag, *sizes, why=why)
    if caps.has_flag("--compilation-config"):
        return Setting.flag("--compilation-config", json.dumps({"cudagraph_capture_sizes": [int(s) for s in sizes]}), why=why)
    raise UsageError(f"vLLM {caps.version} has no flag for CUDA-graph capture sizes; drop --concurrency")


def prompt_capture(caps: Capabilities) -> Setting | str:
    """Hopper: CUDA graphs up to the recipe's 2048 tokens, so prompt passes replay graphs too (PROMPT_CAPTURE_WHY)."""
    if not caps.has_flag(MAX_CAPTURE_FLAG):
        return f"CUDA-graph capture sizes left to vLLM: vLLM {caps.version} has no {MAX_CAPTURE_FLAG}"
    return Setting.flag(MAX_CAPTURE_FLAG, str(PROMPT_CAPTURE_SIZE), why=PROMPT_CAPTURE_WHY)


def capture_ceiling(settings: tuple[Setting, ...] | list[Setting]) -> int:
    """The largest size the profile captures: prompt_capture's where it is among `settings`, else vLLM's for gpt-oss."""
    chosen = next((s for s in settings if s.kind == "flag" and s.name == MAX_CAPTURE_FLAG), None)
    return int(chosen.values[0]) if chosen is not None else MAX_CAPTURE_SIZE


# -- the profiles --------------------------------------------------------------------------------


def profile_settings(profile: str, caps: Capabilities, *, fast_moe: bool = False) -> ProfileResult:
    """The profile's settings and notes; `fast_moe`: --fast-moe, Marlin's MoE kernel on sm90 (fast_moe_choice)."""
    settings: list[Setting] = []
    notes: list[str] = []
    pin: Setting | None = None
    for rule in _RULES[profile]:
        outcome = rule(caps)
        if isinstance(outcome, Setting):
            settings.append(outcome)
            pin = outcome if rule is pin_marlin else pin
        elif outcome:
            notes.append(outcome)
    choice = fast_moe_choice(profile, caps, fast_moe)
    if isinstance(choice, Setting):
        settings.insert(0, choice)
    elif choice:
        notes.append(choice)
    return ProfileResult(tuple(settings), tuple(notes), pin)


def fast_moe_choice(profile: str, caps: Capabilities, fast_moe: bool) -> Setting | str | None:
    """--fast-moe: the Marlin pin on sm90 (opt-in: it costs accuracy and reproducibility, SM90_MOE_NOTE), a note
    elsewhere that it changes nothing; without it, sm90's note on what is left out and why."""
    if profile == "sm90":
        return hopper_marlin(caps) if fast_moe else SM90_MOE_NOTE
    if not fast_moe:
        return None
    if profile in SM12X:
        return (
            f"--fast-moe changes nothing on {profile}: Marlin is already pinned, the only MXFP4 MoE kernel stock vLLM "
            "has on SM12x"
        )
    return f"--fast-moe changes nothing on {profile}: it pins Marlin on sm90 (Hopper) only"


def pin_marlin(caps: Capabilities) -> Setting | str:
    """SM12x: name the MXFP4 MoE kernel instead of trusting auto-selection (G14)."""
    why = (
        "SM12x: pin the MXFP4 MoE kernel to Marlin, the one stock vLLM auto-selects on SM12x, so that a build "
        "or ranking that picks CUTLASS FP4 instead shows in the startup log and is stopped (G14)"
    )
    spelling = marlin_pin_spelling(caps)
    if spelling is None:
        return f"MXFP4 MoE backend not pinned: vLLM {caps.version} reads neither --moe-backend nor VLLM_MXFP4_USE_MARLIN for MXFP4"
    kind, name, value = spelling
    return Setting.flag(name, value, why=why) if kind == "flag" else Setting.env(name, value, why=why)


def moe_flag_selects(caps: Capabilities, backend: str | None = None) -> bool:
    """Whether `--moe-backend` picks gpt-oss's MXFP4 experts on this version (BACKEND among its choices, if given): the
    flag exists from 0.17, but the MXFP4 selector ignores it until 0.19 (docs/vllm-layouts.md#mxfp4-moe-backend-selection)."""
    moe = caps.moe
    return moe.honours_moe_backend and caps.has_flag("--moe-backend") and (backend is None or backend in moe.choices)


def marlin_pin_spelling(caps: Capabilities) -> tuple[str, str, str] | None:
    """How this version pins MXFP4 MoE to Marlin: the flag where the selector honours it, else the env var.

    `--moe-backend` exists from 0.17 but the MXFP4 selector ignores it until 0.19 (docs/vllm-layouts.md#mxfp4-moe-backend-selection);
    VLLM_MXFP4_USE_MARLIN is read up to 0.23 (deprecated from 0.22.1) and removed in 0.24 (G15).
    """
    if moe_flag_selects(caps, "marlin"):
        return ("flag", "--moe-backend", "marlin")
    if "VLLM_MXFP4_USE_MARLIN" in caps.moe.env_reads and caps.env.knows("VLLM_MXFP4_USE_MARLIN"):
        return ("env", "VLLM_MXFP4_USE_MARLIN", "1")
    return None


def hopper_marlin(caps: Capabilities) -> Setting | str:
    """SM90 with --fast-moe: Marlin's MXFP4 MoE kernel, faster than the Triton kernel vLLM picks on Hopper but
    less accurate and not reproducible run to run (MARLIN_SPEED, MARLIN_ERROR); never the default."""
    if not moe_flag_selects(caps, "marlin"):
        return f"--fast-moe: MXFP4 MoE backend left to vLLM: {caps.version}'s MXFP4 selector does not take --moe-backend marlin"
    why = (
        f"--fast-moe: Marlin's MXFP4 MoE kernel instead of the Triton one vLLM picks on Hopper: {MARLIN_SPEED} "
        f"(vLLM 0.20.2, docs/performance.md); it costs {MARLIN_ERROR}, and {MARLIN_UNREPRODUCIBLE}"
    )
    return Setting.flag("--moe-backend", "marlin", why=why)


def kv_cache_fp8(caps: Capabilities) -> Setting | str:
    if not caps.has_flag("--kv-cache-dtype"):
        return f"--kv-cache-dtype fp8 not set: vLLM {caps.version} has no --kv-cache-dtype"
    return Setting.flag(
        "--kv-cache-dtype", "fp8", why="Blackwell has native FP8: an FP8 KV cache halves KV memory, so more sequences fit"
    )


def flashinfer_mxfp4_mxfp8(caps: Capabilities) -> Setting | str:
    """SM100: FlashInfer's MXFP4 x MXFP8 MoE, only where this version's MXFP4 selector still reads the variable."""
    name = "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8"
    if name in caps.moe.env_reads and caps.reads_env(name):
        why = "SM100: FlashInfer MXFP4 x MXFP8 MoE, faster than the BF16-activation default (vLLM notes it may cost accuracy)"
        return Setting.env(name, "1", why=why)
    if caps.env.knows(name):
        return f"{name} not set: deprecated in vLLM {caps.version} ({caps.env.deprecated.get(name) or 'see envs.py'})"
    return f"{name} not set: vLLM {caps.version} does not read it (removed in 0.24; G15)"


def unified_memory_cap(caps: Capabilities) -> Setting | str:
    if not caps.has_flag("--gpu-memory-utilization"):
        return f"--gpu-memory-utilization not set: vLLM {caps.version} has no such flag"
    why = (
        "GB10 unified memory: profiling and the page cache are not bounded by this fraction; above 0.85-0.90 "
        "start-up can freeze the host or be OOM-killed (G17)"
    )
    return Setting.flag("--gpu-memory-utilization", GB10_MEMORY_UTILIZATION, why=why)


_RULES: dict[str, tuple[Callable[[Capabilities], Setting | str | None], ...]] = {
    # Attention: auto-selection is right on Hopper (FA3 with sinks); forcing FLASHINFER breaks it (G21).
    # The MoE kernel: vLLM's (Triton) unless --fast-moe (fast_moe_choice).
    # Capture sizes: up to the recipe's 2048 tokens, so prompt passes replay graphs too (prompt_capture).
    "sm90": (prompt_capture,),
    "sm100": (kv_cache_fp8, flashinfer_mxfp4_mxfp8),
    "sm120": (pin_marlin, kv_cache_fp8),
    "sm121": (pin_marlin, kv_cache_fp8, unified_memory_cap),
    "cpu": (),  # no GPU: nothing GPU-specific to set
}
