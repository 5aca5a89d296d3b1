"""More than one GPU: the parallel sizes as vLLM reads them, the GPUs (launcher/gpus.py: what nvidia-smi lists and
CUDA_VISIBLE_DEVICES selects), the model's shape (model/shape.py reads it), and what a plan knows of them (Context; its
memory estimate: memory.py). Data only; preflight.py turns it into checks (G33-G38, G42, docs/known-issues.md) and
plan.py into profile settings.

vLLM is the distributed engine: the sizes are its own flags (`--tensor-parallel-size/-tp`,
`--data-parallel-size/-dp`, `--pipeline-parallel-size/-pp`, `--data-parallel-size-local/-dpl`), given after
`--` and read here the way argparse keeps them (the last occurrence of any spelling wins).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gptoss_patch.errors import UsageError
from gptoss_patch.launcher.gpus import Gpu, Inventory, is_h100_80gb
from gptoss_patch.launcher.static import last_value, scan_flags

TP_FLAGS = ("--tensor-parallel-size", "-tp")
PP_FLAGS = ("--pipeline-parallel-size", "-pp")
DP_FLAGS = ("--data-parallel-size", "-dp")
DP_LOCAL_FLAGS = ("--data-parallel-size-local", "-dpl")
EP_FLAGS = ("--enable-expert-parallel", "-ep")
NNODES_FLAGS = ("--nnodes", "-n")
RAY_FLAGS = ("--distributed-executor-backend", "--data-parallel-backend", "-dpb")

# vLLM's --gpu-memory-utilization default where the installed release's CacheConfig cannot be read
# (static.read_default_utilization; 0.20.2 says 0.92): Context.default_utilization is what the checks use.
DEFAULT_UTILIZATION = 0.9


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
        dp_local=_size(args, DP_LOCAL_FLAGS) if last_value(args, DP_LOCAL_FLAGS) is not None else None,
        expert_parallel=_switch(args, EP_FLAGS),
        nnodes=_size(args, NNODES_FLAGS),
        ray="ray" in ray_backends,
    )


def _switch(args: Sequence[str], names: tuple[str, ...]) -> bool:
    negations = {"--no-" + n[2:] for n in names if n.startswith("--")}
    uses = [u.name for u in scan_flags(list(args)) if u.name in names or u.name in negations]
    return bool(uses) and uses[-1] in names


def _size(args: Sequence[str], names: tuple[str, ...]) -> int:
    value = last_value(args, names)
    if value is None:
        return 1
    if not value.isdigit() or int(value) < 1:
        raise UsageError(f"{names[0]} {value}: expected a whole number of 1 or more")
    return int(value)


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
    """The shape model/shape.py reads (a local config.json, or a released id's published shape), with the bytes of
    its weights; None when it has none, or when its config.json is not readable gpt-oss (vLLM will say what is wrong)."""
    from gptoss_patch.model import shape as model_shapes

    try:
        found = model_shapes.read(model)
    except UsageError:
        return None
    if found is None:
        return None
    if found.config is None:
        return _shape_of(found.recipe, found.source, _recipe_bytes(found.recipe), name=str(model))
    on_disk = sum(p.stat().st_size for p in found.config.parent.glob("*.safetensors"))
    weights = on_disk or _recipe_bytes(found.recipe)  # --load-format dummy needs only config.json and the tokenizer
    return _shape_of(found.recipe, found.source, weights, name=str(found.config.parent))


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


# -- what a plan knows (the memory estimate of it: memory.py) ---------------------------------------


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


