"""Named crash points in apply and revert, for the fault-injection tests.

Production code only calls `reached(step)`, which does nothing unless a test installed a hook
(tests/crash_runner.py installs one that SIGKILLs the process at a chosen step).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

_hook: Callable[[str, Path | None], None] | None = None


def install(hook: Callable[[str, Path | None], None] | None) -> None:
    global _hook
    _hook = hook


def reached(step: str, path: Path | None = None) -> None:
    if _hook is not None:
        _hook(step, path)
