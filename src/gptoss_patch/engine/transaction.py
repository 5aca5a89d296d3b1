"""The one way files change: a journalled transaction, and the recovery that finishes an interrupted one.

`commit` stores originals and new bytes, then makes the journal and the ledger durable before any
target file is replaced, so an interruption at any point is finished by the next command of any
kind (`recover`, which every command calls first).

A file a user patch creates is a row with no `before` (its missing folders are made first); taking it out
again, a row with no `after` (and the folders that leaves empty go too).
RECORD lists a created file (with its hash) from just before it is created until just after it is
removed, so `pip uninstall` never leaves it behind, and a roll-back removes file and row alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gptoss_patch import interrupts
from gptoss_patch.engine import faults
from gptoss_patch.engine.context import Context
from gptoss_patch.engine.ledger import FileEntry, Ledger, Store, Write
from gptoss_patch.engine.record import add_rows, drop_rows
from gptoss_patch.errors import Conflict, WriteFailed
from gptoss_patch.fsutil import atomic_write, remove_stale_bytecode, sha256, write_failed
from gptoss_patch.target import Installation


@dataclass(frozen=True)
class FilePlan:
    rel: str
    before: bytes | None  # on disk now (None: the file does not exist yet)
    after: bytes | None  # None: the file is removed (a created file taken out again)
    entry: FileEntry | None  # the ledger entry afterwards (None: the file is back to its original)


def commit(ctx: Context, op: str, plans: list[FilePlan], diff_blobs: dict[str, list[bytes]] | None = None) -> None:
    """Store originals, journal and ledger durably, then replace the files one by one.

    The bytes on disk before (`p.before`) are stored too, so that a write the filesystem refuses
    (read-only, full) is undone through the same journal (`_undo`); garbage collection drops them.
    A signal (SIGINT, SIGTERM, SIGHUP) that lands in here waits until the transaction is complete.
    """
    with interrupts.deferred(op):
        _commit(ctx, op, plans, diff_blobs)


def _commit(ctx: Context, op: str, plans: list[FilePlan], diff_blobs: dict[str, list[bytes]] | None) -> None:
    store = ctx.store
    extra = [b for blobs in (diff_blobs or {}).values() for b in blobs]
    blobs = list(dict.fromkeys(b for b in (*(p.before for p in plans), *extra, *(p.after for p in plans)) if b is not None))
    ledger = _ledger_after(ctx.ledger, plans)
    writes = [Write(p.rel, _digest(p.before), _digest(p.after), _mode(ctx, p), _created(ctx, p)) for p in plans]
    try:
        store.reserve(blobs)
        for blob in blobs:
            store.put_blob(blob)
        store.begin(op, writes, ledger)
    except WriteFailed:
        store.discard()  # no target file was touched; a first apply leaves no ledger directory either
        raise
    try:
        store.save(ledger)
        faults.reached("ledger-written")
        _list_created(ctx.inst, {p.rel: p.after for p, w in zip(plans, writes) if w.created and p.after is not None})
        for plan, write in zip(plans, writes):
            _replace_file(ctx.inst, plan.rel, plan.after, write.mode)
        _unlist_removed(ctx.inst, writes)
    except WriteFailed as exc:
        _undo(ctx, op, writes, exc)
    store.end(ledger)
    ctx.ledger = ledger


def _undo(ctx: Context, op: str, writes: list[Write], failure: WriteFailed) -> None:
    """A write failed after the journal: journal the way back, then put back what was replaced.

    The roll-back is itself journalled, so a kill during it is finished by the next command like any
    other. If even the roll-back cannot write, the first journal stays and the next command
    completes the operation once the filesystem accepts writes. Always raises.
    """
    store = ctx.store
    back = [Write(w.path, w.after, w.before, w.mode, w.created) for w in writes]
    try:
        store.begin(f"roll-back of a failed {op}", back, ctx.ledger)
        store.save(ctx.ledger)
        _finish(ctx.inst, store, back)
        store.end(ctx.ledger)
    except WriteFailed as second:
        raise WriteFailed(
            f"{failure}; putting back the files already written failed too ({second})",
            hint=f"free space or make the files writable, then run any gptoss-patch command: it finishes the {op} or its roll-back",
        ) from None
    raise failure


def _ledger_after(ledger: Ledger, plans: list[FilePlan]) -> Ledger:
    files = dict(ledger.files)
    for plan in plans:
        if plan.entry is None:
            files.pop(plan.rel, None)
        else:
            files[plan.rel] = plan.entry
    return Ledger(ledger.vllm_version, files)


def _mode(ctx: Context, plan: FilePlan) -> int:
    return plan.entry.mode if plan.entry else ctx.ledger.files[plan.rel].mode


def _digest(data: bytes | None) -> str | None:
    return sha256(data) if data is not None else None


def _replace_file(inst: Installation, rel: str, data: bytes | None, mode: int) -> None:
    path = inst.site_packages / rel
    faults.reached("before-file", path)
    if data is None:
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            raise write_failed(path, exc) from None
    else:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)  # a created file's new folders (userdiffs)
        except OSError as exc:
            raise write_failed(path.parent, exc) from None
        atomic_write(path, data, mode)
    faults.reached("file-replaced", path)
    remove_stale_bytecode(path)
    if data is None:
        _prune_empty_folders(path.parent, inst.package_root)
    faults.reached("after-file", path)


def _prune_empty_folders(folder: Path, package_root: Path) -> None:
    """Remove the folders a removed created file leaves empty (their own stale __pycache__ included), up to
    the package's root. A wheel installs no empty folder, so an empty one here can only be a created file's."""
    while folder != package_root and package_root in folder.parents:
        cache = folder / "__pycache__"
        try:
            if cache.is_dir() and not any(cache.iterdir()):
                cache.rmdir()
            folder.rmdir()  # fails while anything else is in it: then the folders above hold files too
        except OSError:
            return
        folder = folder.parent


def _created(ctx: Context, plan: FilePlan) -> bool:
    """Whether the row is about a file a user patch creates (in the ledger before or after)."""
    old = ctx.ledger.files.get(plan.rel)
    return bool((plan.entry is not None and plan.entry.created) or (old is not None and old.created))


def _list_created(inst: Installation, rows: dict[str, bytes]) -> None:
    """RECORD rows (hash and size) for the files user patches create, before they are created."""
    if rows:
        try:
            add_rows(inst.record, rows)
        except OSError as exc:
            raise write_failed(inst.record, exc) from None


def _unlist_removed(inst: Installation, writes: list[Write]) -> None:
    """Drop the RECORD rows of the files the transaction removed, once they are gone."""
    gone = {w.path for w in writes if w.after is None and w.created}
    if gone:
        try:
            drop_rows(inst.record, gone)
        except OSError as exc:
            raise write_failed(inst.record, exc) from None


def _finish(inst: Installation, store: Store, writes: list[Write]) -> None:
    """Roll every row forward (a journal's, or a roll-back's), with the RECORD rows of created files."""
    _list_created(inst, {w.path: store.blob(w.after) for w in writes if w.after is not None and w.created})
    for write in writes:
        _roll_forward(inst, store, write)
    _unlist_removed(inst, writes)


def recover(inst: Installation, *, locked: bool = False) -> tuple[str, ...]:
    """Finish an apply or revert that was interrupted; a no-op (one stat) when none was."""
    store = Store(inst)
    if not store.has_journal() and not (store.dir.exists() and not (store.dir / "ledger.json").exists()):
        return ()
    if not locked:
        with store.locked():
            return recover(inst, locked=True)
    with interrupts.deferred("recovery of an interrupted run"):
        return _recover(inst, store)


def _recover(inst: Installation, store: Store) -> tuple[str, ...]:
    journal = store.journal()
    if journal is None:
        if store.tidy():
            return ("removed the leftover ledger files of an interrupted gptoss-patch run; no vllm file needed to change",)
        return ()
    _finish(inst, store, journal.writes)
    store.save(journal.ledger)
    store.end(journal.ledger)
    store.remove_strays()
    return (f"completed an interrupted {journal.op} of {len(journal.writes)} file(s) (process {journal.pid})",)


def _roll_forward(inst: Installation, store: Store, write: Write) -> None:
    path = inst.site_packages / write.path  # journal rows were checked when read; roll-back rows are ours
    current = sha256(path.read_bytes()) if path.exists() else None
    if current == write.after:
        remove_stale_bytecode(path)  # a kill may have come between the rename (or removal) and this
        return
    if current != write.before:
        raise Conflict(
            f"an interrupted run left {write.path} with unexpected content (sha256 {str(current)[:12]}); nothing was written",
            hint=f"reinstall vllm ({inst.reinstall_command}) and apply again",
        )
    _replace_file(inst, write.path, store.blob(write.after) if write.after is not None else None, write.mode)
