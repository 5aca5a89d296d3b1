"""status / apply / diff / verify / revert. The engine returns Reports; it never prints or exits.

Every write goes through one transaction (`_commit`): originals and new bytes are stored and the
journal and ledger are made durable before any target file is replaced, so an interruption at any
point is finished by the next command of any kind (`recover`).
"""

from __future__ import annotations

import difflib
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from packaging.version import Version

from gptoss_patch import faults
from gptoss_patch.errors import Conflict, PatchFailed, TargetError, WriteFailed
from gptoss_patch.fsutil import atomic_write, remove_stale_bytecode, sha256
from gptoss_patch.ledger import FileEntry, Ledger, Store, Write
from gptoss_patch.registry import selected
from gptoss_patch.releases import Identity, identify
from gptoss_patch.spec import PackageView, PatchResult, PatchSpec, Report, Selection, State
from gptoss_patch.target import Installation
from gptoss_patch.versions import is_unknown_newer

BOM = b"\xef\xbb\xbf"


@dataclass
class Context:
    """One command's view of an installation: the ledger, and file bytes (with --with-diff overlays)."""

    inst: Installation
    store: Store
    ledger: Ledger
    overlay: dict[str, bytes] = field(default_factory=dict)
    _cache: dict[str, bytes | None] = field(default_factory=dict)
    parsed: dict[str, Any] = field(default_factory=dict)  # source text -> (libcst Module, CRLF?)

    def parse(self, text: str) -> tuple[Any, bool]:
        """Each source is parsed once per command: the dry runs and the rewrite share the tree."""
        if text not in self.parsed:
            self.parsed[text] = _parse(text)
        return self.parsed[text]

    def dry_run(self, spec: PatchSpec, text: str) -> None:
        """Raise PatchFailed if `spec` cannot rewrite `text` (no code is generated)."""
        _rewrite(spec, self.parse(text)[0], self.package)

    def rewrite(self, specs: list[PatchSpec], text: str) -> str:
        """Apply `specs` in order to one tree and generate the code once."""
        module, crlf = self.parse(text)
        for spec in specs:
            module = _rewrite(spec, module, self.package)
        code = module.code
        return code.replace("\n", "\r\n") if crlf else code

    @property
    def package(self) -> PackageView:
        return PackageView(self.inst.package_root)

    def read(self, rel: str) -> bytes | None:
        if rel in self.overlay:
            return self.overlay[rel]
        if rel not in self._cache:
            try:
                self._cache[rel] = (self.inst.site_packages / rel).read_bytes()
            except OSError:
                self._cache[rel] = None
        return self._cache[rel]

    def on_disk(self, rel: str) -> bytes | None:
        saved = self.overlay.pop(rel, None)
        try:
            return self.read(rel)
        finally:
            if saved is not None:
                self.overlay[rel] = saved


def target_of(spec: PatchSpec, version: Version) -> str | None:
    band = spec.band_for(version) or (spec.bands[-1] if is_unknown_newer(version) else None)
    return f"vllm/{band.target}" if band else None


# -- status -------------------------------------------------------------------------------------


def status(inst: Installation, selection: Selection = Selection()) -> Report:
    notices = recover(inst)
    ctx = _context(inst)
    return Report(inst, tuple(judge(spec, ctx) for spec in selected(selection)), notices, identify(inst))


def _context(inst: Installation, overlay: dict[str, bytes] | None = None) -> Context:
    store = Store(inst)
    return Context(inst, store, store.load(), dict(overlay or {}))


def judge(spec: PatchSpec, ctx: Context) -> PatchResult:
    """The state of one patch; hashes first (no parsing when the ledger proves it), then shapes."""
    version = ctx.inst.version
    rel = target_of(spec, version)
    if rel is None or (spec.fixed_in and version >= Version(spec.fixed_in)):
        return _outside_bands(spec, ctx)
    data = ctx.read(rel)
    if data is None:
        return PatchResult(spec.id, State.DRIFTED, f"target file {rel} does not exist in vllm {version}", rel)
    recorded = _recorded_state(spec, ctx, rel, data)
    return recorded or _judge_shape(spec, ctx, rel, data)


def _outside_bands(spec: PatchSpec, ctx: Context) -> PatchResult:
    version = ctx.inst.version
    if spec.fixed_in and version >= Version(spec.fixed_in):
        reason = spec.fixed_upstream(ctx.package)
        if reason:
            return PatchResult(spec.id, State.FIXED_UPSTREAM, reason)
        return PatchResult(
            spec.id, State.DRIFTED, f"vllm {version} should carry the upstream fix (since {spec.fixed_in}) but it was not found"
        )
    return PatchResult(spec.id, State.OUT_OF_RANGE, f"vllm {version} is outside {spec.versions}")


def _recorded_state(spec: PatchSpec, ctx: Context, rel: str, data: bytes) -> PatchResult | None:
    entry = ctx.ledger.files.get(rel)
    if entry is None or rel in ctx.overlay:
        return None
    digest = sha256(data)
    if digest == entry.patched and spec.id in entry.patches:
        return PatchResult(spec.id, State.APPLIED, "applied by gptoss-patch; file hash matches the ledger", rel)
    if digest not in (entry.patched, entry.original):
        return PatchResult(
            spec.id, State.MODIFIED, f"changed after gptoss-patch wrote it (sha256 {digest[:12]}, wrote {entry.patched[:12]})", rel
        )
    return None


def _judge_shape(spec: PatchSpec, ctx: Context, rel: str, data: bytes) -> PatchResult:
    text = decode(data)
    if text is None:
        return PatchResult(spec.id, State.DRIFTED, f"{rel} is not valid UTF-8", rel)
    if reason := spec.fixed_upstream(ctx.package):
        return PatchResult(spec.id, State.FIXED_UPSTREAM, reason, rel)
    if spec.is_applied(text, ctx.package):
        recorded = rel in ctx.ledger.files
        why = "patched shape found" + ("" if recorded else " (not written by gptoss-patch here: revert cannot restore it)")
        return PatchResult(spec.id, State.APPLIED, why, rel)
    if reason := spec.not_needed(text, ctx.package):
        return PatchResult(spec.id, State.NOT_NEEDED, reason, rel)
    try:
        ctx.dry_run(spec, text)
    except PatchFailed as exc:
        return PatchResult(spec.id, State.DRIFTED, str(exc), rel)
    return PatchResult(spec.id, State.PENDING, f"unpatched shape found in vllm {ctx.inst.version}", rel)


def decode(data: bytes) -> str | None:
    try:
        return data.removeprefix(BOM).decode("utf-8")
    except UnicodeDecodeError:
        return None


def _parse(text: str) -> tuple[Any, bool]:
    """Parse with libcst; a file with CRLF line endings throughout is parsed as LF and converted
    back after code generation, so the code we insert (docstrings included) gets CRLF too."""
    import libcst

    crlf = "\r\n" in text and text.count("\r\n") == text.count("\n")
    try:
        return libcst.parse_module(text.replace("\r\n", "\n") if crlf else text), crlf
    except libcst.ParserSyntaxError as exc:
        raise PatchFailed(f"the target file does not parse (line {exc.raw_line}): {exc.message}") from None


def _rewrite(spec: PatchSpec, module: Any, package: PackageView) -> Any:
    """One codemod on a parsed module; drift becomes PatchFailed with a one-line reason."""
    from gptoss_patch.patches._base import Drift

    try:
        return spec.codemod()(package).rewrite(module)
    except Drift as exc:
        raise PatchFailed(f"{spec.id}: drifted: {exc}") from None


# -- apply / diff -------------------------------------------------------------------------------




@dataclass(frozen=True)
class FilePlan:
    rel: str
    before: bytes | None  # on disk now
    after: bytes
    entry: FileEntry | None  # the ledger entry afterwards (None: the file is back to its original)


def apply(
    inst: Installation,
    selection: Selection = Selection(),
    *,
    dry_run: bool = False,
    diffs: Iterable[Path] = (),
    allow_unknown_version: bool = False,
) -> Report:
    with Store(inst).locked():
        notices = recover(inst, locked=True)
        ctx, diff_blobs = _context_with_diffs(inst, list(diffs))
        results = [judge(spec, ctx) for spec in selected(selection)]
        _refuse_failures(results)
        plans, results = _plan_apply(ctx, results, diff_blobs, dry_run)
        identity = identify(inst)
        if plans and not dry_run:
            _guard_unknown_version(identity, allow_unknown_version)
            _commit(ctx, "apply", plans, diff_blobs)
    return Report(inst, tuple(results), notices, identity)


def _context_with_diffs(inst: Installation, diffs: list[Path]) -> tuple[Context, dict[str, list[bytes]]]:
    if not diffs:
        return _context(inst), {}
    from gptoss_patch import withdiff

    overlay, blobs = withdiff.apply_all(inst, diffs)
    return _context(inst, overlay), blobs


def _refuse_failures(results: list[PatchResult]) -> None:
    failed = [r for r in results if r.state in (State.DRIFTED, State.MODIFIED)]
    if failed:
        first = failed[0]
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        exc = Conflict if first.state is State.MODIFIED else PatchFailed
        raise exc(
            f"{first.id} is {first.state.value}: {first.reason}{more}; nothing was written",
            hint=f"run `gptoss-patch status` for details, or leave it out with --skip {first.id}",
        )


def _guard_unknown_version(identity: Identity, allowed: bool) -> None:
    if identity.unverified and not allowed:
        raise TargetError(
            f"{identity.unverified}; nothing was written",
            hint="review `gptoss-patch diff` (the verdicts come from the code's shape), then re-run with --allow-unknown-version",
        )


def _plan_apply(
    ctx: Context, results: list[PatchResult], diff_blobs: dict[str, list[bytes]], dry_run: bool
) -> tuple[list[FilePlan], list[PatchResult]]:
    by_file: dict[str, list[PatchSpec]] = {}
    specs = {s.id: s for s in selected(Selection())}
    for r in results:
        if r.state is State.PENDING and r.file:
            by_file.setdefault(r.file, []).append(specs[r.id])
    for rel in diff_blobs:
        by_file.setdefault(rel, [])
    plans = [_plan_file(ctx, rel, todo, diff_blobs.get(rel, [])) for rel, todo in by_file.items()]
    diffs = {p.rel: unified_diff(p.rel, p.before or b"", p.after) if dry_run else "" for p in plans}
    done = {s.id for todo in by_file.values() for s in todo}
    after = {"state": State.PENDING, "reason": "would be patched"} if dry_run else {"state": State.APPLIED, "reason": "patched"}
    results = [replace(r, changed=True, diff=diffs[r.file], **after) if r.id in done else r for r in results]
    return plans, results


def _plan_file(ctx: Context, rel: str, todo: list[PatchSpec], diff_blobs: list[bytes]) -> FilePlan:
    _refuse_outside_link(ctx.inst, rel)
    before = ctx.on_disk(rel)
    base = ctx.read(rel)
    assert before is not None and base is not None
    text = decode(base)
    if text is None:
        raise PatchFailed(f"{rel} is not valid UTF-8; nothing was written")
    after = encode(ctx.rewrite(todo, text), base)
    entry = ctx.ledger.files.get(rel)
    kept = entry.patches if entry and sha256(before) == entry.patched else ()
    original = entry.original if entry and kept else sha256(before)
    mode = (ctx.inst.site_packages / rel).stat().st_mode & 0o7777
    diffs = (entry.diffs if entry and kept else ()) + tuple(sha256(b) for b in diff_blobs)
    new_entry = FileEntry(original, sha256(after), (*kept, *(s.id for s in todo)), mode, diffs)
    return FilePlan(rel, before, after, new_entry)


def _refuse_outside_link(inst: Installation, rel: str) -> None:
    """A target reached through a symlink is patched where the link points (the link stays a link),
    but only inside the vllm package: a link out of it (a shared store, another environment's file)
    would make us change files this installation does not own, and the ledger would refuse the path."""
    path = inst.site_packages / rel
    real = path.resolve()
    if not real.is_relative_to(inst.package_root.resolve()):
        raise TargetError(
            f"{rel} is a symbolic link to {real}, outside the vllm package; nothing was written",
            hint=f"gptoss-patch does not write through links that leave the package: replace the link with a copy "
            f"(cp --remove-destination {real} {path}) to patch this environment alone, or --skip that patch",
        )


def encode(text: str, like: bytes) -> bytes:
    return (BOM if like.startswith(BOM) else b"") + text.encode("utf-8")


def unified_diff(rel: str, before: bytes, after: bytes) -> str:
    """A diff `git apply -p1` accepts from the site-packages directory."""
    old = (decode(before) or "").splitlines(keepends=True)
    new = (decode(after) or "").splitlines(keepends=True)
    lines = []
    for line in difflib.unified_diff(old, new, fromfile=f"a/{rel}", tofile=f"b/{rel}"):
        lines.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(lines)


# -- the transaction ----------------------------------------------------------------------------


def _commit(ctx: Context, op: str, plans: list[FilePlan], diff_blobs: dict[str, list[bytes]] | None = None) -> None:
    """Store originals, journal and ledger durably, then replace the files one by one.

    The bytes on disk before (`p.before`) are stored too, so that a write the filesystem refuses
    (read-only, full) is undone through the same journal (`_undo`); garbage collection drops them.
    """
    store = ctx.store
    extra = [b for blobs in (diff_blobs or {}).values() for b in blobs]
    blobs = list(dict.fromkeys(b for b in (*(p.before for p in plans), *extra, *(p.after for p in plans)) if b is not None))
    ledger = _ledger_after(ctx.ledger, plans)
    writes = [Write(p.rel, sha256(p.before) if p.before is not None else None, sha256(p.after), _mode(ctx, p)) for p in plans]
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
        for plan, write in zip(plans, writes):
            _replace_file(ctx.inst, plan.rel, plan.after, write.mode)
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
    back = [Write(w.path, w.after, w.before, w.mode) for w in writes if w.before is not None]
    try:
        store.begin(f"roll-back of a failed {op}", back, ctx.ledger)
        store.save(ctx.ledger)
        for write in back:
            _roll_forward(ctx.inst, store, write)
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


def _replace_file(inst: Installation, rel: str, data: bytes, mode: int) -> None:
    path = inst.site_packages / rel
    faults.reached("before-file", path)
    atomic_write(path, data, mode)
    faults.reached("file-replaced", path)
    remove_stale_bytecode(path)
    faults.reached("after-file", path)


def recover(inst: Installation, *, locked: bool = False) -> tuple[str, ...]:
    """Finish an apply or revert that was interrupted; a no-op (one stat) when none was."""
    store = Store(inst)
    if not store.has_journal() and not (store.dir.exists() and not (store.dir / "ledger.json").exists()):
        return ()
    if not locked:
        with store.locked():
            return recover(inst, locked=True)
    journal = store.journal()
    if journal is None:
        if store.tidy():
            return ("removed the leftover ledger files of an interrupted gptoss-patch run; no vllm file needed to change",)
        return ()
    for write in journal.writes:
        _roll_forward(inst, store, write)
    store.save(journal.ledger)
    store.end(journal.ledger)
    store.remove_strays()
    return (f"completed an interrupted {journal.op} of {len(journal.writes)} file(s) (process {journal.pid})",)


def _roll_forward(inst: Installation, store: Store, write: Write) -> None:
    path = inst.site_packages / write.path  # journal rows were checked when read; roll-back rows are ours
    current = sha256(path.read_bytes()) if path.exists() else None
    if current == write.after:
        remove_stale_bytecode(path)  # a kill may have come between the rename and this
        return
    if current != write.before:
        raise Conflict(
            f"an interrupted run left {write.path} with unexpected content (sha256 {str(current)[:12]}); nothing was written",
            hint=f"reinstall vllm ({inst.reinstall_command}) and apply again",
        )
    _replace_file(inst, write.path, store.blob(write.after), write.mode)


# -- revert -------------------------------------------------------------------------------------


def revert(inst: Installation, selection: Selection = Selection(), *, force: bool = False) -> Report:
    with Store(inst).locked():
        notices = recover(inst, locked=True)
        ctx = _context(inst)
        wanted = {s.id for s in selected(selection)}
        plans = [p for rel, entry in ctx.ledger.files.items() if (p := _plan_revert(ctx, rel, entry, wanted, force))]
        results = _revert_results(ctx, selection, {p.rel for p in plans})
        if plans:
            _commit(ctx, "revert", plans)
    return Report(inst, tuple(results), notices, identify(inst))


def _plan_revert(ctx: Context, rel: str, entry: FileEntry, wanted: set[str], force: bool) -> FilePlan | None:
    dropping = [p for p in entry.patches if p in wanted]
    if not dropping:
        return None
    current = ctx.read(rel)
    digest = sha256(current) if current is not None else None
    if digest != entry.patched and not force:
        raise Conflict(
            f"{rel} changed after gptoss-patch wrote it (patches: {', '.join(entry.patches)}); nothing was reverted",
            hint="revert --force restores the original anyway, discarding those changes",
        )
    keep = [p for p in entry.patches if p not in wanted]
    original = ctx.store.blob(entry.original)
    if not keep:
        return FilePlan(rel, current, original, None)
    return _replay(ctx, rel, entry, current, original, keep)


def _replay(ctx: Context, rel: str, entry: FileEntry, current: bytes | None, original: bytes, keep: list[str]) -> FilePlan:
    """Rebuild a file from its original with only the patches that stay."""
    specs = {s.id: s for s in selected(Selection())}
    unknown = [p for p in keep if p not in specs]
    if unknown:
        raise Conflict(f"the ledger lists patch {unknown[0]!r}, unknown to this gptoss-patch; revert all patches instead")
    base = original
    if entry.diffs:
        from gptoss_patch import withdiff

        base = withdiff.replay(rel, original, [ctx.store.blob(d) for d in entry.diffs])
    after = encode(ctx.rewrite([specs[p] for p in keep], decode(base) or ""), base)
    return FilePlan(rel, current, after, replace(entry, patched=sha256(after), patches=tuple(keep)))


def _revert_results(ctx: Context, selection: Selection, reverted_files: set[str]) -> list[PatchResult]:
    results = []
    for spec in selected(selection):
        rel = target_of(spec, ctx.inst.version)
        entry = ctx.ledger.files.get(rel or "")
        if rel in reverted_files and entry and spec.id in entry.patches:
            results.append(PatchResult(spec.id, State.PENDING, "reverted to the original bytes", rel, changed=True))
        else:
            judged = judge(spec, ctx)
            results.append(replace(judged, reason=f"nothing to revert; {judged.reason}"))
    return results


# -- verify -------------------------------------------------------------------------------------


def verify(inst: Installation, selection: Selection = Selection()) -> Report:
    """Byte-compile every patched file with the target interpreter and re-check each applied shape."""
    report = status(inst, selection)
    ctx = _context(inst)
    files = sorted({r.file for r in report.results if r.state is State.APPLIED and r.file})
    compile_errors = _compile(inst, files)
    checked = [_verify_one(r, ctx, compile_errors) for r in report.results]
    return replace(report, results=tuple(checked))


def _verify_one(result: PatchResult, ctx: Context, compile_errors: dict[str, str]) -> PatchResult:
    if result.state is not State.APPLIED or not result.file:
        return result
    if result.file in compile_errors:
        return replace(result, error=f"does not compile: {compile_errors[result.file]}")
    spec = {s.id: s for s in selected(Selection())}[result.id]
    text = decode(ctx.read(result.file) or b"")
    if text is None or not spec.is_applied(text, ctx.package):
        return replace(result, error="the patched shape is not in the file")
    return replace(result, reason=f"{result.reason}; compiles with the target interpreter")


_COMPILE = """
import json, sys
errors = {}
for rel in sys.argv[2:]:
    path = sys.argv[1] + "/" + rel
    try:
        compile(open(path, "rb").read(), path, "exec")
    except SyntaxError as exc:
        errors[rel] = f"line {exc.lineno}: {exc.msg}"
print(json.dumps(errors))
"""


def _compile(inst: Installation, files: list[str]) -> dict[str, str]:
    """Compile in the target interpreter (its Python version decides), writing no bytecode."""
    if not files:
        return {}
    proc = subprocess.run(
        [inst.python, "-c", _COMPILE, str(inst.site_packages), *files], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        return {f: (proc.stderr.strip().splitlines() or ["compiler crashed"])[-1] for f in files}
    import json

    return json.loads(proc.stdout)
