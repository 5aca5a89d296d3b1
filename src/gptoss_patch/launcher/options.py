"""What the user asked a launch for: the options `serve`, `doctor`, `bench`, `numerics` and `tune` share, validated by
plan.launch_options into one LaunchOptions, and the GPU profile chosen (profiles.choose_gpu). Data only, below every
other launcher module (results.LaunchPlan carries the options it was resolved from)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

LOOPBACK = "127.0.0.1"
PLACEMENTS = ("developer", "system")
DEFAULT_PLACEMENT = "developer"


def is_loopback(host: str) -> bool:
    """Whether a server bound to `host` is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class GpuChoice:
    profile: str
    source: str  # how it was chosen, for the `gpu` check
    detected: bool  # False when nvidia-smi was absent and cpu is a fallback


@dataclass(frozen=True)
class LaunchOptions:
    """What the user asked for, validated by plan.launch_options."""

    model: str | None
    gpu: GpuChoice
    concurrency: tuple[int, ...] = ()
    host: str = LOOPBACK
    port: int = 8000
    extra_args: tuple[str, ...] = ()
    allow_unpatched: bool = False
    allow_unauthenticated: bool = False
    expect_reasoning: bool = False
    vocab: Path | None = None  # --vocab
    instructions: str | None = None  # --instructions developer|system; None: not given (developer, upstream's default)
    fast_moe: bool = False  # --fast-moe: Marlin's MXFP4 MoE kernel on sm90 (profiles.fast_moe_choice)

    @property
    def placement(self) -> str:
        return self.instructions or DEFAULT_PLACEMENT
