"""Careful file operations: hashing, durable atomic replacement, stale bytecode removal."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
from pathlib import Path

from gptoss_patch import faults
from gptoss_patch.errors import WriteFailed


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str | None:
    try:
        return sha256(path.read_bytes())
    except FileNotFoundError:
        return None


def temp_name(path: Path) -> Path:
    """The one temporary sibling a replacement of `path` may leave behind (cleaned on recovery)."""
    return path.with_name(path.name + ".gptoss-tmp")


def atomic_write(path: Path, data: bytes, mode: int | None = None, *, sync_dir: bool = True) -> None:
    """Replace `path` with `data` so that a crash leaves either the old or the new bytes.

    The write goes through a sibling temporary file, is fsynced, renamed over the target (which
    replaces a symlink's target file, not the link: we resolve first), and the directory is fsynced
    (unless the caller syncs it once after several writes: sync_dir=False).
    """
    real = path.resolve()
    tmp = temp_name(real)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            _write_all(fd, data)
            os.fchmod(fd, mode if mode is not None else _mode_of(real))
            os.fsync(fd)
        finally:
            os.close(fd)
        faults.reached("before-rename", real)
        os.replace(tmp, real)
        if sync_dir:
            fsync_dir(real.parent)
    except OSError as exc:
        # On a read-only filesystem even removing the (never created) temporary fails with EROFS:
        # that must not replace the real error with a raw OSError.
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise write_failed(real, exc) from None


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
