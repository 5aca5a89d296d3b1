"""Facts from docs/known-issues.md the checks act on: moved env vars, no-op variables, folklore flags,
and the log lines of known crashes. Version-dependent answers are computed from the installed code
(static.Capabilities), so one table serves every release.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from packaging.version import InvalidVersion, Version

from gptoss_patch.launcher.plan import MARLIN_ENV, switch_value
from gptoss_patch.launcher.profiles import marlin_pin_spelling
from gptoss_patch.launcher.results import KnownIssue
from gptoss_patch.launcher.static import Capabilities

# MoE variables removed in 0.24 (deprecated from 0.22.1), with the flags that replaced them (G15).
MOE_ENV_FLAGS = {
    "VLLM_MXFP4_USE_MARLIN": "--moe-backend marlin",
    "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8": "--moe-backend flashinfer_trtllm --quantization-config.moe.activation mxfp8",
    "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8_CUTLASS": "--moe-backend flashinfer_cutlass --quantization-config.moe.activation mxfp8",
    "VLLM_USE_FLASHINFER_MOE_MXFP4_BF16": "--moe-backend flashinfer_trtllm (or flashinfer_cutlass)",
    "VLLM_USE_FLASHINFER_MOE_FP4": "--moe-backend flashinfer_trtllm (or flashinfer_cutlass, flashinfer_cutedsl)",
    "VLLM_USE_FLASHINFER_MOE_FP8": "--moe-backend flashinfer_trtllm (or flashinfer_cutlass)",
    "VLLM_USE_FLASHINFER_MOE_FP16": "--moe-backend flashinfer_trtllm (or flashinfer_cutlass)",
    "VLLM_FLASHINFER_MOE_BACKEND": "--moe-backend flashinfer_trtllm (or flashinfer_cutlass, flashinfer_cutedsl)",
}
LINEAR_ENV_FLAGS = {
    "VLLM_NVFP4_GEMM_BACKEND": "--linear-backend",
    "VLLM_USE_FBGEMM": "--linear-backend fbgemm",
    "VLLM_USE_NVFP4_CT_EMULATIONS": "--linear-backend emulation",
}
# Registered and read by vLLM, but they cannot affect stock gpt-oss (only its MoE experts are MXFP4).
NO_EFFECT_ON_GPT_OSS = {
    "VLLM_NVFP4_GEMM_BACKEND": "selects the dense NVFP4 GEMM only, never gpt-oss's MXFP4 MoE",
    "VLLM_MARLIN_USE_ATOMIC_ADD": "reaches dense Marlin layers only; the Marlin MoE path always passes use_atomic_add=False",
}
# The --moe-backend choices that can run gpt-oss's MXFP4 experts on NVIDIA GPUs (docs/vllm-layouts.md#mxfp4-moe-backend-selection).
GPT_OSS_MOE_BACKENDS = ("marlin", "triton", "flashinfer_trtllm", "flashinfer_cutlass")
# Flags that folklore scripts pass but no stock release has (docs/vllm-layouts.md#serve-flags).
FOLKLORE_FLAGS = {
    "--mxfp4-backend": "no stock release has it (fork patch sets only)",
    "--mxfp4-layers": "no stock release has it; stock gpt-oss quantizes only the MoE experts",
}


def env_replacement(name: str, value: str, caps: Capabilities) -> str | None:
    """What to write instead of an env var this vLLM does not know, or None when nothing replaces it.

    VLLM_MXFP4_USE_MARLIN's value is read as the releases that read it do (bool(int(value))): a value they refuse
    (`false`, `true`, empty) asked for nothing, so nothing replaces it."""
    if name == "VLLM_MXFP4_BACKEND":
        return _mxfp4_backend_replacement(value, caps)
    if name == "VLLM_ATTENTION_BACKEND" and caps.has_flag("--attention-backend"):
        return f"--attention-backend {value}"
    if name == MARLIN_ENV and not switch_value(value):  # None: a value vLLM refuses, which asked for nothing
        return None if switch_value(value) is None else "nothing: unset, automatic selection is the default"
    for table, flag in ((MOE_ENV_FLAGS, "--moe-backend"), (LINEAR_ENV_FLAGS, "--linear-backend")):
        if name in table and caps.has_flag(flag):
            return table[name]
    return None


def _mxfp4_backend_replacement(value: str, caps: Capabilities) -> str | None:
    """VLLM_MXFP4_BACKEND was never stock (G15): translate `marlin` to the spelling this version reads."""
    wanted = value.strip().lower()
    if wanted == "marlin":
        spelling = marlin_pin_spelling(caps)
        if spelling is None:
            return None
        kind, name, setting = spelling
        return f"{name} {setting}" if kind == "flag" else f"{name}={setting}"
    if not (wanted and caps.moe.honours_moe_backend and caps.has_flag("--moe-backend")):
        return None
    if wanted in caps.moe.choices:
        return f"--moe-backend {wanted}"
    relevant = [choice for choice in GPT_OSS_MOE_BACKENDS if choice in caps.moe.choices]
    return f"--moe-backend <{'|'.join(relevant) or 'see vllm serve --help=moe-backend'}>"


def registered_but_unread(name: str, caps: Capabilities) -> bool:
    """A MoE-selector variable this version registers but its MXFP4 selector never reads (e.g. 0.10.2-0.11.0)."""
    return name in MOE_ENV_FLAGS and name.startswith("VLLM_MXFP4") and name not in caps.moe.env_reads


# -- crashes -------------------------------------------------------------------------------------

CRASH_PATTERNS: tuple[tuple[re.Pattern[str], KnownIssue], ...] = tuple(
    (re.compile(pattern), KnownIssue(issue_id, title, fix))
    for pattern, issue_id, title, fix in (
        (
            r"error downloading or loading vocab file|invalid tiktoken vocab file",
            "G01",
            "the harmony vocabulary could not be loaded (no network, or a wrong file)",
            "gptoss-patch vocab install, then serve again (it exports TIKTOKEN_ENCODINGS_BASE)",
        ),
        (
            r"Value 'sm_121a' is not defined for option 'gpu-name'",
            "G16",
            "Triton's bundled ptxas does not know sm_121a",
            "export TRITON_PTXAS_PATH=/usr/local/cuda-13.x/bin/ptxas",
        ),
        (
            r"SM 12\.x requires CUDA >= 12\.9|CUDA compiler and CUDA toolkit headers are incompatible|cudaErrorInsufficientDriver",
            "G18",
            "FlashInfer JIT used a CUDA toolkit that does not match torch",
            "point CUDA_HOME/PATH at the toolkit matching torch.version.cuda and clear ~/.cache/flashinfer",
        ),
        (
            r"Sinks are only supported in FlashAttention 3|Sinks must be of type float32",
            "G21",
            "the forced attention backend has no attention-sink support on this GPU",
            "drop --attention-backend (or use TRITON_ATTN below SM90 and on SM12x)",
        ),
        (
            r"CUDA out of memory|OutOfMemoryError|insufficient memory|No available memory for the cache blocks",
            "G23",
            "out of memory at start-up (memory accounting changes between releases; on GB10 see G17)",
            "lower --gpu-memory-utilization or --max-model-len; on GB10 stay at or below 0.85",
        ),
        (
            r"Failed to infer device type",
            "G25",
            "vLLM found no GPU platform (CUDA wheel without a visible GPU)",
            "check nvidia-smi and CUDA_VISIBLE_DEVICES, or use a CPU build of vLLM",
        ),
        (
            r"Failed to import Triton kernels",
            "G24",
            "triton_kernels failed to import; MXFP4 falls back to Marlin",
            "install the triton_kernels matching this vLLM, or use a wheel with the vendored copy (0.13+)",
        ),
        (
            r"Unknown vLLM environment variable detected",
            "G15",
            "a VLLM_* variable this vLLM does not read",
            "gptoss-patch doctor names it and the flag that replaces it",
        ),
    )
)


def diagnose(lines: list[str] | tuple[str, ...], tail: int = 80) -> KnownIssue | None:
    """The known issue whose signature is in the last lines of the log; crash signatures rank above warnings."""
    recent = lines[-tail:]
    for pattern, issue in CRASH_PATTERNS:  # in priority order: fatal errors first, start-up warnings last
        if any(pattern.search(line) for line in recent):
            return issue
    return None


# -- the triton_kernels release behind the Triton figures (G50) ---------------------------------------

# The copy of triton_kernels vLLM's CUDA wheels vendor (vllm/third_party/triton_kernels, imported when no triton_kernels
# is installed): the triton tag of cmake/external_projects/triton_kernels.cmake in each release's sdist, read on
# 0.16.0-0.33.0 (first, end or None, tag).
VENDORED_TRITON_KERNELS = (
    ((0, 16), (0, 17), "3.5.0"),
    ((0, 17), (0, 22), "3.6.0"),
    ((0, 22), None, "3.5.1"),
)
VENDORED = "vendored in vLLM"  # distinfo.kernel_versions' word for that copy
# vllm#39236 (closed unmerged): triton_kernels 3.6.0 lost more than 30 % at batch size 1 against 3.5.1 on an H200.
SLOW_TRITON_KERNELS = "3.6"
TRITON_KERNELS_REGRESSION = (
    "triton_kernels {release} is the release that lost more than 30 % at batch size 1 on Hopper against 3.5.1 "
    "(vllm#39236, closed unmerged; G50): the Triton figures at one stream are that release's"
)


def vendored_triton_kernels(vllm: str | None) -> str | None:
    """The triton tag of the triton_kernels copy vLLM `vllm` vendors; None where it was not read (before 0.16)."""
    try:
        release = Version(vllm or "").release[:2]
    except InvalidVersion:
        return None
    for first, end, tag in VENDORED_TRITON_KERNELS:
        if first <= release and (end is None or release < end):
            return tag
    return None


def triton_kernels_release(libraries: Mapping[str, str], vllm: str | None) -> str | None:
    """The triton_kernels release gpt-oss's Triton experts run: the installed one's version, or the vendored tag."""
    found = libraries.get("triton_kernels")
    if found == VENDORED:
        return vendored_triton_kernels(vllm)
    return found if found and found[0].isdigit() else None


def kernel_library_notes(libraries: Mapping[str, str], vllm: str | None) -> list[str]:
    """The lines beside Triton figures (bench, numerics) after the versions line: which triton_kernels the vendored
    copy is, and G50's warning where it is the slow release."""
    notes = []
    release = triton_kernels_release(libraries, vllm)
    if libraries.get("triton_kernels") == VENDORED and release is not None:
        notes.append(f"triton_kernels: vLLM {vllm} vendors triton's v{release} copy (its sdist's triton_kernels.cmake)")
    if release is not None and (release == SLOW_TRITON_KERNELS or release.startswith(SLOW_TRITON_KERNELS + ".")):
        notes.append(TRITON_KERNELS_REGRESSION.format(release=release))
    return notes
