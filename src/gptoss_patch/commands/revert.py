"""`gptoss-patch revert`: restore the original bytes, offline, from the ledger."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Annotated

from gptoss_patch import clikit, engine, render
from gptoss_patch.options import (
    JsonOption,
    OnlyOption,
    PatchDirOption,
    PythonOption,
    SkipOption,
    VenvOption,
    VerboseOption,
    VllmOption,
    handles_errors,
    installation,
    selection,
    user_patches,
)

if TYPE_CHECKING:
    from gptoss_patch.target import Installation

ForceOption = Annotated[
    bool, clikit.Option("--force", help="Go ahead where a safety check refuses. Here: restore originals even over files changed since apply.")
]


@handles_errors
def revert(
    python: PythonOption = None, venv: VenvOption = None, vllm: VllmOption = None,
    only: OnlyOption = None, skip: SkipOption = None, force: ForceOption = False,
    patch_dir: PatchDirOption = None, json: JsonOption = False, verbose: VerboseOption = False,
) -> None:
    """Put back the files gptoss-patch changed; refuses if they changed since, unless --force.

    Your own patches are reverted too (by name with --only NAME); the ledger knows them, so no --patch-dir is needed.
    So are orphaned patches (applied from a plugin since uninstalled): the ledger has their original bytes.
    -v adds every patch's state and reason afterwards.
    """
    user = user_patches(patch_dir)
    inst = installation(python, venv, vllm)
    known = (*user, *engine.recorded_user_patches(inst), *engine.orphaned_patches(inst))  # the ledger's names are revertable
    report = engine.revert(inst, selection(only, skip, user=known), force=force, user=user)
    render.detected(report)
    render.narrate(report.results, verb="Reverted")
    if verbose and not json:  # -v: every patch's state and reason afterwards
        render.status_table(report, wide=True)
    if json:
        render.report_json(report)
    done = any(r.changed for r in report.results)
    render.info(("Done: " if done else "Nothing to revert: ") + render.tally(report.results, verb="reverted"))
    hook_disagrees(inst)


def register(app: clikit.App) -> None:
    app.command()(revert)


def hook_disagrees(inst: Installation) -> None:
    """An installed hook that expects patches the revert removed: mode fail now refuses every vLLM start, mode
    apply re-applies them at the next one. Say so, with the commands that settle it either way."""
    from gptoss_patch.hook import installer

    hook = installer.status(inst)
    state, verdict = hook.state or {}, hook.verdict
    mode = state.get("mode")
    if not hook.installed or verdict is None or mode not in ("fail", "apply") or state.get("vllm") != verdict.version:
        return
    expected = set(state.get("patches", {}))
    missing = sorted(expected - verdict.present - verdict.edited)
    if not missing:
        return
    python = shlex.quote(str(inst.python))
    consequence = "now refuses every vLLM start" if mode == "fail" else "will re-apply them at the next vLLM start"
    render.warn(f"the gptoss-patch hook in {hook.layout.site} (mode {mode}) expects {', '.join(missing)}: it {consequence}")
    render.info("fix, one of:")
    render.info(f"  {installer.fix_command(hook, str(inst.python))}   (re-apply them)")
    narrower = _install_without(state, missing, python)
    if narrower:
        render.info(f"  {narrower}   (expect only the patches still applied)")
    render.info(f"  gptoss-patch hook uninstall --python {python}   (no guard)")


def _install_without(state: dict, missing: list[str], python: str) -> str | None:
    """`hook install` for the hook's recorded selection minus `missing`; None when nothing would be left."""
    chosen = state.get("selection") or {}
    only = [i for i in chosen.get("only", ()) if i not in missing]
    with_ = [i for i in chosen.get("with", ()) if i not in missing]  # an opt-in patch left out is simply not asked for
    if (chosen.get("only") and not only) or not set(state.get("patches", {})) - set(missing):
        return None
    skip = [*chosen.get("skip", ()), *(i for i in missing if not only and i not in chosen.get("with", ()))]
    args = [a for key, ids in (("only", only), ("skip", skip), ("with", with_)) for i in ids for a in (f"--{key}", i)]
    args += [a for d in state.get("patch_dirs", ()) for a in ("--patch-dir", d)]
    return f"gptoss-patch hook install --python {python}" + "".join(f" {shlex.quote(a)}" for a in args)
