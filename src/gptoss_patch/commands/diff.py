"""`gptoss-patch diff`: the unified diff `apply` would write (git apply -p1 from site-packages)."""

from typing import Annotated

from gptoss_patch import clikit, engine, render
from gptoss_patch.commands.apply import WithDiffOption
from gptoss_patch.errors import ExitCode
from gptoss_patch.options import (
    OnlyOption,
    PatchDirOption,
    PythonOption,
    SkipOption,
    VenvOption,
    VerboseOption,
    VllmOption,
    WithOption,
    handles_errors,
    installation,
    selection,
    user_patches,
)

ExitCodeOption = Annotated[bool, clikit.Option("--exit-code", help="Exit 1 when there is a diff (apply would change something).")]


@handles_errors
def diff(
    python: PythonOption = None, venv: VenvOption = None, vllm: VllmOption = None,
    only: OnlyOption = None, skip: SkipOption = None, with_: WithOption = None,
    with_diff: WithDiffOption = None, verbose: VerboseOption = False,
    exit_code: ExitCodeOption = False, patch_dir: PatchDirOption = None,
) -> None:
    """Print the diff `apply` would write; empty when nothing is pending.

    With --exit-code, exit 1 when the diff is not empty (like `git diff --exit-code` and ruff's --diff).
    """
    user = user_patches(patch_dir)
    report = engine.apply(
        installation(python, venv, vllm), selection(only, skip, with_, user=user), dry_run=True, diffs=with_diff or (),
        user=user,
    )
    render.detected(report)
    text = "".join(dict.fromkeys(r.diff for r in report.results if r.diff))
    clikit.echo(text, nl=False)
    if exit_code and text:
        raise clikit.Exit(int(ExitCode.ACTION_NEEDED))


def register(app: clikit.App) -> None:
    app.command()(diff)
