"""More than one GPU: the parallel sizes as vLLM reads them, the GPUs nvidia-smi lists (and CUDA_VISIBLE_DEVICES
selects), the model's shape, and the per-GPU memory estimate. Data only; preflight.py turns it into checks
(G33-G38, G42, docs/known-issues.md) and plan.py into profile settings.

vLLM is the distributed engine: the sizes are its own flags (`--tensor-parallel-size/-tp`,
`--data-parallel-size/-dp`, `--pipeline-parallel-size/-pp`, `--data-parallel-size-local/-dpl`), given after
`--` and read here the way argparse keeps them (the last occurrence of any spelling wins).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gptoss_patch.errors import UsageError, cause
from gptoss_patch.launcher.static import scan_flags

TP_FLAGS = ("--tensor-parallel-size", "-tp")
PP_FLAGS = ("--pipeline-parallel-size", "-pp")
DP_FLAGS = ("--data-parallel-size", "-dp")
DP_LOCAL_FLAGS = ("--data-parallel-size-local", "-dpl")
EP_FLAGS = ("--enable-expert-parallel", "-ep")
NNODES_FLAGS = ("--nnodes", "-n")
RAY_FLAGS = ("--distributed-executor-backend", "--data-parallel-backend", "-dpb")

GIB = 1024**3
MIB = 1024**2
# vLLM's --gpu-memory-utilization default where the installed release's CacheConfig cannot be read
# (static.read_default_utilization; 0.20.2 says 0.92): Context.default_utilization is what the checks use.
DEFAULT_UTILIZATION = 0.9
# vLLM's --max-num-batched-tokens and --max-num-seqs defaults for the API server (EngineArgs.get_batch_defaults,
# read on 0.16-0.33): 8192 / 1024 on GPUs of 70 GiB and more (not A100, not GB10), 2048 / 256 below.
LARGE_GPU_GIB = 70
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

# The recipe guide's fix for gpt-oss-120b on one 80 GB H100 (G37).
H100_80GB_MAX_GIB = 82  # nvidia-smi reports 81559 MiB for an H100 SXM/PCIe 80 GB; H100 NVL (94 GB) is not this case
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
CUDA_GRAPH_POOL_GIB = 1.6  # measured 1.58 GiB with vLLM 0.20.2's default capture sizes on that H200


# -- the sizes ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """The parallel sizes of one `vllm serve` command line (vLLM's defaults where a flag is absent)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    dp_local: int | None = None
    expert_parallel: bool = False
    nnodes: int = 1
    ray: bool = False

    @property
    def model_parallel(self) -> int:
        """GPUs one copy of the model spans (tensor x pipeline)."""
        return self.tp * self.pp

    @property
    def total_gpus(self) -> int:
        return self.model_parallel * self.dp

    @property
    def multi_node(self) -> bool:
        """Some ranks may live on other hosts: Ray, --nnodes, or fewer local DP ranks than DP ranks."""
        return self.ray or self.nnodes > 1 or (self.dp_local is not None and self.dp_local < self.dp)

    @property
    def local_gpus(self) -> int:
        """GPUs this host must have for the command line: all of them on one host; with --data-parallel-size-local
        its share; under Ray or --nnodes only what is certain (the ranks may be placed elsewhere)."""
        if self.dp_local is not None:
            return self.model_parallel * self.dp_local
        if self.multi_node:
            return 1
        return self.total_gpus

    def describe(self) -> str:
        parts = [f"TP {self.tp}"] + ([f"PP {self.pp}"] if self.pp > 1 else []) + [f"DP {self.dp}"]
        if self.dp_local is not None:
            parts.append(f"{self.dp_local} DP rank(s) on this host")
        return " x ".join(parts[:3]) + (f", {', '.join(parts[3:])}" if parts[3:] else "")


def layout_of(args: Sequence[str]) -> Layout:
    """The sizes argparse would keep for `args` (a full argv or the arguments after --)."""
    ray_backends = [u.values[0] for u in scan_flags(list(args)) if u.name in RAY_FLAGS and u.values]
    return Layout(
        tp=_size(args, TP_FLAGS),
        pp=_size(args, PP_FLAGS),
        dp=_size(args, DP_FLAGS),
        dp_local=_size(args, DP_LOCAL_FLAGS) if _last(args, DP_LOCAL_FLAGS) is not None else None,
        expert_parallel=_switch(args, EP_FLAGS),
        nnodes=_size(args, NNODES_FLAGS),
        ray="ray" in ray_backends,
    )


def _last(args: Sequence[str], names: tuple[str, ...]) -> str | None:
    found = [u for u in scan_flags(list(args)) if u.name in names and u.values]
    return found[-1].values[0] if found else None


def _switch(args: Sequence[str], names: tuple[str, ...]) -> bool:
    negations = {"--no-" + n[2:] for n in names if n.startswith("--")}
    uses = [u.name for u in scan_flags(list(args)) if u.name in names or u.name in negations]
    return bool(uses) and uses[-1] in names


def _size(args: Sequence[str], names: tuple[str, ...]) -> int:
    value = _last(args, names)
    if value is None:
        return 1
    if not value.isdigit() or int(value) < 1:
        raise UsageError(f"{names[0]} {value}: expected a whole number of 1 or more")
    return int(value)


# -- the GPUs --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    capability: str
    memory_mib: int | None  # None where nvidia-smi reports [N/A] (GB10's unified memory)

    @property
    def memory_gib(self) -> float | None:
        return None if self.memory_mib is None else self.memory_mib / 1024

    @property
    def label(self) -> str:
        return f"{self.name} ({self.capability})"


@dataclass(frozen=True)
class Inventory:
    """What nvidia-smi lists and what CUDA_VISIBLE_DEVICES leaves visible, in CUDA's order."""

    gpus: tuple[Gpu, ...] = ()  # every GPU nvidia-smi lists
    visible: tuple[Gpu, ...] = ()  # what a CUDA process sees
    problem: str | None = None  # why nvidia-smi's answer could not be read
    duplicates: tuple[str, ...] = ()  # CUDA_VISIBLE_DEVICES entries naming a GPU already listed
    invalid: str | None = None  # the first entry CUDA cannot resolve: it and every later entry are dropped
    visible_env: str | None = None  # CUDA_VISIBLE_DEVICES as set, None when unset
    pci_order: bool = False  # CUDA_DEVICE_ORDER=PCI_BUS_ID: CUDA's indices are nvidia-smi's

    @property
    def mixed(self) -> bool:
        return len({(g.name, g.capability) for g in self.gpus}) > 1


GPU_QUERY = "index,uuid,name,compute_cap,memory.total"


def inventory(environ: Mapping[str, str], *, run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> Inventory | None:
    """nvidia-smi's GPUs and the visible selection; None without nvidia-smi (no NVIDIA GPU to check)."""
    exe = shutil.which("nvidia-smi", path=environ.get("PATH"))
    if exe is None:
        return None
    try:
        proc = run([exe, f"--query-gpu={GPU_QUERY}", "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Inventory(problem=f"nvidia-smi failed ({cause(exc)})")
    if proc.returncode != 0:
        return Inventory(problem="nvidia-smi failed: " + (proc.stderr.strip().splitlines() or ["no output"])[0])
    gpus, problem = parse_gpus(proc.stdout)
    if problem:
        return Inventory(gpus=gpus, problem=problem)
    return select_visible(gpus, environ)


def parse_gpus(text: str) -> tuple[tuple[Gpu, ...], str | None]:
    gpus: list[Gpu] = []
    for line in (line.strip() for line in text.splitlines()):
        if not line:
            continue
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != 5 or not cells[0].isdigit():
            return tuple(gpus), f"unexpected nvidia-smi line {line!r}"
        memory = cells[4]
        gpus.append(Gpu(int(cells[0]), cells[1], cells[2], cells[3], int(float(memory)) if _number(memory) else None))
    return tuple(gpus), None


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def select_visible(gpus: tuple[Gpu, ...], environ: Mapping[str, str]) -> Inventory:
    """CUDA_VISIBLE_DEVICES as CUDA reads it: indices or (prefixes of) UUIDs, in the order given; the first entry
    it cannot resolve hides itself and everything after it. Indices follow CUDA_DEVICE_ORDER, which is
    FASTEST_FIRST by default: only with PCI_BUS_ID (or identical GPUs) are they nvidia-smi's indices."""
    pci_order = environ.get("CUDA_DEVICE_ORDER", "") == "PCI_BUS_ID"
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return Inventory(gpus, gpus, pci_order=pci_order)
    chosen: list[Gpu] = []
    duplicates: list[str] = []
    invalid = None
    for entry in (e.strip() for e in value.split(",")):
        gpu = _resolve(entry, gpus)
        if gpu is None:
            invalid = entry
            break
        if gpu in chosen:
            duplicates.append(entry)
            continue
        chosen.append(gpu)
    return Inventory(gpus, tuple(chosen), duplicates=tuple(duplicates), invalid=invalid, visible_env=value, pci_order=pci_order)


def _resolve(entry: str, gpus: tuple[Gpu, ...]) -> Gpu | None:
    if entry.isdigit():
        return next((g for g in gpus if g.index == int(entry)), None)
    if entry.startswith("GPU-") and len(entry) > 4:
        matches = [g for g in gpus if g.uuid.startswith(entry)]
        return matches[0] if len(matches) == 1 else None
    return None  # MIG-..., -1, empty: no whole GPU


# -- the model -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """What the checks need from a gpt-oss checkpoint."""

    name: str
    source: str  # "config.json" or "the published openai/gpt-oss-120b shape"
    layers: int
    full_attention_layers: int
    sliding_window: int
    q_heads: int
    kv_heads: int
    head_dim: int
    experts: int
    max_position_embeddings: int
    weights_bytes: int
    vocab_size: int = 201088  # gpt-oss's o200k_harmony vocabulary
    expert_bytes: int = 0  # the routed experts' share of weights_bytes (what vLLM's fused MoE layers shard)

    @property
    def is_120b(self) -> bool:
        return self.layers == 36 and self.experts == 128


def model_shape(model: str | None) -> Shape | None:
    """A local directory's config.json, or the published shape of a gpt-oss model id; None when neither."""
    if not model:
        return None
    config = Path(model).expanduser() / "config.json"
    if config.is_file():
        return _local_shape(Path(model).expanduser(), config)
    from gptoss_patch.model.recipe import GPT_OSS_20B, GPT_OSS_120B

    lowered = model.lower().rstrip("/")
    for tag, recipe in (("gpt-oss-120b", GPT_OSS_120B), ("gpt-oss-20b", GPT_OSS_20B)):
        if lowered.endswith(tag) or f"{tag}-" in lowered.rsplit("/", 1)[-1]:
            return _shape_of(recipe, f"the published {tag} shape", _recipe_bytes(recipe), name=model)
    return None


def _local_shape(directory: Path, config: Path) -> Shape | None:
    from gptoss_patch.model.recipe import Recipe

    try:
        data = json.loads(config.read_text(encoding="utf-8"))
        layers = int(data["num_hidden_layers"])
        recipe = Recipe(
            name=directory.name,
            num_hidden_layers=layers,
            layer_types=tuple(data.get("layer_types") or ("sliding_attention", "full_attention") * (layers // 2)),
            sliding_window=int(data.get("sliding_window") or 128),
            hidden_size=int(data["hidden_size"]),
            intermediate_size=int(data["intermediate_size"]),
            num_attention_heads=int(data["num_attention_heads"]),
            num_key_value_heads=int(data["num_key_value_heads"]),
            head_dim=int(data.get("head_dim") or int(data["hidden_size"]) // int(data["num_attention_heads"])),
            num_local_experts=int(data.get("num_local_experts") or data.get("num_experts") or 1),
            experts_per_token=int(data.get("num_experts_per_tok") or data.get("experts_per_token") or 1),
            vocab_size=int(data.get("vocab_size") or 201088),
            max_position_embeddings=int(data.get("max_position_embeddings") or 131072),
            experts="mxfp4" if (data.get("quantization_config") or {}).get("quant_method") == "mxfp4" else "bf16",
        )
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
        return None  # not a config we can read: vLLM will say what is wrong with it
    on_disk = sum(p.stat().st_size for p in directory.glob("*.safetensors"))
    weights = on_disk or _recipe_bytes(recipe)  # --load-format dummy needs only config.json and the tokenizer
    return _shape_of(recipe, "its config.json", weights, name=str(directory))


def _recipe_bytes(recipe: Any, *, experts_only: bool = False) -> int:
    from gptoss_patch.model.checkpoint import tensor_plan

    try:
        plan = tensor_plan(recipe)
    except UsageError:  # MXFP4 with sizes that are not multiples of the block: count bf16
        from dataclasses import replace

        plan = tensor_plan(replace(recipe, experts="bf16"))
    return sum(t.nbytes for t in plan if not experts_only or ".mlp.experts." in t.name)


def _shape_of(recipe: Any, source: str, weights: int, *, name: str) -> Shape:
    full = sum(1 for kind in recipe.layer_types if kind != "sliding_attention")
    planned = _recipe_bytes(recipe)
    experts = round(weights * _recipe_bytes(recipe, experts_only=True) / planned) if planned else 0  # on disk: same share
    return Shape(
        name=name,
        source=source,
        layers=recipe.num_hidden_layers,
        full_attention_layers=full,
        sliding_window=recipe.sliding_window,
        q_heads=recipe.num_attention_heads,
        kv_heads=recipe.num_key_value_heads,
        head_dim=recipe.head_dim,
        experts=recipe.num_local_experts,
        max_position_embeddings=recipe.max_position_embeddings,
        weights_bytes=weights,
        vocab_size=recipe.vocab_size,
        expert_bytes=experts,
    )


def divisibility_problems(shape: Shape, layout: Layout) -> list[str]:
    """What vLLM needs of TP (query heads; KV heads split or replicated) and the even split of the experts."""
    tp = layout.tp
    problems = []
    if shape.q_heads % tp:
        problems.append(f"{shape.q_heads} query heads")
    if (tp <= shape.kv_heads and shape.kv_heads % tp) or (tp > shape.kv_heads and tp % shape.kv_heads):
        problems.append(f"{shape.kv_heads} KV heads")
    experts_over = layout.tp * layout.dp if layout.expert_parallel else tp
    if shape.experts % experts_over:
        what = f"the expert-parallel size {experts_over} (TP x DP)" if layout.expert_parallel else ""
        problems.append(f"{shape.experts} experts" + (f" over {what}" if what else ""))
    return problems


def fitting_sizes(shape: Shape, limit: int) -> list[int]:
    """The tensor-parallel sizes up to `limit` that divide everything (for the fix line)."""
    return [tp for tp in range(1, max(limit, 1) + 1) if not divisibility_problems(shape, Layout(tp=tp))]


# -- the memory estimate (G37) ---------------------------------------------------------------------


@dataclass(frozen=True)
class Context:
    """What a plan knows about its parallel launch: the sizes, the GPUs (None without nvidia-smi), the model."""

    layout: Layout
    hardware: Inventory | None
    shape: Shape | None
    default_utilization: float = DEFAULT_UTILIZATION  # the installed vLLM's, when --gpu-memory-utilization is not given

    def used_gpus(self) -> tuple[Gpu, ...]:
        """The visible GPUs this host's ranks take (vLLM uses them in order)."""
        return self.hardware.visible[: self.layout.local_gpus] if self.hardware else ()

    @property
    def h100_120b(self) -> bool:
        """gpt-oss-120b on 80 GB H100s only: the recipe guide's memory cases (G37 at TP x PP = 1, G38 above)."""
        used = self.used_gpus()
        return bool(used) and all(is_h100_80gb(g) for g in used) and self.shape is not None and self.shape.is_120b


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
    utilization = _float(_last(args, ("--gpu-memory-utilization",)), default_utilization)
    large = is_large_gpu(gpu)
    batched = parse_tokens(_last(args, ("--max-num-batched-tokens",))) or DEFAULT_BATCHED_TOKENS[large]
    length = parse_tokens(_last(args, ("--max-model-len",))) or shape.max_position_embeddings
    kv_dtype = _last(args, ("--kv-cache-dtype",)) or "auto"
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
    seqs = parse_tokens(_last(args, ("--max-num-seqs",))) or DEFAULT_MAX_NUM_SEQS[is_large_gpu(gpu)]
    return SamplerHeadroom(
        total=gpu.memory_mib * MIB,
        utilization=_float(_last(args, ("--gpu-memory-utilization",)), default_utilization),
        max_num_seqs=seqs,
        vocab_size=shape.vocab_size,
        reserve=int(RESERVE_GIB[layout.model_parallel > 1] * GIB),
        graph_pool=int(CUDA_GRAPH_POOL_GIB * GIB),
    )


def expandable_segments(value: str | None) -> bool:
    """Whether a PYTORCH_CUDA_ALLOC_CONF value turns PyTorch's expandable segments on."""
    options = dict(item.partition(":")[::2] for item in (value or "").split(",") if item)
    return options.get("expandable_segments", "").strip().lower() in ("true", "1")


def is_large_gpu(gpu: Gpu) -> bool:
    """vLLM's larger batch defaults: 70 GiB and more, not an A100, not GB10."""
    gib = gpu.memory_gib or 0
    return gib >= LARGE_GPU_GIB and "a100" not in gpu.name.lower() and gpu.capability != "12.1"


def is_h100_80gb(gpu: Gpu) -> bool:
    return gpu.capability == "9.0" and gpu.memory_gib is not None and gpu.memory_gib <= H100_80GB_MAX_GIB


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
