"""Careful file operations every layer shares: hashing, the one atomic write, stale bytecode removal.

It sits below everything that writes (the engine's ledger and target files, the hook's files, the
vocabulary, the JSON caches), so it imports nothing of gptoss-patch but its errors: the engine's
crash points reach into `atomic_write` through `crash_point`, which only engine.faults sets.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
from collections.abc import Callable
from pathlib import Path

from gptoss_patch.errors import WriteFailed

# Called with the target path after the temporary is durable and before it is renamed over the target
# (the crash point `before-rename`); engine.faults installs a test's hook here, production never does.
crash_point: Callable[[Path], None] | None = None


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: Path) -> str:
    """sha256 of a file, read in 1 MiB blocks (a vocabulary, a multi-GB library: never whole in memory)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def temp_name(path: Path) -> Path:
    """The one temporary sibling a replacement of `path` may leave behind (cleaned on recovery)."""
    return path.with_name(path.name + ".gptoss-tmp")


def atomic_write(
    path: Path, data: bytes, mode: int | None = None, *, sync_dir: bool = True, concurrent: bool = False
) -> None:
    """Replace `path` with `data` so that a crash leaves either the old or the new bytes.

    The write goes through a sibling temporary file, is fsynced, renamed over the target (which
    replaces a symlink's target file, not the link: we resolve first), and the directory is fsynced
    (unless the caller syncs it once after several writes: sync_dir=False).

    The temporary is `temp_name(path)`, the one name the ledger registers in RECORD and recovery
    removes: right for writes made under a lock. `concurrent=True` is for files other processes may
    write at the same moment (caches, the vocabulary): each writer gets a temporary of its own, and
    there is no crash point, because nothing needs recovering (a reader of a cache recomputes, an
    interrupted `vocab install` is run again).
    """
    real = path.resolve()
    tmp = _unique_temp_name(real) if concurrent else temp_name(real)
    try:
        _write_durably(tmp, data, mode if mode is not None else _mode_of(real), exclusive=concurrent)
        if crash_point is not None and not concurrent:
            crash_point(real)
        os.replace(tmp, real)
        if sync_dir:
            fsync_dir(real.parent)
    except OSError as exc:
        # On a read-only filesystem even removing the (never created) temporary fails with EROFS:
        # that must not replace the real error with a raw OSError.
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise write_failed(real, exc) from None


def _unique_temp_name(real: Path) -> Path:
    # Hidden, and unique per process and call, so parallel writers never share a temporary file.
    return real.with_name(f".{real.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")


def _write_durably(tmp: Path, data: bytes, mode: int, *, exclusive: bool) -> None:
    flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC)
    fd = os.open(tmp, flags, 0o600)
    try:
        _write_all(fd, data)
        os.fchmod(fd, mode)
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _mode_of(path: Path) -> int:
    try:
        return path.stat().st_mode & 0o7777
    except FileNotFoundError:
        return 0o644


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_failed(path: Path, exc: OSError) -> WriteFailed:
    reasons = {errno.EACCES: "permission denied", errno.EROFS: "read-only filesystem", errno.ENOSPC: "no space left"}
    reason = reasons.get(exc.errno or 0, exc.strerror or str(exc))
    return WriteFailed(f"cannot write {path}: {reason}; nothing was changed", hint="fix the cause and run the command again")


def remove_stale_bytecode(source: Path) -> None:
    """Delete cached .pyc files of `source` so no interpreter keeps running the old code."""
    cache_dir = source.parent / "__pycache__"
    for pyc in cache_dir.glob(f"{source.stem}.*.pyc"):
        pyc.unlink(missing_ok=True)
