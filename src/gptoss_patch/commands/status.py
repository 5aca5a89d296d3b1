"""`gptoss-patch status`: one line per patch; exit 1 when anything is pending, drifted or modified."""

from typing import Annotated

from gptoss_patch import clikit, engine, render
from gptoss_patch.errors import ExitCode
from gptoss_patch.options import (
    JsonOption,
    OnlyOption,
    PatchDirOption,
    PythonOption,
    SkipOption,
    VenvOption,
    VerboseOption,
    VllmOption,
    WideOption,
    WithOption,
    handles_errors,
    installation,
    selection,
    user_patches,
)
from gptoss_patch.spec import State

StrictOption = Annotated[bool, clikit.Option("--strict", help="Exit 1 also when one of your patches is out-of-range (stale).")]


@handles_errors
def status(
    python: PythonOption = None, venv: VenvOption = None, vllm: VllmOption = None,
    only: OnlyOption = None, skip: SkipOption = None, with_: WithOption = None, patch_dir: PatchDirOption = None,
    strict: StrictOption = False, json: JsonOption = False, verbose: VerboseOption = False, wide: WideOption = False,
) -> None:
    """Show each patch's state: applied, pending, not-needed, fixed-upstream, out-of-range, drifted, modified, opt-in, conflict, orphaned.

    Your own patches (--patch-dir) come first, in the order apply applies them. An opt-in patch (`list` marks
    them) that nobody named with --only or --with shows as opt-in, not pending. With --strict, a user patch that
    is out-of-range (stale after an upgrade) also makes the exit code 1. A patch the ledger names that no
    installed patch set provides any more (a plugin removed after apply) is orphaned: `revert --only ID` takes it out.
    """
    user = user_patches(patch_dir)
    inst = installation(python, venv, vllm)
    chosen = selection(only, skip, with_, user=(*user, *engine.orphaned_patches(inst)))
    report = engine.status(inst, chosen, user)
    render.detected(report)
    clean = not any(r.state.needs_action or (strict and r.origin and r.state is State.OUT_OF_RANGE) for r in report.results)
    if json:
        render.report_json(report, clean=clean)
    else:
        render.status_table(report, wide=wide or bool(verbose))
    raise clikit.Exit(int(ExitCode.OK if clean else ExitCode.ACTION_NEEDED))


def register(app: clikit.App) -> None:
    app.command()(status)
