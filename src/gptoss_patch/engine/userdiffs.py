"""User patches in the engine: their state on an installation, and the files they give apply to build on.

A user patch (userpatches.py) is a unified diff for a range of vLLM versions. It is applied like
`--with-diff`: in memory first, before the codemods, and committed with them in one transaction; its
name goes into the ledger's `patches` for each file it changed and its text into the ledger's objects,
so `status` proves it from hashes, `revert` removes it by replaying the rest, and the hook expects it.

States: applied (the ledger proves it, or its changes are already in the files), pending (it applies
to the files as they are), out-of-range (the version is outside its header's range), conflict (it no
longer applies here: the reason names the first failing hunk; or its file changed since it was
applied), modified (a file it wrote was edited since).

A patch may create files (`--- /dev/null`): pending only while the file does not exist (missing folders
inside the package are created with it); the ledger marks the entry `created`, so revert removes the
file, and the folders it emptied (transaction.py).
"""

from __future__ import annotations

from gptoss_patch.engine.context import Context
from gptoss_patch.engine.record import read_hashes
from gptoss_patch.engine.withdiff import DoesNotApply, git_apply
from gptoss_patch.errors import Conflict
from gptoss_patch.fsutil import sha256
from gptoss_patch.registry import by_id
from gptoss_patch.spec import PatchResult, State
from gptoss_patch.userpatches import UserPatch


def judge_user(patch: UserPatch, ctx: Context) -> PatchResult:
    """The state of one user patch: ledger hashes first, then `git apply --check` (and its reverse)."""
    version = ctx.inst.version
    files = patch.files
    origin = f"user: {patch.path}"

    def result(state: State, reason: str) -> PatchResult:
        return PatchResult(patch.name, state, reason, files[0], files=files, origin=origin)

    if not patch.fits(version):
        return result(State.OUT_OF_RANGE, f"vllm {version} is outside {patch.versions}")
    recorded = _recorded(patch, ctx)
    if recorded is not None:
        return result(*recorded)
    current: dict[str, bytes] = {}
    for rel in files:
        data = ctx.read(rel)
        if rel in patch.created:
            if (why := _cannot_create(patch, ctx, rel, data)) is not None:
                return result(State.CONFLICT, why)
            continue
        if data is None:
            return result(State.CONFLICT, f"{rel} does not exist in vllm {version}")
        current[rel] = rebase(ctx, rel) or data
    try:
        git_apply(patch.text, current, new=patch.created)
    except DoesNotApply as exc:
        try:
            git_apply(patch.text, current, reverse=True)
        except DoesNotApply:
            return result(State.CONFLICT, f"does not apply to vllm {version}: {exc}")
        return result(State.APPLIED, "its changes are in the files (not written by gptoss-patch here: revert cannot remove them)")
    return result(State.PENDING, f"applies to vllm {version}")


def _cannot_create(patch: UserPatch, ctx: Context, rel: str, data: bytes | None) -> str | None:
    """Why the patch cannot create `rel` here (None: it can). An existing file is never taken over:
    the ledger (checked before) proves the files gptoss-patch created."""
    version = ctx.inst.version
    if data is not None:
        try:
            same = git_apply(patch.text, {}, include=rel, new=(rel,))[rel] == data
        except DoesNotApply:
            same = False
        how = "with the content it would create, but gptoss-patch did not create it" if same else "with other content"
        return f"it creates {rel}, which exists already in vllm {version} ({how}); remove the file or take it out of the patch"
    blocked = _file_in_the_way(ctx, rel)
    if blocked:
        return f"it creates {rel}, but {blocked} is a file in vllm {version}, not a folder"
    if rel in read_hashes(ctx.inst.record, {rel}):
        return f"it creates {rel}, which vllm's RECORD lists but is missing; reinstall vllm ({ctx.inst.reinstall_command})"
    return None


def _file_in_the_way(ctx: Context, rel: str) -> str | None:
    """The first folder on `rel`'s path that exists as something else (missing folders are created)."""
    parts = rel.split("/")[:-1]
    for depth in range(1, len(parts) + 1):
        folder = "/".join(parts[:depth])
        path = ctx.inst.site_packages / folder
        if path.exists() and not path.is_dir():
            return folder
    return None


def _recorded(patch: UserPatch, ctx: Context) -> tuple[State, str] | None:
    """What the ledger proves about the patch, or None when it records none of its files."""
    entries = {rel: ctx.ledger.files.get(rel) for rel in patch.files}
    ours = {rel: e for rel, e in entries.items() if e is not None and e.user_blob(patch.name)}
    if not ours:
        return None
    for rel, entry in ours.items():
        data = ctx.read(rel)
        digest = sha256(data) if data is not None else None
        if digest == entry.original:
            return None  # back to the bytes before gptoss-patch wrote it: judged by content, like a built-in
        if digest is None and entry.created:
            return State.MODIFIED, f"{rel} was removed after gptoss-patch created it; revert it (revert --only {patch.name}) and apply again"
        if digest != entry.patched:
            return State.MODIFIED, f"{rel} changed after gptoss-patch wrote it (sha256 {str(digest)[:12]}, wrote {entry.patched[:12]})"
        if entry.user_blob(patch.name) != sha256(patch.blob):
            return State.CONFLICT, (
                f"{patch.path.name} changed since it was applied; revert it (gptoss-patch revert --only {patch.name}) and apply again"
            )
    if len(ours) != len(patch.files):
        missing = next(rel for rel in patch.files if rel not in ours)
        return State.CONFLICT, f"the ledger records it for some of its files but not {missing}; revert it and apply again"
    return State.APPLIED, "applied by gptoss-patch; file hashes match the ledger"


def rebase(ctx: Context, rel: str) -> bytes | None:
    """The bytes a user patch goes onto in a file built-in codemods already changed: the file before the
    codemods (its original, plus the diffs the ledger records), since user patches come first. None when
    the ledger has no codemod for the file, or the file is not what gptoss-patch wrote."""
    entry = ctx.ledger.files.get(rel)
    if entry is None or not any(p in by_id() for p in entry.patches):
        return None
    data = ctx.on_disk(rel)
    if data is None or sha256(data) != entry.patched:
        return None
    base = ctx.store.blob(entry.original)
    if entry.diffs:
        from gptoss_patch.engine.withdiff import replay

        base = replay(rel, base, [ctx.store.blob(d) for d in entry.diffs])
    return base


def overlay(ctx: Context, patches: list[UserPatch], start: dict[str, bytes]) -> dict[str, bytes]:
    """The files after applying `patches` in order on top of `start` (else the bytes on disk)."""
    files = dict(start)
    for patch in patches:
        current = {rel: files[rel] if rel in files else rebase(ctx, rel) or ctx.on_disk(rel) or b""
                   for rel in patch.files if rel not in patch.created}
        try:
            files.update(git_apply(patch.text, current, new=patch.created))
        except DoesNotApply as exc:  # it applies alone (judge_user), but not after the user patches before it
            raise Conflict(
                f"user patch {patch.name} does not apply on top of the user patches before it: {exc}; nothing was written",
                hint="user patches apply in the order of their directories, then by file name",
            ) from None
    return files
