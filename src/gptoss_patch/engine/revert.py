"""`revert`: put back the original bytes of the selected patches' files, replaying the patches that stay."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from gptoss_patch.engine.context import Context, decode, encode, open_context, target_of
from gptoss_patch.engine.ledger import FileEntry, Store
from gptoss_patch.engine.releases import identify
from gptoss_patch.engine.status import judge, unchosen
from gptoss_patch.engine.transaction import FilePlan, commit, recover
from gptoss_patch.engine.userdiffs import judge_user
from gptoss_patch.errors import Conflict, PatchFailed
from gptoss_patch.fsutil import sha256
from gptoss_patch.registry import by_id, selected
from gptoss_patch.spec import PatchResult, Report, Selection, State
from gptoss_patch.target import Installation
from gptoss_patch.userpatches import UserPatch


def revert(
    inst: Installation, selection: Selection = Selection(), *, force: bool = False, user: Sequence[UserPatch] = ()
) -> Report:
    """Built-ins and user patches alike; the ledger knows each user patch it applied (no patch directory needed)."""
    with Store(inst).locked():
        notices = recover(inst, locked=True)
        ctx = open_context(inst)
        recorded_user = {name for e in ctx.ledger.files.values() for name, _ in e.user}
        orphans = [o for o in ctx.ledger.orphans(by_id()) if selection.wants(o)]  # no codemod needed: the ledger has the bytes
        wanted = {s.id for s in selected(selection, opt_in=True)} | {n for n in recorded_user if selection.wants(n)} | set(orphans)
        plans = [p for rel, entry in ctx.ledger.files.items() if (p := _plan_revert(ctx, rel, entry, wanted, force))]
        results = (_user_results(ctx, selection, plans, user) + _revert_results(ctx, selection, {p.rel for p in plans})
                   + _orphan_results(ctx, orphans, plans))
        if plans:
            commit(ctx, "revert", plans)
    return Report(inst, tuple(results), notices, identify(inst))


def recorded_user_patches(inst: Installation) -> tuple[str, ...]:
    """The names of the user patches the ledger records (what `revert --only NAME` may name)."""
    files = Store(inst).load().files.values()
    return tuple(dict.fromkeys(name for entry in files for name, _ in entry.user))


def orphaned_patches(inst: Installation) -> tuple[str, ...]:
    """The patch ids the ledger records that no installed patch set provides (what `revert --only ID` may name too)."""
    return tuple(Store(inst).load().orphans(by_id()))


def _orphan_results(ctx: Context, orphans: list[str], plans: list[FilePlan]) -> list[PatchResult]:
    """One result per orphaned patch this revert took out (its files back to the ledger's original bytes)."""
    before = ctx.ledger.orphans(by_id())
    left = {p.rel: p.entry.patches if p.entry else () for p in plans}  # what each reverted file keeps
    results = []
    for patch_id in orphans:
        rels = before[patch_id]
        done = [rel for rel in rels if rel in left and patch_id not in left[rel]]
        if done:
            results.append(PatchResult(patch_id, State.NOT_NEEDED, "reverted to the original bytes (its patch set is no longer "
                                       "installed: nothing applies it again)", rels[0], changed=True, files=tuple(done)))
    return results


def _plan_revert(ctx: Context, rel: str, entry: FileEntry, wanted: set[str], force: bool) -> FilePlan | None:
    dropping = [p for p in entry.patches if p in wanted]
    if not dropping:
        return None
    current = ctx.read(rel)
    digest = sha256(current) if current is not None else None
    gone = entry.created and current is None  # a created file removed by hand: what revert would do anyway
    if digest != entry.patched and not force and not gone:
        raise Conflict(
            f"{rel} changed after gptoss-patch wrote it (patches: {', '.join(entry.patches)}); nothing was reverted",
            hint="revert --force restores the original anyway, discarding those changes",
        )
    keep = [p for p in entry.patches if p not in wanted]
    if entry.created:  # a user patch created it: reverting removes it (and its RECORD row)
        if keep:
            raise Conflict(f"{rel} was created by {entry.patches[0]}, which other patches change too ({', '.join(keep)}); "
                           "revert all of them")
        return FilePlan(rel, current, None, None)
    original = ctx.store.blob(entry.original)
    if not keep:
        return FilePlan(rel, current, original, None)
    return _replay(ctx, rel, entry, current, original, keep)


def _replay(ctx: Context, rel: str, entry: FileEntry, current: bytes | None, original: bytes, keep: list[str]) -> FilePlan:
    """Rebuild a file from its original with only the patches that stay."""
    specs = by_id()
    users = dict(entry.user)
    unknown = [p for p in keep if p not in specs and p not in users]
    if unknown:
        raise Conflict(f"the ledger lists patch {unknown[0]!r}, unknown to this gptoss-patch; revert all patches instead")
    dropped = {users[p] for p in entry.patches if p in users and p not in keep}
    diffs = tuple(d for d in entry.diffs if d not in dropped)
    base = original
    if diffs:
        from gptoss_patch.engine import withdiff  # imports gitpython: only for files a diff changed

        try:
            base = withdiff.replay(rel, original, [ctx.store.blob(d) for d in diffs])
        except PatchFailed as exc:
            raise Conflict(f"{rel}: the diffs that stay do not apply without the ones reverted ({exc}); revert all of them") from None
    after = encode(ctx.rewrite([specs[p] for p in keep if p in specs], decode(base) or ""), base)
    user = tuple(u for u in entry.user if u[0] in keep)
    return FilePlan(rel, current, after, replace(entry, patched=sha256(after), patches=tuple(keep), diffs=diffs, user=user))


def _user_results(ctx: Context, selection: Selection, plans: list[FilePlan], user: Sequence[UserPatch]) -> list[PatchResult]:
    """One result per user patch reverted (known from the ledger) or found in the patch directories."""
    before = ctx.ledger.files  # commit() has not run yet: this is the ledger the plans start from
    reverted: dict[str, list[str]] = {}
    for plan in plans:
        left = set(plan.entry.patches) if plan.entry else set()
        for name, _ in before[plan.rel].user:
            if name not in left:
                reverted.setdefault(name, []).append(plan.rel)
    results = [
        PatchResult(name, State.PENDING, "reverted to the bytes before it", rels[0], changed=True, files=tuple(rels), origin="user")
        for name, rels in reverted.items()
    ]
    for patch in user:
        if patch.name not in reverted and selection.wants(patch.name):
            judged = judge_user(patch, ctx)
            results.append(replace(judged, reason=f"nothing to revert; {judged.reason}"))
    return results


def _revert_results(ctx: Context, selection: Selection, reverted_files: set[str]) -> list[PatchResult]:
    results = []
    for spec in selected(selection, opt_in=True):
        rel = target_of(spec, ctx.inst.version)
        entry = ctx.ledger.files.get(rel or "")
        unnamed = selection.left_out(spec)  # an opt-in patch: once reverted, `status` shows it as opt-in, not pending
        if rel in reverted_files and entry and spec.id in entry.patches:
            state, why = (State.OPT_IN, f"; opt-in: apply it again with --with {spec.id}") if unnamed else (State.PENDING, "")
            results.append(PatchResult(spec.id, state, f"reverted to the original bytes{why}", rel, changed=True))
        else:
            judged = unchosen(judge(spec, ctx)) if unnamed else judge(spec, ctx)
            results.append(replace(judged, reason=f"nothing to revert; {judged.reason}"))
    return results
