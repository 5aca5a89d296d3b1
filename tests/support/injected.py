"""`with injected(hook):` a fault hook (gptoss_patch.engine.faults) for the body only, removed on every exit."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from gptoss_patch.engine import faults


@contextmanager
def injected(hook: Callable[[str, Path | None], None]) -> Iterator[None]:
    faults.install(hook)
    try:
        yield
    finally:
        faults.install(None)
