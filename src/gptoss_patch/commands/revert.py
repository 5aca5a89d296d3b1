"""`gptoss-patch revert`: restore the original bytes, offline, from the ledger."""

from typing import Annotated

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

ForceOption = Annotated[bool, clikit.Option("--force", help="Restore originals even over files changed since apply.")]


@handles_errors
def revert(
    python: PythonOption = None, venv: VenvOption = None, vllm: VllmOption = None,
    only: OnlyOption = None, skip: SkipOption = None, force: ForceOption = False,
    patch_dir: PatchDirOption = None, json: JsonOption = False, verbose: VerboseOption = False,
) -> None:
    """Put back the files gptoss-patch changed; refuses if they changed since, unless --force.

    Your own patches are reverted too (by name with --only NAME); the ledger knows them, so no --patch-dir is needed.
    """
    user = user_patches(patch_dir)
    inst = installation(python, venv, vllm)
    report = engine.revert(inst, selection(only, skip, user=(*user, *engine.recorded_user_patches(inst))), force=force, user=user)
    render.detected(report)
    render.narrate(report.results, verb="Reverted")
    if json:
        render.report_json(report)
    render.info("Done: " + render.tally(report.results))


def register(app: clikit.App) -> None:
    app.command()(revert)
