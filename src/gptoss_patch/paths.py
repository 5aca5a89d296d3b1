"""Where gptoss-patch keeps its own files, and a small JSON cache that never blocks a command."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gptoss_patch.errors import WriteFailed
from gptoss_patch.fsutil import atomic_write


def cache_home(environ: Mapping[str, str] = os.environ) -> Path:
    """$XDG_CACHE_HOME/gptoss-patch (a relative XDG_CACHE_HOME is invalid per the spec: ignored)."""
    xdg = environ.get("XDG_CACHE_HOME", "")
    return (Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache") / "gptoss-patch"


def read_json(path: Path) -> Any:
    """The cached value, or None when there is none or it cannot be read (callers recompute)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def write_json(path: Path, payload: Any) -> None:
    """Best effort and atomic: readers never see half an entry; a read-only home only costs speed."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(payload).encode("utf-8"), sync_dir=False, concurrent=True)
    except (OSError, WriteFailed):
        pass
