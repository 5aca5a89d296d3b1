"""`status`: the state of each patch, from the ledger's hashes first and the code's shape second."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from packaging.version import Version

from gptoss_patch.engine.context import Context, decode, open_context, target_of
from gptoss_patch.engine.releases import identify
from gptoss_patch.engine.transaction import recover
from gptoss_patch.engine.userdiffs import judge_user
from gptoss_patch.errors import PatchFailed
from gptoss_patch.fsutil import sha256
from gptoss_patch.registry import by_id, selected
from gptoss_patch.spec import PatchResult, PatchSpec, Report, Selection, State
from gptoss_patch.target import Installation
from gptoss_patch.userpatches import UserPatch


def status(inst: Installation, selection: Selection = Selection(), user: Sequence[UserPatch] = ()) -> Report:
    """User patches first (the order apply applies them in), then the built-ins."""
    notices = recover(inst)
    ctx = open_context(inst)
    builtins = [judge(spec, ctx) for spec in selected(selection)]
    chosen = [p for p in user if selection.wants(p.name)]
    mine = [_clash(p, judge_user(p, ctx), ctx, builtins) for p in chosen]
    return Report(inst, (*mine, *builtins), notices, identify(inst))


def _clash(patch: UserPatch, result: PatchResult, ctx: Context, builtins: list[PatchResult]) -> PatchResult:
    """A pending user patch on which a built-in codemod would drift: they change the same code (apply refuses)."""
    if result.state is not State.PENDING:
        return result
    shared = [r for r in builtins if r.file in patch.files and r.state in (State.PENDING, State.APPLIED)]
    if not shared:
        return result
    from gptoss_patch.engine.userdiffs import overlay

    on_top = open_context(ctx.inst, overlay(ctx, [patch], {}))
    for r in shared:
        after = judge(by_id()[r.id], on_top)
        if after.state is State.DRIFTED:
            return replace(result, state=State.CONFLICT, reason=f"changes the code built-in patch {r.id} rewrites in {r.file} ({after.reason})")
    return result


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
