"""`apply` (and `diff`, its dry run): plan every file's new bytes in memory, then commit them in one transaction.

Nothing is written unless every selected patch can be applied: a drifted or hand-edited patch, a
`--with-diff` that does not apply, or a build that is no checked release refuses the whole run.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path

from gptoss_patch.engine.context import Context, decode, encode, open_context, target_of
from gptoss_patch.engine.diff import creation_diff, unified_diff
from gptoss_patch.engine.ledger import EMPTY, FileEntry, Store
from gptoss_patch.engine.record import read_hashes
from gptoss_patch.engine.releases import Identity, identify
from gptoss_patch.engine.status import clashes, judge, unchosen
from gptoss_patch.engine.transaction import FilePlan, commit, recover
from gptoss_patch.engine.userdiffs import judge_user
from gptoss_patch.errors import Conflict, PatchFailed, TargetError
from gptoss_patch.fsutil import sha256
from gptoss_patch.registry import all_specs, by_id, selected
from gptoss_patch.spec import PatchResult, PatchSpec, Report, Selection, State
from gptoss_patch.target import Installation
from gptoss_patch.userpatches import UserPatch


def apply(
    inst: Installation,
    selection: Selection = Selection(),
    *,
    dry_run: bool = False,
    diffs: Iterable[Path] = (),
    allow_unknown_version: bool = False,
    user: Sequence[UserPatch] = (),
    with_diffs: bool = False,
) -> Report:
    """User patches first (in their order), then `--with-diff` files, then the codemods on top; one commit.

    A dry run's results carry the diff of each file; `with_diffs` fills them when writing too (apply -vv)."""
    with Store(inst).locked():
        notices = recover(inst, locked=True)
        plain = open_context(inst)
        chosen = [p for p in user if selection.wants(p.name)]
        user_results = [judge_user(p, plain) for p in chosen]
        _refuse_failures(user_results)
        pending = [p for p, r in zip(chosen, user_results) if r.state is State.PENDING]
        ctx, diff_blobs = _context_with_diffs(plain, list(diffs), pending)
        results = [judge(spec, ctx) for spec in selected(selection)]
        _refuse_damaged(plain, results)
        _refuse_clashes(plain, results, pending)
        _refuse_failures(results, inst)
        plans, results = _plan_apply(ctx, [*user_results, *results], diff_blobs, pending, dry_run, with_diffs)
        # the opt-in patches nobody named, as status and revert report them: every command counts the same patches
        results = [*results, *(unchosen(judge(s, plain, rewrite=False)) for s in all_specs() if selection.left_out(s))]
        identity = identify(inst)
        if plans and not dry_run:
            _guard_unknown_version(identity, allow_unknown_version)
            commit(ctx, "apply", plans, diff_blobs)
    return Report(inst, tuple(results), notices, identity)


def _context_with_diffs(
    plain: Context, diffs: list[Path], pending: list[UserPatch]
) -> tuple[Context, dict[str, list[bytes]]]:
    """The files as the codemods will see them: the pending user patches, then the --with-diff files."""
    if not diffs and not pending:
        return plain, {}
    from gptoss_patch.engine import userdiffs, withdiff  # imports gitpython: only for diffs

    overlay = userdiffs.overlay(plain, pending, {})
    blobs: dict[str, list[bytes]] = {}
    for patch in pending:
        for rel in patch.files:
            blobs.setdefault(rel, []).append(patch.blob)
    if diffs:
        overlay, extra = withdiff.apply_all(plain.inst, diffs, start=overlay)
        for rel, texts in extra.items():
            blobs.setdefault(rel, []).extend(texts)
    return open_context(plain.inst, overlay), blobs


def _refuse_damaged(plain: Context, results: list[PatchResult]) -> None:
    """A target file that is neither what the wheel installed (RECORD) nor what gptoss-patch wrote, and on which a
    patch drifts (one selected, skipped or opt-in alike): the file is damaged (truncated, a bad copy, a hand edit
    in the patched code), not the patch. Leaving its patches out would leave the file damaged, or half-patched
    with the patches of other files; the fix is a reinstall, as `audit` says. Nothing is written."""
    inst = plain.inst
    version = inst.version
    targets: dict[str, list[PatchSpec]] = {}
    for spec in all_specs():
        if (rel := target_of(spec, version)) is not None:
            targets.setdefault(rel, []).append(spec)
    rows = read_hashes(inst.record, set(targets))
    for rel, specs in targets.items():
        why = _damage(plain, rel, rows.get(rel))
        if why is None:
            continue
        shown = {r.id: r for r in results if r.file == rel}
        drifted = [r for spec in specs if (r := shown.get(spec.id) or judge(spec, plain)).state is State.DRIFTED]
        if drifted:
            ids = ", ".join(r.id for r in drifted)
            raise PatchFailed(
                f"{rel} {why}: {ids} drift{'s' if len(drifted) == 1 else ''} on it ({drifted[0].reason}); "
                "--skip would leave it damaged; nothing was written",
                hint=f"reinstall vllm to get the file back: {inst.reinstall_command}; then apply again "
                f"(a change of yours in it: capture it first, gptoss-patch capture NAME --dir DIR --files {rel})",
            )


def _damage(plain: Context, rel: str, expected: str | None) -> str | None:
    """Why the file on disk is not the one vLLM installed, or None: it is (RECORD's hash, or what gptoss-patch wrote)."""
    if expected is None:  # not in RECORD (a file a user patch created, a RECORD without hashes): nothing to compare
        return None
    data = plain.on_disk(rel)
    if data is None:
        return "is missing (RECORD lists it)"
    digest = sha256(data)
    entry = plain.ledger.files.get(rel)
    if digest == expected or (entry is not None and digest in (entry.patched, entry.original)):
        return None
    return f"is not the file vllm {plain.inst.version} installed (sha256 {digest[:12]}, RECORD {expected[:12]}: truncated or edited?)"


def _refuse_clashes(plain: Context, results: list[PatchResult], pending: list[UserPatch]) -> None:
    """A built-in that drifts only on top of a user patch: the two change the same lines (status.clashes)."""
    for clash in clashes(plain, results, pending):
        raise Conflict(
            f"user patch {', '.join(clash.users)} and built-in patch {clash.builtin} change the same code in "
            f"{clash.file} ({clash.reason}); nothing was written",
            hint=f"fix the user patch, or leave one out with --skip {clash.users[0]} or --skip {clash.builtin}",
        )


def _refuse_failures(results: list[PatchResult], inst: Installation | None = None) -> None:
    failed = [r for r in results if r.state in (State.DRIFTED, State.MODIFIED, State.CONFLICT)]
    if failed:
        first = failed[0]
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        exc = PatchFailed if first.state is State.DRIFTED else Conflict
        if first.origin:  # a user patch: its file, what is in the way, and how to mend the file
            path = first.origin.removeprefix("user: ")
            raise exc(f"user patch {first.id} ({path}): {first.reason}{more}; nothing was written", hint=_user_fix(first, path))
        same_file = [r.id for r in failed if r.file == first.file and r.state is first.state]
        raise exc(f"{first.id} is {first.state.value}: {first.reason}{more}; nothing was written", hint=_builtin_fix(first, same_file, inst))


def _builtin_fix(result: PatchResult, same_file: list[str], inst: Installation | None) -> str:
    if result.state is State.MODIFIED and inst is not None:  # --skip would only move the refusal to its file's next patch
        only = "".join(f" --only {patch_id}" for patch_id in same_file)
        return (f"`gptoss-patch revert --force{only} --python {shlex.quote(str(inst.python))}` puts back the bytes "
                f"gptoss-patch started from, discarding the later changes, then apply again; to keep those changes, "
                f"capture them first (gptoss-patch capture NAME --dir DIR --files {result.file})")
    return f"run `gptoss-patch status` for details, or leave it out with --skip {result.id}"


def _user_fix(result: PatchResult, path: str) -> str:
    if result.state is State.MODIFIED:
        return (f"`gptoss-patch revert --force --only {result.id}` discards the later edits and takes the patch out, "
                f"then apply puts it back; or leave it out with --skip {result.id}")
    return (f"the files differ from those it was made against: make the change again by hand and capture it anew "
            f"(`gptoss-patch capture NAME --dir DIR`) in place of {path}, or leave it out with --skip {result.id}")


def _guard_unknown_version(identity: Identity, allowed: bool) -> None:
    if identity.unverified and not allowed:
        raise TargetError(
            f"{identity.unverified}; nothing was written",
            hint="review `gptoss-patch diff` (the verdicts come from the code's shape), then re-run with --allow-unknown-version",
        )


def _plan_apply(
    ctx: Context, results: list[PatchResult], diff_blobs: dict[str, list[bytes]], pending: list[UserPatch], dry_run: bool,
    with_diffs: bool = False,
) -> tuple[list[FilePlan], list[PatchResult]]:
    by_file: dict[str, list[PatchSpec]] = {}
    specs = by_id()
    for r in results:
        if r.state is State.PENDING and r.file and r.id in specs:
            by_file.setdefault(r.file, []).append(specs[r.id])
    for rel in diff_blobs:
        by_file.setdefault(rel, [])
    named = {rel: [(p.name, p.blob) for p in pending if rel in p.files] for rel in by_file}
    plans = [_plan_file(ctx, rel, todo, diff_blobs.get(rel, []), named[rel]) for rel, todo in by_file.items()]
    diffs = {p.rel: _shown(p) if dry_run or with_diffs else "" for p in plans}
    done = {s.id for todo in by_file.values() for s in todo} | {p.name for p in pending}
    state, reason = (State.PENDING, "would be patched") if dry_run else (State.APPLIED, "patched")
    results = [
        replace(r, changed=True, diff="".join(diffs[f] for f in (r.files or (r.file,)) if f in diffs), state=state,
                reason=reason)
        if r.id in done else r
        for r in results
    ]
    return plans, results


def _shown(plan: FilePlan) -> str:
    if plan.before is None:  # created by a user patch
        return creation_diff(plan.rel, plan.after or b"")
    return unified_diff(plan.rel, plan.before, plan.after or b"")


def _plan_file(
    ctx: Context, rel: str, todo: list[PatchSpec], diff_blobs: list[bytes], named: list[tuple[str, bytes]]
) -> FilePlan:
    _refuse_outside_link(ctx.inst, rel)
    before = ctx.on_disk(rel)
    base = ctx.read(rel)
    assert base is not None
    if before is None:  # a user patch creates it (judge_user checked that it does not exist yet)
        assert not todo and named
        user = tuple((name, sha256(blob)) for name, blob in named)
        made = FileEntry(EMPTY, sha256(base), tuple(n for n, _ in named), 0o644, tuple(sha256(b) for b in diff_blobs), user, True)
        return FilePlan(rel, None, base, made)
    text = decode(base)
    if text is None:
        raise PatchFailed(f"{rel} is not valid UTF-8; nothing was written")
    entry = ctx.ledger.files.get(rel)
    same = entry is not None and sha256(before) == entry.patched  # what gptoss-patch wrote: keep its record
    kept = entry.patches if entry and same else ()
    specs = by_id()
    if named and any(p in specs for p in kept):
        # user patches went in under codemods already applied (userdiffs.rebase): those run again, in order
        again = {p for p in kept if p in specs} | {s.id for s in todo}
        todo = [s for s in all_specs() if s.id in again]
        kept = tuple(p for p in kept if p not in specs)
    after = encode(ctx.rewrite(todo, text), base)
    original = entry.original if entry and same else sha256(before)
    mode = (ctx.inst.site_packages / rel).stat().st_mode & 0o7777
    diffs = (entry.diffs if entry and same else ()) + tuple(sha256(b) for b in diff_blobs)
    user = (entry.user if entry and same else ()) + tuple((name, sha256(blob)) for name, blob in named)
    ids = (*kept, *(name for name, _ in named), *(s.id for s in todo))
    created = bool(entry and same and entry.created)  # another user patch changes a file one created
    return FilePlan(rel, before, after, FileEntry(original, sha256(after), ids, mode, diffs, user, created))


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


# For `hook install`, which refuses what apply refuses, with the same advice (hook/installer.py).
refuse_damaged = _refuse_damaged
builtin_fix = _builtin_fix
