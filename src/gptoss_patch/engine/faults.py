"""Named crash points in apply and revert, for the fault-injection tests.

Production code only calls `reached(step)`, which does nothing unless a test installed a hook
(tests/support/crash_runner.py installs one that SIGKILLs the process at a chosen step). It never reads an
environment variable for it. Every step is listed in STEPS; tests/engine/test_faults.py checks that each
one is reached and survives a kill. `before-rename` lies inside fsutil.atomic_write, below the
engine: install() lends the hook to it there.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gptoss_patch import fsutil

STEPS = {
    "lock-acquired": "the flock on the .dist-info directory is held",
    "lock-released": "about to close the locked descriptor",
    "record-registered": "RECORD now lists files we are about to create (record.register)",
    "record-unregistered": "RECORD lost our rows again (record.unregister)",
    "before-rename": "a temporary file is written and fsynced, not yet renamed over its target (atomic_write)",
    "blob-stored": "one object (an original or new bytes) is stored",
    "journal-written": "the journal is durable; no target file replaced yet",
    "ledger-written": "the ledger for after the operation is durable",
    "before-file": "about to replace one target file",
    "file-replaced": "one target file is renamed into place; its stale bytecode not yet removed",
    "after-file": "one target file is replaced and its stale bytecode removed",
    "before-journal-clear": "every target file is replaced; the journal is still there",
    "journal-cleared": "the journal is gone; unneeded objects not yet collected",
    "object-removed": "one unneeded object was deleted (garbage collection)",
    "ledger-removed": "the ledger file is gone, the rest of the ledger directory not yet (destroy)",
    "journal-removed": "the journal is gone too (destroy)",
    "contents-removed": "the ledger directory is empty, RECORD still lists its files (destroy)",
}

_hook: Callable[[str, Path | None], None] | None = None


def install(hook: Callable[[str, Path | None], None] | None) -> None:
    global _hook
    _hook = hook
    fsutil.crash_point = _before_rename if hook is not None else None


def _before_rename(path: Path) -> None:
    reached("before-rename", path)


def reached(step: str, path: Path | None = None) -> None:
    if _hook is not None:
        _hook(step, path)
