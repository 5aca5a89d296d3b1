"""The per-GPU memory estimate of a launch (G37, G38) and the sampler warm-up's headroom (G42): what must fit in
--gpu-memory-utilization x a GPU's memory for a model's shape (parallel.Shape) split by a layout (parallel.Layout),
read from vLLM's own arguments the way argparse keeps them. Estimates, checked against the cases vLLM's recipe guide
states and against the runs docs/scaling.md lists; preflight.py turns them into rows, plan.py into settings.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from gptoss_patch.launcher.gpus import Gpu, is_large_gpu
from gptoss_patch.launcher.parallel import DEFAULT_UTILIZATION, Layout, Shape
from gptoss_patch.launcher.profiles import CAPTURE_SIZE_FLAGS, MAX_CAPTURE_FLAG, MAX_CAPTURE_SIZE
from gptoss_patch.launcher.static import last_value, scan_flags

GIB = 1024**3
MIB = 1024**2
DEFAULT_BATCHED_TOKENS = {True: 8192, False: 2048}
DEFAULT_MAX_NUM_SEQS = {True: 1024, False: 256}
CPU_MAX_NUM_SEQS = 128  # per worker on vLLM's CPU platform

# The memory estimate (G37). Estimates, not measurements: chosen so that the cases vLLM's gpt-oss recipe guide
# states for an 80 GB H100 come out as it says (120b at TP=1 with 0.9 and 8192 batched tokens runs out; with
# 0.95 and 1024 it starts; TP=2 runs out above 0.95). docs/scaling.md says what has and has not been measured.
ACTIVATION_MIB_PER_TOKEN = 0.75  # activation peak of the profiling run, per --max-num-batched-tokens token
RUNTIME_GIB = 3.0  # inside the budget besides weights, KV cache and activations: CUDA graphs, sampler (see G42 below)

# Outside the budget: vLLM asks for utilization x total *free* memory at start; the CUDA context, and with more
# than one rank NCCL's and the custom all-reduce's buffers, are taken before that.
RESERVE_GIB = {False: 1.0, True: 3.5}  # {tensor/pipeline parallel: GiB that must stay outside the budget}

# Measured on one H100 with vLLM 0.20.2 (G37): gpt-oss-120b at TP=1 runs out of memory *while loading* (72 GiB
# allocated, 5.4 GiB reserved by PyTorch but unallocated, 1 GiB asked for), with vLLM's defaults and with the guide's
# 0.95 / 1024 alike; with PyTorch's expandable segments both start and serve.
ALLOC_CONF_ENV = "PYTORCH_CUDA_ALLOC_CONF"
EXPANDABLE_SEGMENTS = "expandable_segments:True"
RECIPE_TP1_UTILIZATION = "0.95"
RECIPE_TP1_BATCHED_TOKENS = "1024"
RECIPE_TP_MAX_UTILIZATION = 0.95

# The sampler warm-up (G42). After the KV cache has filled the budget, vLLM samples --max-num-seqs dummy requests
# (top-k, top-p and penalties over the whole vocabulary), so its float32 logits and their working copies need room
# outside the budget, next to the CUDA graph pool and the reserve above. At least the logits and one copy are
# needed (below that it fails: a row that fails); measured on one H200 (vLLM 0.20.2, gpt-oss-120b, 0.92, 1024
# sequences: out of memory with 357 MiB free asking for one more 786 MiB copy) the warm-up had taken at least about
# 12 copies, so the warning counts 12. A lower bound from one measurement, not the warm-up's peak.
SAMPLER_FLOOR_COPIES = 2
SAMPLER_WARN_COPIES = 12
LOGIT_BYTES = 4  # float32
CUDA_GRAPH_POOL_GIB = 1.6  # measured 1.58 GiB with vLLM 0.20.2's default capture sizes (to 1024) on that H200
# Captures beyond vLLM's 1024 for gpt-oss (the sm90 profile's 2048): the 20b on an H100 went from 1.21 to 1.58 GiB of
# graph memory (vLLM 0.20.2); the same growth is assumed for other shapes, not measured.
CUDA_GRAPH_POOL_GROWTH_TO_2048 = 1.58 / 1.21


@dataclass(frozen=True)
class MemoryEstimate:
    """Per GPU, in bytes: what must fit in utilization x total memory."""

    total: int
    utilization: float
    weights: int
    kv_one_sequence: int  # one request at --max-model-len (vLLM refuses to start when it does not fit)
    activations: int
    runtime: int
    max_model_len: int
    batched_tokens: int
    kv_dtype_bytes: int
    reserve: int  # what must stay outside the budget
    parts: dict[str, str] = field(default_factory=dict)

    @property
    def budget(self) -> int:
        return int(self.total * self.utilization)

    @property
    def needed(self) -> int:
        return self.weights + self.kv_one_sequence + self.activations + self.runtime

    @property
    def fits(self) -> bool:
        return self.needed <= self.budget

    @property
    def outside(self) -> int:
        return self.total - self.budget

    @property
    def reserve_ok(self) -> bool:
        return self.outside >= self.reserve

    def sequences_at_full_length(self) -> int:
        """How many --max-model-len requests the KV cache left over holds (vLLM queues the rest)."""
        left = self.budget - self.weights - self.activations - self.runtime
        return max(0, left // self.kv_one_sequence) if self.kv_one_sequence else 0


KV_BLOCK_TOKENS = 16  # vLLM's default KV block size on CUDA (CacheConfig.block_size)


def kv_bytes_per_sequence(shape: Shape, layout: Layout, length: int, dtype_bytes: int, *, batched_tokens: int) -> int:
    """Keys and values vLLM sets aside for one request at `length` tokens on one GPU, as its "Maximum concurrency"
    counts them (vllm/v1/core/kv_cache_utils.py `get_max_concurrency_for_kv_cache_config`, read on 0.20.2).

    gpt-oss alternates sliding-window (128 tokens) and full-attention layers: 18 + 18 for 120b, 12 + 12 for 20b;
    8 KV heads of head_dim 64, so a layer's token takes 2 (K, V) x 8 x 64 x 2 bytes (bf16) = 2 KiB, split over TP.
    The hybrid allocator keeps one pool of blocks for both groups, and a request is admitted for the *sum* of what
    each group may hold (`max_memory_usage_bytes` of each KVCacheSpec):
    - full attention (FullAttentionSpec): cdiv(length, block) blocks;
    - sliding window (SlidingWindowSpec.max_admission_blocks_per_request): during chunked prefill it keeps the last
      window - 1 tokens *plus the newly scheduled chunk*, so cdiv(min(window - 1 + max_num_batched_tokens, length),
      block) + 1 blocks, not the window. With vLLM's 8192 batched tokens and --max-model-len 8192 that is the
      whole request: every sliding layer costs what a full one does, and half as many requests fit as a
      window-only count says (doctor said 628 on two H200s at TP=2, vLLM 319).
    Layers are split over PP."""
    heads = max(1, shape.kv_heads // layout.tp)
    per_layer_token = 2 * heads * shape.head_dim * dtype_bytes
    block = KV_BLOCK_TOKENS
    sliding = shape.layers - shape.full_attention_layers
    full_tokens = math.ceil(length / block) * block
    window_tokens = (math.ceil(min(shape.sliding_window - 1 + batched_tokens, length) / block) + 1) * block
    tokens = shape.full_attention_layers * full_tokens + sliding * window_tokens
    return math.ceil(per_layer_token * tokens / layout.pp)


def weights_per_gpu(shape: Shape, layout: Layout) -> int:
    """One GPU's share of the weights. Attention, embeddings and norms split over TP x PP; the routed experts
    over TP x DP x PP as well: vLLM's fused MoE layers shard across the data-parallel ranks too, with or without
    --enable-expert-parallel (FusedMoEParallelConfig.make, read on 0.20.2: without EP, `flatten_tp_across_dp`
    makes the MoE tensor-parallel over TP x DP, "AllGather+ReduceScatter dispatch/combine"; with EP the experts are
    split over the same TP x DP ranks). So `-dp 2` is not two whole copies: 120b loaded 35.7 GiB per rank."""
    dense = shape.weights_bytes - shape.expert_bytes
    return math.ceil(dense / layout.model_parallel + shape.expert_bytes / (layout.model_parallel * layout.dp))


def estimate(shape: Shape, layout: Layout, gpu: Gpu, args: Sequence[str], *,
             default_utilization: float = DEFAULT_UTILIZATION) -> MemoryEstimate | None:
    """The estimate for the effective `args` (the full argv: the user's flags win over the profile's)."""
    if gpu.memory_mib is None:
        return None
    total = gpu.memory_mib * MIB
    utilization = _float(last_value(args, "--gpu-memory-utilization"), default_utilization)
    large = is_large_gpu(gpu)
    batched = parse_tokens(last_value(args, "--max-num-batched-tokens")) or DEFAULT_BATCHED_TOKENS[large]
    length = parse_tokens(last_value(args, "--max-model-len")) or shape.max_position_embeddings
    kv_dtype = last_value(args, "--kv-cache-dtype") or "auto"
    dtype_bytes = 1 if kv_dtype.startswith("fp8") else 2
    return MemoryEstimate(
        total=total,
        utilization=utilization,
        weights=weights_per_gpu(shape, layout),
        kv_one_sequence=kv_bytes_per_sequence(shape, layout, length, dtype_bytes, batched_tokens=batched),
        activations=int(ACTIVATION_MIB_PER_TOKEN * MIB * batched),
        runtime=int(RUNTIME_GIB * GIB),
        max_model_len=length,
        batched_tokens=batched,
        kv_dtype_bytes=dtype_bytes,
        reserve=int(RESERVE_GIB[layout.model_parallel > 1] * GIB),
    )


@dataclass(frozen=True)
class SamplerHeadroom:
    """Per GPU, in bytes: the sampler warm-up's logits against what the budget leaves outside (G42)."""

    total: int
    utilization: float
    max_num_seqs: int
    vocab_size: int
    reserve: int  # CUDA context, non-torch memory (and NCCL with TP/PP): as MemoryEstimate.reserve
    graph_pool: int

    @property
    def outside(self) -> int:
        return self.total - int(self.total * self.utilization)

    @property
    def headroom(self) -> int:
        """What the warm-up may take: outside the budget, less the reserve and the CUDA graph pool."""
        return self.outside - self.reserve - self.graph_pool

    def need(self, copies: int = SAMPLER_WARN_COPIES) -> int:
        return self.max_num_seqs * self.vocab_size * LOGIT_BYTES * copies

    @property
    def short(self) -> bool:
        """The warning: the measured lower bound does not fit."""
        return self.need() > self.headroom

    @property
    def clearly_over(self) -> bool:
        """The failure: the logits and one copy do not fit even counting the graph pool's room."""
        return self.need(SAMPLER_FLOOR_COPIES) > self.outside - self.reserve

    def fitting_seqs(self) -> int:
        """The largest power of two of --max-num-seqs whose warm-up fits (0 when not even one does)."""
        fits = max(0, self.headroom) // self.need_per_sequence
        return 1 << (fits.bit_length() - 1) if fits else 0

    @property
    def need_per_sequence(self) -> int:
        return self.vocab_size * LOGIT_BYTES * SAMPLER_WARN_COPIES

    def fitting_utilization(self) -> float | None:
        """The highest --gpu-memory-utilization (two decimals) that leaves room for this --max-num-seqs."""
        top = math.floor((self.total - self.reserve - self.graph_pool - self.need()) / self.total * 100) / 100
        return top if top > 0 else None


def sampler_headroom(shape: Shape, layout: Layout, gpu: Gpu, args: Sequence[str], *,
                     default_utilization: float = DEFAULT_UTILIZATION) -> SamplerHeadroom | None:
    """The sampler warm-up check for the effective `args`; None when the GPU reports no total memory."""
    if gpu.memory_mib is None:
        return None
    seqs = parse_tokens(last_value(args, "--max-num-seqs")) or DEFAULT_MAX_NUM_SEQS[is_large_gpu(gpu)]
    return SamplerHeadroom(
        total=gpu.memory_mib * MIB,
        utilization=_float(last_value(args, "--gpu-memory-utilization"), default_utilization),
        max_num_seqs=seqs,
        vocab_size=shape.vocab_size,
        reserve=int(RESERVE_GIB[layout.model_parallel > 1] * GIB),
        graph_pool=int(graph_pool_gib(args) * GIB),
    )


def graph_pool_gib(args: Sequence[str]) -> float:
    """The CUDA graph pool outside the budget for the capture sizes `args` ask for (the largest of a list, or the
    maximum): the measured 1.6 GiB up to vLLM's 1024 for gpt-oss, grown as measured beyond it."""
    listed = [int(v) for u in scan_flags(list(args)) if u.name in CAPTURE_SIZE_FLAGS for v in u.values if v.isdigit()]
    maximum = parse_tokens(last_value(args, MAX_CAPTURE_FLAG))
    largest = max([*listed, maximum or 0]) if listed or maximum else MAX_CAPTURE_SIZE
    return CUDA_GRAPH_POOL_GIB * (CUDA_GRAPH_POOL_GROWTH_TO_2048 if largest > MAX_CAPTURE_SIZE else 1.0)


def expandable_segments(value: str | None) -> bool:
    """Whether a PYTORCH_CUDA_ALLOC_CONF value turns PyTorch's expandable segments on."""
    options = dict(item.partition(":")[::2] for item in (value or "").split(",") if item)
    return options.get("expandable_segments", "").strip().lower() in ("true", "1")


def parse_tokens(text: str | None) -> int | None:
    """`8192`, `32k`, `1M` (vLLM's human-readable sizes, k = 1000, K = 1024); None for absent, -1 or auto."""
    if not text or text in ("-1", "auto"):
        return None
    units = {"k": 1000, "K": 1024, "m": 1000**2, "M": 1024**2}
    try:
        if text[-1] in units:
            return int(float(text[:-1]) * units[text[-1]])
        return int(text)
    except ValueError:
        return None


def _float(text: str | None, default: float) -> float:
    try:
        return float(text) if text is not None else default
    except ValueError:
        return default


def gib(value: int | float) -> str:
    return f"{value / GIB:.1f} GiB"
