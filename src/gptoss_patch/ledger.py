"""The ledger: originals and hashes of every file gptoss-patch wrote, plus the journal and the lock.

It lives in `<vllm>.dist-info/gptoss_patch/`, each file registered in vLLM's RECORD, so it is removed
together with the installation it describes (a reinstall starts with no ledger; see record.py).
Layout: `ledger.json` (hashes, patch ids), `objects/<sha256>` (original and new bytes),
`journal.json` (present only while an apply or revert is under way).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from gptoss_patch import faults
from gptoss_patch.errors import Conflict, Locked
from gptoss_patch.fsutil import atomic_write, sha256, temp_name
from gptoss_patch.record import register, unregister
from gptoss_patch.target import Installation

DIRNAME = "gptoss_patch"
FORMAT = 1
LOCK_TIMEOUT_ENV = "GPTOSS_PATCH_LOCK_TIMEOUT"
_HEX64 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class FileEntry:
    """One file gptoss-patch wrote: what it held before, what we wrote, which patches made it."""

    original: str
    patched: str
    patches: tuple[str, ...]
    mode: int = 0o644
    diffs: tuple[str, ...] = ()  # blobs of --with-diff texts applied before the codemods


@dataclass(frozen=True)
class Ledger:
    vllm_version: str
    files: dict[str, FileEntry] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        files = {path: {**asdict(e), "patches": list(e.patches), "diffs": list(e.diffs)} for path, e in self.files.items()}
        return {"format": FORMAT, "vllm_version": self.vllm_version, "files": files}


@dataclass(frozen=True)
class Write:
    """One planned file replacement (a journal row). `before` is None for a file that did not exist."""

    path: str
    before: str | None
    after: str
    mode: int


class Store:
    """The ledger directory of one vLLM installation."""

    def __init__(self, inst: Installation) -> None:
        self.inst = inst
        self.dir = inst.dist_info / DIRNAME
        self.prefix = f"{inst.dist_info.name}/{DIRNAME}/"

    # -- reading -----------------------------------------------------------------------------
    def load(self) -> Ledger:
        path = self.dir / "ledger.json"
        if not path.exists():
            return Ledger(str(self.inst.version))
        return self._parse_ledger(self._read_json(path))

    def _parse_ledger(self, raw: Any) -> Ledger:
        if not isinstance(raw, dict) or raw.get("format") != FORMAT or not isinstance(raw.get("files"), dict):
            raise self._corrupt("unknown format")
        if raw.get("vllm_version") != str(self.inst.version):
            raise self._corrupt(f"it describes vllm {raw.get('vllm_version')}, but {self.inst.version} is installed")
        return Ledger(str(self.inst.version), {self._checked_path(p): self._entry(p, e) for p, e in raw["files"].items()})

    def _entry(self, path: str, raw: Any) -> FileEntry:
        try:
            entry = FileEntry(
                original=raw["original"], patched=raw["patched"], patches=tuple(raw["patches"]),
                mode=int(raw.get("mode", 0o644)), diffs=tuple(raw.get("diffs", ())),
            )
        except (KeyError, TypeError, ValueError):
            raise self._corrupt(f"bad entry for {path}") from None
        if not all(_HEX64.fullmatch(h) for h in (entry.original, entry.patched, *entry.diffs)):
            raise self._corrupt(f"bad hash for {path}")
        return entry

    def _checked_path(self, relpath: str) -> str:
        """Ledger paths must name a file inside the vllm package: no traversal, no absolute paths."""
        pure = PurePosixPath(relpath)
        inside = self.inst.package_root.resolve()
        resolved = (self.inst.site_packages / pure).resolve()
        if pure.is_absolute() or ".." in pure.parts or pure.parts[:1] != ("vllm",) or not resolved.is_relative_to(inside):
            raise self._corrupt(f"path {relpath!r} points outside the vllm package")
        return relpath

    def _read_json(self, path: Path) -> Any:
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise self._corrupt(f"unreadable ({exc.__class__.__name__})") from None

    def _corrupt(self, why: str) -> Conflict:
        return Conflict(
            f"the gptoss-patch ledger at {self.dir} cannot be trusted: {why}; nothing was written",
            hint="inspect it; if it is not needed, reinstall vllm (pip install --force-reinstall --no-deps vllm==VERSION)",
        )

    def blob(self, digest: str) -> bytes:
        try:
            data = (self.dir / "objects" / digest).read_bytes()
        except OSError:
            raise self._corrupt(f"object {digest[:12]} is missing") from None
        if sha256(data) != digest:
            raise self._corrupt(f"object {digest[:12]} does not match its hash")
        return data

    def journal(self) -> dict[str, Any] | None:
        path = self.dir / "journal.json"
        return self._read_json(path) if path.exists() else None

    def has_journal(self) -> bool:
        return (self.dir / "journal.json").exists()

    # -- writing (callers hold the lock) ---------------------------------------------------------
    def _register(self, *names: str) -> None:
        """List our files in RECORD before creating them, so pip removes them with vLLM."""
        rels = [self.prefix + n for n in names]
        register(self.inst.record, [r for n in rels for r in (n, str(temp_name(Path(n))))])

    def reserve(self, blobs: list[bytes]) -> None:
        """Register, in one RECORD update, every file a transaction may create."""
        self._register("ledger.json", "journal.json", *(f"objects/{sha256(b)}" for b in blobs))

    def put_blob(self, data: bytes) -> str:
        """Store `data` (its name registered by reserve() first)."""
        digest = sha256(data)
        path = self.dir / "objects" / digest
        if path.exists() and sha256(path.read_bytes()) == digest:
            return digest
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, data, 0o644)
        return digest

    def save(self, ledger: Ledger) -> None:
        self._register("ledger.json")
        atomic_write(self.dir / "ledger.json", _dump(ledger.to_json()), 0o644)

    def begin(self, op: str, writes: list[Write], ledger: Ledger) -> None:
        self._register("journal.json")
        self.dir.mkdir(parents=True, exist_ok=True)
        body = {"op": op, "pid": os.getpid(), "writes": [asdict(w) for w in writes], "ledger": ledger.to_json()}
        atomic_write(self.dir / "journal.json", _dump(body), 0o644)
        faults.reached("journal-written")

    def end(self) -> None:
        faults.reached("before-journal-clear")
        (self.dir / "journal.json").unlink(missing_ok=True)
        self.collect_garbage()

    def parse_journal_ledger(self, raw: Any) -> Ledger:
        return self._parse_ledger(raw)

    def collect_garbage(self) -> None:
        """Drop objects no ledger entry needs; remove the whole directory once the ledger is empty."""
        ledger = self.load()
        if not ledger.files and not self.has_journal():
            self.destroy()
            return
        keep = {h for e in ledger.files.values() for h in (e.original, *e.diffs)}
        for obj in (self.dir / "objects").glob("*"):
            if obj.name not in keep:
                obj.unlink(missing_ok=True)

    def destroy(self) -> None:
        """Leave no trace: our directory goes, and RECORD is byte-identical to what pip wrote."""
        if self.dir.exists():
            shutil.rmtree(self.dir)
        unregister(self.inst.record, self.prefix)

    def tidy(self) -> None:
        """Finish a clean-up a crash interrupted: stray temporaries, an empty directory, RECORD rows."""
        for stray in self.dir.rglob("*.gptoss-tmp") if self.dir.exists() else ():
            stray.unlink(missing_ok=True)
        temp_name(self.inst.record).unlink(missing_ok=True)
        if not (self.dir / "ledger.json").exists() and not self.has_journal():
            if self.dir.exists() or any(self.prefix in line for line in _lines(self.inst.record)):
                self.destroy()

    # -- locking -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def locked(self, timeout: float | None = None) -> Iterator[None]:
        """Exclusive lock on the dist-info directory (flock: the kernel drops it if we are killed)."""
        limit = timeout if timeout is not None else float(os.environ.get(LOCK_TIMEOUT_ENV, "120"))
        fd = os.open(self.inst.dist_info, os.O_RDONLY)
        try:
            _acquire(fd, limit, self.inst.dist_info)
            yield
        finally:
            os.close(fd)  # closing releases the flock


def _acquire(fd: int, limit: float, where: Path) -> None:
    deadline = time.monotonic() + limit
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise Locked(
                    f"another gptoss-patch run has held the lock on {where} for more than {limit:.0f}s",
                    hint=f"wait for it to finish, or raise {LOCK_TIMEOUT_ENV}",
                ) from None
            time.sleep(0.05)


def _dump(payload: dict[str, Any]) -> bytes:
    return (json.dumps(payload, indent=1, sort_keys=True) + "\n").encode()


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
