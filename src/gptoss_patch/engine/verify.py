"""`verify`: byte-compile every patched file with the target interpreter and re-check each applied shape.

(`verify --behaviour`, which runs the patched code, is gptoss_patch.verify: it needs the target's vLLM.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from gptoss_patch.engine.context import Context, decode, open_context
from gptoss_patch.engine.status import status
from gptoss_patch.errors import InterpreterFailed
from gptoss_patch.registry import by_id
from gptoss_patch.spec import PatchResult, Report, Selection, State
from gptoss_patch.target import Installation, answer_line, call
from gptoss_patch.userpatches import UserPatch


def verify(inst: Installation, selection: Selection = Selection(), user: Sequence[UserPatch] = ()) -> Report:
    """Byte-compile every patched file with the target interpreter and re-check each applied shape."""
    report = status(inst, selection, user)
    ctx = open_context(inst)
    files = sorted({f for r in report.results if r.state is State.APPLIED for f in (r.files or (r.file,)) if f})
    compile_errors = _compile(inst, files)
    checked = [_verify_one(r, ctx, compile_errors) for r in report.results]
    return replace(report, results=tuple(checked))


def _verify_one(result: PatchResult, ctx: Context, compile_errors: dict[str, str]) -> PatchResult:
    if result.state is not State.APPLIED or not result.file:
        return result
    broken = next((f for f in (result.files or (result.file,)) if f in compile_errors), None)
    if broken:
        return replace(result, error=f"does not compile: {compile_errors[broken]}")
    if result.origin:  # a user patch: its state was proven from hashes or by git apply; no shape to check
        return replace(result, reason=f"{result.reason}; compiles with the target interpreter")
    spec = by_id()[result.id]
    text = decode(ctx.read(result.file) or b"")
    if text is None or not spec.is_applied(text, ctx.package):
        return replace(result, error="the patched shape is not in the file")
    return replace(result, reason=f"{result.reason}; compiles with the target interpreter")


_COMPILE = """
import sys
errors = {}
for rel in sys.argv[2:]:
    path = sys.argv[1] + "/" + rel
    try:
        compile(open(path, "rb").read(), path, "exec")
    except SyntaxError as exc:
        errors[rel] = f"line {exc.lineno}: {exc.msg}"
""" + answer_line("errors")


def _compile(inst: Installation, files: list[str]) -> dict[str, str]:
    """Compile in the target interpreter (its Python version decides), writing no bytecode."""
    if not files:
        return {}
    try:
        errors: dict[str, str] = call(inst.python, _COMPILE, str(inst.site_packages), *files, what="the compile check").answer
    except InterpreterFailed as exc:  # the compiler itself failed: every file is unproven
        return {f: exc.reason for f in files}
    return errors
