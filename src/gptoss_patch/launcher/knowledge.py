"""Facts from docs/known-issues.md the checks act on: moved env vars, no-op variables, folklore flags,
and the log lines of known crashes. Version-dependent answers are computed from the installed code
(static.Capabilities), so one table serves every release.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from packaging.version import InvalidVersion, Version

from gptoss_patch.launcher.plan import MARLIN_ENV, switch_value
from gptoss_patch.launcher.profiles import marlin_pin_spelling, moe_flag_selects
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
    if name == MARLIN_ENV and (on := switch_value(value)) is not True:  # None: a value vLLM refuses asked for nothing
        return None if on is None else "nothing: unset, automatic selection is the default"
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
    if not (wanted and moe_flag_selects(caps)):
        return None
    if wanted in caps.moe.choices:
        return f"--moe-backend {wanted}"
    relevant = [choice for choice in GPT_OSS_MOE_BACKENDS if choice in caps.moe.choices]
    return f"--moe-backend <{'|'.join(relevant) or 'see vllm serve --help=moe-backend'}>"


def registered_but_unread(name: str, caps: Capabilities) -> bool:
    """A MoE-selector variable this version registers but its MXFP4 selector never reads (e.g. 0.10.2-0.11.0)."""
    return name in MOE_ENV_FLAGS and name.startswith("VLLM_MXFP4") and name not in caps.moe.env_reads


# -- switches vLLM reads as bool(int(value)) (G15) ----------------------------------------------------

# The VLLM_* names whose envs.py entry is bool(int(os.getenv(...))) or maybe_convert_bool(...) in every release of
# 0.15.1-0.33.0 that registers them (read on the 27 wheels). A value int() refuses (`true`, `false`, `on`, empty) stops
# vLLM with ValueError: at its first read, and at the latest when enable_envs_cache() evaluates every registered entry,
# in each worker right after load_model and in the engine core after the KV cache set-up. So whether anything else
# reads the switch does not matter: a release reads it when it registers it (Capabilities.env). The upstream test
# test_the_switch_table_matches_the_real_envs_py compares the table with six releases' envs.py.
INT_SWITCHES = frozenset({
    "VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE", "VLLM_ALLOW_INSECURE_SERIALIZATION",
    "VLLM_ALLREDUCE_USE_FLASHINFER", "VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC", "VLLM_ALLREDUCE_USE_SYMM_MEM",
    "VLLM_ASSETS_CACHE_MODEL_CLEAN", "VLLM_B12X_MOE_FP4_FORCE_A16", "VLLM_BATCH_INVARIANT",
    "VLLM_BLOCKSCALE_FP8_GEMM_FLASHINFER", "VLLM_COMPUTE_NANS_IN_LOGITS", "VLLM_CONFIGURE_LOGGING",
    "VLLM_CPU_ATTN_SPLIT_KV", "VLLM_CPU_CI_ENV", "VLLM_CPU_INT4_W4A8", "VLLM_CPU_SGL_KERNEL",
    "VLLM_CUSTOM_SCOPES_FOR_PROFILING", "VLLM_DCP_Q_REPLICATE", "VLLM_DEBUG_MFU_METRICS", "VLLM_DEBUG_WORKSPACE",
    "VLLM_DEEPEPLL_NVFP4_DISPATCH", "VLLM_DEEPEP_HIGH_THROUGHPUT_FORCE_INTRA_NODE",
    "VLLM_DEEPEP_LOW_LATENCY_USE_MNNVL", "VLLM_DEEPEP_V2_ALLOW_HYBRID_MODE",
    "VLLM_DEEPEP_V2_ALLOW_MULTIPLE_REDUCTION", "VLLM_DEEPEP_V2_PREFER_OVERLAP",
    "VLLM_DISABLE_DSV4_MEGAMOE_SHARED_EXPERT_FUSION", "VLLM_DISABLE_LOG_LOGO",
    "VLLM_DISABLE_REQUEST_ID_RANDOMIZATION", "VLLM_DISABLE_SHARED_EXPERTS_STREAM",
    "VLLM_DISTRIBUTED_USE_SPLIT_GROUP", "VLLM_ELASTIC_EP_DRAIN_REQUESTS", "VLLM_ELASTIC_EP_SCALE_UP_LAUNCH",
    "VLLM_ENABLE_COHERE_API", "VLLM_ENABLE_CUDAGRAPH_GC", "VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE",
    "VLLM_ENABLE_FUSED_MOE_ACTIVATION_CHUNKING", "VLLM_ENABLE_GEMM_RS", "VLLM_ENABLE_HPC_OPS",
    "VLLM_ENABLE_INDUCTOR_COORDINATE_DESCENT_TUNING", "VLLM_ENABLE_INDUCTOR_MAX_AUTOTUNE",
    "VLLM_ENABLE_MOE_DP_CHUNK", "VLLM_ENABLE_RESPONSES_API_STORE", "VLLM_ENABLE_STARTUP_PLAN",
    "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_FLASHINFER_MOE_A2A_LOW_PRECISION_COMBINE",
    "VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS", "VLLM_HAS_FLASHINFER_CUBIN", "VLLM_HUMMING_USE_F16_ACCUM",
    "VLLM_KEEP_ALIVE_ON_ENGINE_DEATH", "VLLM_KIMI_K3_AUX_ATTN_RES_STREAM", "VLLM_KIMI_K3_GEMM_AR",
    "VLLM_KIMI_K3_GEMM_RS", "VLLM_KIMI_K3_SHARD_SP_SHARED_EXPERT", "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES",
    "VLLM_LOG_MODEL_INSPECTION", "VLLM_LORA_DISABLE_PDL", "VLLM_LORA_ENABLE_DUAL_STREAM",
    "VLLM_MEDIA_URL_ALLOW_REDIRECTS", "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", "VLLM_MLA_DISABLE",
    "VLLM_MOE_SKIP_PADDING", "VLLM_MOE_USE_DEEP_GEMM", "VLLM_MXFP4_USE_MARLIN", "VLLM_NVTX_SCOPES_FOR_PROFILING",
    "VLLM_PLE_CPU_OFFLOAD", "VLLM_RAISE_ON_LOGIT_NANS", "VLLM_ROCM_FP8_MFMA_PAGE_ATTN", "VLLM_ROCM_FP8_PADDING",
    "VLLM_ROCM_MOE_PADDING", "VLLM_ROCM_USE_AITER_MOE_A4W4_DSV4", "VLLM_SERVER_DEV_MODE",
    "VLLM_SKIP_PRECOMPILED_VERSION_SUFFIX", "VLLM_SKIP_VERSION_SUFFIX", "VLLM_SLEEP_WHEN_IDLE",
    "VLLM_STEP5_SHARD_SP_SHARED_EXPERT", "VLLM_TOOL_JSON_ERROR_AUTOMATIC_RETRY", "VLLM_USE_BYTECODE_HOOK",
    "VLLM_USE_DEEP_GEMM", "VLLM_USE_DEEP_GEMM_E8M0", "VLLM_USE_DEEP_GEMM_TMA_ALIGNED_SCALES",
    "VLLM_USE_DIRECT_DCP_A2A", "VLLM_USE_DIRECT_DCP_KV_GATHER", "VLLM_USE_DIRECT_DCP_Q_GATHER",
    "VLLM_USE_EXPERIMENTAL_PARSER_CONTEXT", "VLLM_USE_FASTOKENS", "VLLM_USE_FBGEMM", "VLLM_USE_FLASHINFER_MOE_FP16",
    "VLLM_USE_FLASHINFER_MOE_FP4", "VLLM_USE_FLASHINFER_MOE_FP8", "VLLM_USE_FLASHINFER_MOE_INT4",
    "VLLM_USE_FLASHINFER_MOE_MXFP4_BF16", "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8",
    "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8_CUTLASS", "VLLM_USE_FLASHINFER_SAMPLER", "VLLM_USE_FUSED_MOE_GROUPED_TOPK",
    "VLLM_USE_LAYERNAME", "VLLM_USE_NCCL_SYMM_MEM", "VLLM_USE_NVFP4_CT_EMULATIONS",
    "VLLM_USE_RAY_COMPILED_DAG_OVERLAP_COMM", "VLLM_USE_RAY_V2_EXECUTOR_BACKEND", "VLLM_USE_RAY_WRAPPED_PP_COMM",
    "VLLM_USE_RUST_BENCH", "VLLM_USE_RUST_FRONTEND", "VLLM_USE_SIMPLE_KV_OFFLOAD", "VLLM_USE_SPINLOOP_EXT",
    "VLLM_USE_TRITON_AWQ", "VLLM_USE_V2_MODEL_RUNNER", "VLLM_WEIGHT_OFFLOADING_DISABLE_PIN_MEMORY",
    "VLLM_WEIGHT_OFFLOADING_DISABLE_UVA", "VLLM_WSL2_ENABLE_PIN_MEMORY", "VLLM_XLA_CHECK_RECOMPILATION",
    "VLLM_XLA_USE_SPMD", "VLLM_XPU_ENABLE_XPU_GRAPH", "VLLM_XPU_FORCE_N_CONTIG_WEIGHT", "VLLM_XPU_PP_MICROBATCH",
    "VLLM_XPU_USE_SAMPLER_KERNEL", "VLLM_ZENTORCH_WEIGHT_PREPACK"
})
# Switches only before a release, the first whose entry no longer calls int(): 0.24's compares the lower-cased value
# with `true` and `1`; 0.21's takes a GEMM type's name.
INT_SWITCHES_UNTIL = {"VLLM_ENFORCE_STRICT_TOOL_CALLING": (0, 24), "VLLM_HUMMING_MOE_GEMM_TYPE": (0, 21)}
INT_SWITCHES_READ_FROM = (0, 15, 1)  # the first release read; older ones are not judged


# Variables a release reads outside envs.py, so that its registry (caps.env) does not list them, read on the wheels:
# VLLM_BATCH_INVARIANT in model_executor/layers/batch_invariant.py (os.getenv; int(value) != 0, a word reads as off)
# on 0.15.1-0.18.x, before envs.py registered it in 0.19.0.
READ_OUTSIDE_ENVS = frozenset({"VLLM_BATCH_INVARIANT"})


def reads(name: str, caps: Capabilities) -> bool:
    """Whether the vLLM of `caps` reads the variable `name` at all (its registry, or a module of its own)."""
    return caps.env.knows(name) or name in READ_OUTSIDE_ENVS


def reads_as_switch(name: str, caps: Capabilities) -> bool:
    """Whether the vLLM of `caps` reads `name` as bool(int(value)), so that a value int() refuses stops it at start-up
    (plan.switch_value: None)."""
    release = caps.version.release
    if not caps.env.knows(name) or release[:3] < INT_SWITCHES_READ_FROM:
        return False
    until = INT_SWITCHES_UNTIL.get(name)
    return name in INT_SWITCHES or until is not None and release[:2] < until


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
