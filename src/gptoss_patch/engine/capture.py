"""`capture`: the user's hand edits to the installed vLLM, written as one version-keyed patch file.

An edit is whatever differs from what the wheel installed (RECORD's hash) and from what gptoss-patch
wrote (the ledger): for a file a built-in patch changed, the codemods' own change is taken out first
(`git apply -R` of the diff they make), so the patch file holds the user's lines only, against the
file as it was before the codemods. It applies with `git apply -p1` from site-packages.

RECORD has hashes, not bytes: the pristine text of a file gptoss-patch never wrote comes from the
release's wheel (`--from FILE`, checked file by file against RECORD). The capture is then recorded
in the ledger as applied, through the same transaction as `apply` (no vllm file changes), so
`status` proves it from hashes and `revert --only NAME` takes it out again.

A new text file inside the package (one RECORD does not list) is captured as a git-style creation
(`--- /dev/null`); the ledger marks it created and RECORD gets its row, so `revert` and
`pip uninstall` remove it. Deleted files, empty or binary new files are reported, not captured.
"""

from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from gptoss_patch import interrupts, wheels
from gptoss_patch.engine.audit import added_files, current_hashes, record_rows
from gptoss_patch.engine.context import Context, decode, encode, open_context
from gptoss_patch.engine.diff import creation_diff, unified_diff
from gptoss_patch.engine.ledger import EMPTY, FileEntry, Store
from gptoss_patch.engine.transaction import FilePlan, commit, recover
from gptoss_patch.errors import Conflict, UsageError, WriteFailed, cause, detail_of
from gptoss_patch.fsutil import atomic_write, sha256, write_failed
from gptoss_patch.registry import by_id, ids
from gptoss_patch.target import Installation
from gptoss_patch.userpatches import SUFFIX, check_name, check_versions, header
from gptoss_patch.versions import in_range


@dataclass(frozen=True)
class Captured:
    name: str
    path: Path
    versions: str
    files: tuple[str, ...]  # captured (empty: nothing to capture, nothing written)
    skipped: tuple[tuple[str, str], ...] = ()  # (file, why it is not captured): deleted, binary or empty new files
    text: str = ""
    created: tuple[str, ...] = ()  # those of `files` the patch creates

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "path": str(self.path), "vllm": self.versions, "files": list(self.files),
                "created": list(self.created), "skipped": [{"path": rel, "why": why} for rel, why in self.skipped]}


def capture(
    inst: Installation, name: str, directory: Path, *, files: tuple[str, ...] = (), versions: str | None = None,
    pristine: Path | None = None, download: bool = True, downloading: wheels.Progress | None = None,
) -> Captured:
    """`pristine`: the release's wheel (`--from`); else the wheel cache, where the release's wheel is
    downloaded (outside the lock, then the capture starts again) when a file needs it and `download`."""
    try:
        return _capture(inst, name, directory, files, versions, pristine, download=download)
    except _NeedWheel:
        pass
    requirement = f"{inst.distribution}=={inst.version.public}"
    wheels.fetch(requirement, _pattern(inst), about=f"the wheel of {inst.label}", python=inst.python, downloading=downloading,
                 hint=f"pass --from WHEEL with the wheel of {inst.label} (pip download --no-deps {requirement} -d DIR)")
    return _capture(inst, name, directory, files, versions, pristine, download=False)


def _pattern(inst: Installation) -> str:
    return wheels.file_prefix(inst.distribution, inst.version.public) + "*.whl"


class _NeedWheel(Exception):
    """A file gptoss-patch never wrote needs its pristine text and no wheel of the release is cached."""


def _capture(
    inst: Installation, name: str, directory: Path, files: tuple[str, ...], versions: str | None, pristine: Path | None,
    *, download: bool,
) -> Captured:
    """One capture under the lock; raises _NeedWheel (nothing written) when the release's wheel must be downloaded."""
    check_name(name, ids())
    _check_directory(directory)
    target = directory / f"{name}{SUFFIX}"
    if target.exists():
        raise UsageError(f"{target} exists already; choose another name or remove it")
    versions = check_versions(versions or f"=={inst.version.public}")
    if not in_range(Version(inst.version.public), versions):
        raise UsageError(f"--vllm-range {versions} does not include the installed vllm {inst.version.public}")
    with Store(inst).locked():
        recover(inst, locked=True)
        ctx = open_context(inst)
        rows = record_rows(inst)
        wanted = _wanted(inst, rows, files)
        edits, skipped = _edits(inst, ctx, rows, wanted)
        new, more = _new_files(inst, rows, wanted)
        skipped += more
        if not edits and not new:
            return Captured(name, target, versions, (), skipped)
        bases = _bases(ctx, edits, pristine, download) if edits else {}
        diffs = {rel: unified_diff(rel, bases[rel][0], view) for rel, view in _user_views(ctx, edits, bases).items()}
        diffs.update({rel: creation_diff(rel, data) for rel, data in new.items()})
        text = header(name, versions) + "".join(d for d in diffs.values() if d)
        captured = tuple(rel for rel, d in diffs.items() if d)
        if not captured:
            return Captured(name, target, versions, (), skipped)
        with interrupts.deferred("capture"):  # the patch file and the ledger that records it, together
            _write_patch(directory, target, text)
            _adopt(ctx, name, text.encode("utf-8"), captured, bases, {**edits, **new}, set(new))
    return Captured(name, target, versions, captured, skipped, text, tuple(rel for rel in captured if rel in new))


def _new_files(
    inst: Installation, rows: dict[str, tuple[str, int]], wanted: list[str] | None
) -> tuple[dict[str, bytes], tuple[tuple[str, str], ...]]:
    """rel -> bytes of each new text file in the package (not in RECORD), and the new files left out."""
    found = [f.path for f in added_files(inst, set(rows))] if wanted is None else [r for r in wanted if r not in rows]
    new: dict[str, bytes] = {}
    skipped: list[tuple[str, str]] = []
    for rel in found:
        data = (inst.site_packages / rel).read_bytes()
        if not data:
            skipped.append((rel, "is a new empty file: not captured (a patch cannot create an empty file)"))
        elif decode(data) is None:
            skipped.append((rel, "is a new file that is not UTF-8 text: not captured (a patch holds text only)"))
        else:
            new[rel] = data
    return new, tuple(skipped)


def _wanted(inst: Installation, rows: dict[str, tuple[str, int]], files: tuple[str, ...]) -> list[str] | None:
    """--files, as site-packages-relative paths of the vllm package (None: every file)."""
    if not files:
        return None
    out = []
    root = inst.package_root.resolve()
    for given in files:
        path = Path(given)
        if not path.is_absolute():
            path = inst.site_packages / given if given.startswith("vllm/") else Path.cwd() / given
        real = path.resolve()
        if not real.is_relative_to(root):
            raise UsageError(f"{given} is not a file of the vllm package at {inst.package_root}; only files inside it can be captured")
        rel = real.relative_to(inst.site_packages.resolve()).as_posix()
        if rel not in rows and not real.is_file():
            raise UsageError(f"{rel} is neither listed in vllm's RECORD nor a file in the package; nothing to capture there")
        out.append(rel)
    return out


def _edits(
    inst: Installation, ctx: Context, rows: dict[str, tuple[str, int]], wanted: list[str] | None
) -> tuple[dict[str, bytes], tuple[tuple[str, str], ...]]:
    """rel -> current bytes of each file that holds something neither the wheel nor gptoss-patch put there,
    and the changed files left out (deleted ones, edits of files a user patch created)."""
    vllm_rows = {rel: row for rel, row in rows.items() if rel.startswith("vllm/") and (wanted is None or rel in wanted)}
    hashes = current_hashes(inst, vllm_rows)
    edits = {}
    skipped: list[tuple[str, str]] = []
    for rel, (expected, _size) in sorted(vllm_rows.items()):
        digest = hashes.get(rel)
        entry = ctx.ledger.files.get(rel)
        if digest == (entry.patched if entry else expected):
            continue
        if digest is None:
            why = ("was removed after gptoss-patch created it: not captured (revert that patch)" if entry and entry.created
                   else "was deleted: not captured (user patches cannot delete files; reinstall vllm to get it back, "
                   "or empty it instead of deleting it)")
            skipped.append((rel, why))
            continue
        if entry is not None and entry.created:
            skipped.append((rel, f"was created by user patch {entry.patches[0]} and edited since: not captured "
                                 f"(edit {entry.patches[0]}.diff instead, or revert it and capture the file again)"))
            continue
        data = ctx.read(rel)
        if data is not None:
            edits[rel] = data
    return edits, tuple(skipped)


def _bases(ctx: Context, edits: dict[str, bytes], pristine: Path | None, download: bool) -> dict[str, tuple[bytes, bytes]]:
    """rel -> (the file before the user's new edit, the same after the codemods the ledger lists)."""
    bases: dict[str, tuple[bytes, bytes]] = {}
    need_wheel = [rel for rel in edits if rel not in ctx.ledger.files]
    wheel = _pristine(ctx.inst, need_wheel, pristine, download) if need_wheel else {}
    for rel in edits:
        entry = ctx.ledger.files.get(rel)
        if entry is None:
            bases[rel] = (wheel[rel], wheel[rel])
            continue
        base = ctx.store.blob(entry.original)
        if entry.diffs:
            from gptoss_patch.engine import withdiff

            base = withdiff.replay(rel, base, [ctx.store.blob(d) for d in entry.diffs])
        specs = [by_id()[p] for p in entry.patches if p in by_id()]
        patched = encode(ctx.rewrite(specs, decode(base) or ""), base) if specs else base
        if sha256(patched) != entry.patched:
            raise Conflict(f"cannot tell your edit of {rel} from what gptoss-patch wrote (rebuilding it gives another hash); nothing was written")
        bases[rel] = (base, patched)
    return bases


def _user_views(ctx: Context, edits: dict[str, bytes], bases: dict[str, tuple[bytes, bytes]]) -> dict[str, bytes]:
    """The files with the user's edits but without the codemods' changes."""
    views = {}
    for rel, current in edits.items():
        base, patched = bases[rel]
        if base == patched:
            views[rel] = current
            continue
        from gptoss_patch.engine.withdiff import DoesNotApply, git_apply

        ids_ = ", ".join(p for p in ctx.ledger.files[rel].patches)
        try:
            # no context lines: the codemods' own lines are found by content, whatever the user changed around them
            views[rel] = git_apply(unified_diff(rel, base, patched, context=0), {rel: current}, reverse=True, zero_context=True)[rel]
        except DoesNotApply:
            raise Conflict(
                f"your edit of {rel} touches lines gptoss-patch wrote ({ids_}); nothing was written",
                hint="keep your edit away from those lines, or copy the file aside, `gptoss-patch revert --force`, "
                "make the edit again on the original and capture it",
            ) from None
    return views


def _pristine(inst: Installation, rels: list[str], pristine: Path | None, download: bool) -> dict[str, bytes]:
    """The pristine bytes of `rels`: from `--from`, else from a cached wheel of the release that RECORD confirms."""
    if pristine is not None:
        return _from_wheel(inst, rels, pristine)
    candidates = wheels.cached(_pattern(inst))
    if not candidates and download:
        raise _NeedWheel
    if not candidates:
        raise UsageError(
            f"capture needs the files as {inst.label} installed them: pass --from with its wheel (--no-download: none was fetched)",
            hint=wheels.download_line(f"{inst.distribution}=={inst.version.public}", python=str(inst.python)) + ", then --from DIR/WHEEL",
        )
    refused: UsageError | None = None
    for wheel in candidates:  # several platforms' wheels of one release may be cached: the one RECORD confirms
        try:
            return _from_wheel(inst, rels, wheel)
        except UsageError as exc:
            refused = exc
    assert refused is not None
    raise UsageError(f"no cached wheel of {inst.label} in {wheels.cache_dir()} matches its RECORD ({refused})",
                     hint="pass --from with the wheel it was installed from (a local build has none on an index)")


def _from_wheel(inst: Installation, rels: list[str], pristine: Path) -> dict[str, bytes]:
    """The wheel's bytes of `rels`, each checked against the installed RECORD."""
    rows = record_rows(inst)
    out = {}
    try:
        with zipfile.ZipFile(pristine) as zf:
            for rel in rels:
                try:
                    data = zf.read(rel)
                except KeyError:
                    raise UsageError(f"{pristine} has no {rel}: it is not the wheel of {inst.label}") from None
                if sha256(data) != rows[rel][0]:
                    raise UsageError(f"{pristine} is not the wheel of {inst.label}: its {rel} differs from RECORD")
                out[rel] = data
    except (OSError, zipfile.BadZipFile) as exc:
        raise UsageError(f"cannot read {pristine} as a wheel: {cause(exc)}", detail=detail_of(exc)) from None
    return out


def _check_directory(directory: Path) -> None:
    """Refuse, before anything is read or downloaded, a --dir that cannot be (or become) a writable directory."""
    if directory.exists() and not directory.is_dir():
        raise UsageError(f"patch directory {directory} is not a directory; pass --dir with a directory (it is created if missing)")
    existing = next(p for p in (directory, *directory.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise UsageError(f"patch directory {directory} cannot be created: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise WriteFailed(f"cannot write {directory}: permission denied in {existing}; nothing was changed",
                          hint="pass --dir with a directory you can write to")


def _write_patch(directory: Path, target: Path, text: str) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)  # `--dir ./vllm-patches` on a first capture: created
    except OSError as exc:
        raise write_failed(directory, exc) from None
    atomic_write(target, text.encode("utf-8"), 0o644)


def _adopt(
    ctx: Context, name: str, blob: bytes, files: tuple[str, ...], bases: dict[str, tuple[bytes, bytes]], edits: dict[str, bytes],
    created: set[str],
) -> None:
    """Record the capture as applied: the ledger gets the user patch (RECORD the rows of new files); no vllm file changes."""
    plans = []
    extra: dict[str, list[bytes]] = {}
    digest = sha256(blob)
    for rel in files:
        current = edits[rel]
        entry = ctx.ledger.files.get(rel)
        mode = (ctx.inst.site_packages / rel).stat().st_mode & 0o7777
        if rel in created:
            new_entry = FileEntry(EMPTY, sha256(current), (name,), mode, (digest,), ((name, digest),), created=True)
            plans.append(FilePlan(rel, current, current, new_entry))
            extra[rel] = [blob]
            continue
        if entry is None:
            original = bases[rel][0]
            new = FileEntry(sha256(original), sha256(current), (name,), mode, (digest,), ((name, digest),))
            extra[rel] = [original, blob]
        else:
            new = FileEntry(entry.original, sha256(current), (*entry.patches, name), entry.mode,
                            (*entry.diffs, digest), (*entry.user, (name, digest)))
            extra[rel] = [blob]
        plans.append(FilePlan(rel, current, current, new))
    commit(ctx, "capture", plans, extra)
