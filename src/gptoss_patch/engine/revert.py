"""`revert`: put back the original bytes of the selected patches' files, replaying the patches that stay."""

from __future__ import annotations

from dataclasses import replace

from gptoss_patch.engine.context import Context, decode, encode, open_context, target_of
from gptoss_patch.engine.ledger import FileEntry, Store
from gptoss_patch.engine.releases import identify
from gptoss_patch.engine.status import judge
from gptoss_patch.engine.transaction import FilePlan, commit, recover
from gptoss_patch.errors import Conflict
from gptoss_patch.fsutil import sha256
from gptoss_patch.registry import by_id, selected
from gptoss_patch.spec import PatchResult, Report, Selection, State
from gptoss_patch.target import Installation


def revert(inst: Installation, selection: Selection = Selection(), *, force: bool = False) -> Report:
    with Store(inst).locked():
        notices = recover(inst, locked=True)
        ctx = open_context(inst)
        wanted = {s.id for s in selected(selection, opt_in=True)}
        plans = [p for rel, entry in ctx.ledger.files.items() if (p := _plan_revert(ctx, rel, entry, wanted, force))]
        results = _revert_results(ctx, selection, {p.rel for p in plans})
        if plans:
            commit(ctx, "revert", plans)
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
    specs = by_id()
    unknown = [p for p in keep if p not in specs]
    if unknown:
        raise Conflict(f"the ledger lists patch {unknown[0]!r}, unknown to this gptoss-patch; revert all patches instead")
    base = original
    if entry.diffs:
        from gptoss_patch.engine import withdiff  # imports gitpython: only for files a --with-diff changed

        base = withdiff.replay(rel, original, [ctx.store.blob(d) for d in entry.diffs])
    after = encode(ctx.rewrite([specs[p] for p in keep], decode(base) or ""), base)
    return FilePlan(rel, current, after, replace(entry, patched=sha256(after), patches=tuple(keep)))


def _revert_results(ctx: Context, selection: Selection, reverted_files: set[str]) -> list[PatchResult]:
    results = []
    for spec in selected(selection, opt_in=True):
        rel = target_of(spec, ctx.inst.version)
        entry = ctx.ledger.files.get(rel or "")
        if rel in reverted_files and entry and spec.id in entry.patches:
            results.append(PatchResult(spec.id, State.PENDING, "reverted to the original bytes", rel, changed=True))
        else:
            judged = judge(spec, ctx)
            results.append(replace(judged, reason=f"nothing to revert; {judged.reason}"))
    return results
