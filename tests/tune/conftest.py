"""Launch plans for the tune tests, made in memory: the fields tune reads (the GPU profile, the capabilities the static
readers would find, nvidia-smi's GPUs, the model's shape), nothing installed and nothing started. The tool's cache
root is each test's own (tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from packaging.version import Version

from gptoss_patch.launcher import parallel, static
from gptoss_patch.launcher.gpus import Gpu, Inventory
from gptoss_patch.launcher.results import LaunchPlan, Setting
from gptoss_patch.target import Installation

MODEL = "openai/gpt-oss-20b"
H100 = Gpu(0, "GPU-0000aaaa-bbbb", "NVIDIA H100 80GB HBM3", "9.0", 81559)
FLAGS = ("--moe-backend", "--attention-backend", "--cudagraph-capture-sizes", "--max-num-batched-tokens",
         "--max-num-seqs", "--async-scheduling", "--no-async-scheduling", "--tensor-parallel-size", "--data-parallel-size")


def make_plan(
    site: Path, *, profile: str = "sm90", gpus: Sequence[Gpu] = (H100,), version: str = "0.20.2",
    distribution: str = "vllm", flags: Sequence[str] = FLAGS, moe_choices: Sequence[str] = ("marlin", "triton",
    "flashinfer_trtllm", "flashinfer_cutlass"), honours_moe: bool = True, extra_args: Sequence[str] = (),
    settings: Sequence[Setting] = (), model: str = MODEL,
) -> LaunchPlan:  # fmt: skip
    """A plan as resolve() would make it for `profile` (cpu: no GPUs) with these flags, MoE choices and GPUs."""
    caps = static.Capabilities(
        Version(version), static.EnvRegistry(frozenset()), static.FlagRegistry(frozenset(flags)),
        static.MoeSelector(frozenset(), honours_moe, tuple(moe_choices)),
    )  # fmt: skip
    hardware = None if profile == "cpu" else Inventory(tuple(gpus), tuple(gpus))
    context = parallel.Context(parallel.layout_of(extra_args), hardware, parallel.model_shape(model))
    site.mkdir(parents=True, exist_ok=True)
    inst = Installation(str(site / "bin" / "python"), Version(version), site, site / f"vllm-{version}.dist-info",
                        distribution=distribution)
    return LaunchPlan(
        installation=inst, executable=site / "bin" / "vllm", model=model, profile=profile, profile_source="--gpu",
        settings=(Setting.flag("--host", "127.0.0.1", why="loopback"), Setting.flag("--port", "8000", why="port"), *settings),
        notes=(), extra_args=tuple(extra_args), base_env={"HOME": str(site)}, capabilities=caps, parallel=context,
        patch_report=None, options=None, vocabulary=None,
    )  # fmt: skip

