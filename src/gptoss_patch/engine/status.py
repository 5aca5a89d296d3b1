"""`status`: the state of each patch, from the ledger's hashes first and the code's shape second."""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from packaging.version import Version

from gptoss_patch.engine.context import Context, decode, open_context, target_of
from gptoss_patch.engine.releases import identify
from gptoss_patch.engine.transaction import recover
from gptoss_patch.engine.userdiffs import judge_user
from gptoss_patch.errors import PatchFailed
from gptoss_patch.fsutil import sha256
from gptoss_patch.registry import all_specs, by_id, selected
from gptoss_patch.spec import RUST_FRONTEND, PatchResult, PatchSpec, Report, Selection, State, rust_frontend_on
from gptoss_patch.target import Installation
from gptoss_patch.userpatches import UserPatch


def status(inst: Installation, selection: Selection = Selection(), user: Sequence[UserPatch] = ()) -> Report:
    """User patches first (the order apply applies them in), then the built-ins."""
    notices = recover(inst)
    ctx = open_context(inst)
    chosen = set(selected(selection))
    builtins = [
        judge(spec, ctx) if spec in chosen else unchosen(judge(spec, ctx, rewrite=False))
        for spec in all_specs()
        if spec in chosen or selection.left_out(spec)
    ]
    mine = [_clash(p, judge_user(p, ctx), ctx, builtins) for p in user if selection.wants(p.name)]
    if rust_frontend(inst, os.environ):
        builtins = [_bypassed(r) for r in builtins]
    return Report(inst, (*mine, *builtins, *orphaned(ctx, selection)), notices, identify(inst))


def orphaned(ctx: Context, selection: Selection = Selection()) -> list[PatchResult]:
    """The patches the ledger names that no installed patch set provides (a plugin removed after apply): the
    files still hold what they wrote, and only `revert` (from the ledger's original bytes) takes them out."""
    results = []
    for patch_id, rels in ctx.ledger.orphans(by_id()).items():
        if not selection.wants(patch_id):
            continue
        changed = [rel for rel in rels if (data := ctx.read(rel)) is None or sha256(data) != ctx.ledger.files[rel].patched]
        since = f"; {', '.join(changed)} changed since it was written (--force discards that)" if changed else ""
        reason = (f"applied by gptoss-patch, but no installed patch set provides it any more (a plugin removed?){since}; "
                  f"`{orphan_fix(ctx.inst, patch_id, force=bool(changed))}` restores the original bytes from the ledger")
        results.append(PatchResult(patch_id, State.ORPHANED, reason, rels[0], files=rels))
    return results


def orphan_fix(inst: Installation, patch_id: str, *, force: bool = False) -> str:
    """The command that takes an orphaned patch out of `inst` (revert needs no codemod: the ledger has the bytes)."""
    return f"gptoss-patch revert{' --force' if force else ''} --only {patch_id} --python {shlex.quote(str(inst.python))}"


def _clash(patch: UserPatch, result: PatchResult, ctx: Context, builtins: list[PatchResult]) -> PatchResult:
    """A pending user patch on which a built-in codemod would drift: they change the same code (apply refuses)."""
    if result.state is not State.PENDING:
        return result
    shared = [by_id()[r.id] for r in builtins if r.file in patch.files and r.state in (State.PENDING, State.APPLIED)]
    if not shared:
        return result
    from gptoss_patch.engine.userdiffs import overlay

    on_top = open_context(ctx.inst, overlay(ctx, [patch], {}))
    for clash in clashes(ctx, [judge(spec, on_top) for spec in shared], [patch]):
        reason = f"changes the code built-in patch {clash.builtin} rewrites in {clash.file} ({clash.reason})"
        return replace(result, state=State.CONFLICT, reason=reason)
    return result


@dataclass(frozen=True)
class Clash:
    users: tuple[str, ...]  # the pending user patches that change the built-in's file
    builtin: str
    file: str | None
    reason: str  # why the built-in drifts on top of them


def clashes(plain: Context, on_top: Sequence[PatchResult], pending: Sequence[UserPatch]) -> list[Clash]:
    """Built-ins that drift on top of the pending user patches but not on the files as they are: the two
    change the same code. One rule for `status` (which marks the user patch `conflict`) and `apply` (which
    refuses and writes nothing)."""
    found = []
    for result in on_top:
        users = tuple(p.name for p in pending if result.file in p.files)
        if result.state is State.DRIFTED and users and judge(by_id()[result.id], plain).state is not State.DRIFTED:
            found.append(Clash(users, result.id, result.file, result.reason))
    return found


RUST_FRONTEND_FROM = Version("0.22.0")  # the first release whose envs.py defines it


def rust_frontend(inst: Installation, environ: Mapping[str, str]) -> bool:
    """VLLM_USE_RUST_FRONTEND is on here and the installed vLLM reads it (G27)."""
    return rust_frontend_on(environ) and inst.version >= RUST_FRONTEND_FROM


def _bypassed(result: PatchResult) -> PatchResult:
    """A patch of the Python chat path does nothing while `vllm serve` hands HTTP to vllm-rs: say so (G27)."""
    spec = by_id().get(result.id)
    if spec is None or not spec.python_frontend or result.state not in (State.APPLIED, State.PENDING):
        return result
    note = f"bypassed while {RUST_FRONTEND}=1: `vllm serve` answers chat through vllm-rs, not this Python code (G27)"
    return replace(result, reason=f"{result.reason}; {note}", warnings=(*result.warnings, note))


def unchosen(result: PatchResult) -> PatchResult:
    """An opt-in patch nobody named: where `apply` would act (pending, or drifted), it is reported as opt-in."""
    if result.state not in (State.PENDING, State.DRIFTED):
        return result
    spec = by_id()[result.id]
    return replace(result, state=State.OPT_IN, reason=f"opt-in, not applied ({spec.opt_in}); apply with --with {spec.id}")


def judge(spec: PatchSpec, ctx: Context, *, rewrite: bool = True) -> PatchResult:
    """The state of one patch; hashes first (no parsing when the ledger proves it), then shapes.

    `rewrite=False` skips the trial rewrite that tells pending from drifted (it imports libcst): for
    opt-in patches nobody named, which are reported as opt-in either way."""
    version = ctx.inst.version
    rel = target_of(spec, version)
    if rel is None or (spec.fixed_in and version >= Version(spec.fixed_in)):
        return _outside_bands(spec, ctx)
    data = ctx.read(rel)
    if data is None:
        return PatchResult(spec.id, State.DRIFTED, f"target file {rel} does not exist in vllm {version}", rel)
    result = _recorded_state(spec, ctx, rel, data) or _judge_shape(spec, ctx, rel, data, rewrite)
    if result.state in (State.APPLIED, State.PENDING) and (seen := spec.watch(ctx.package)):
        result = replace(result, reason=f"{result.reason}; {seen}", warnings=(*result.warnings, seen))
    return result


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


def _judge_shape(spec: PatchSpec, ctx: Context, rel: str, data: bytes, rewrite: bool = True) -> PatchResult:
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
    if not rewrite:
        return PatchResult(spec.id, State.PENDING, f"unpatched shape found in vllm {ctx.inst.version}", rel)
    try:
        ctx.dry_run(spec, text)
    except PatchFailed as exc:
        return PatchResult(spec.id, State.DRIFTED, str(exc), rel)
    return PatchResult(spec.id, State.PENDING, f"unpatched shape found in vllm {ctx.inst.version}", rel)
