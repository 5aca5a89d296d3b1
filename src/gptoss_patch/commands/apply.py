"""`gptoss-patch apply`: all-or-nothing, atomic, idempotent."""

from pathlib import Path
from typing import Annotated

from gptoss_patch import clikit, engine, render
from gptoss_patch.errors import ExitCode, UsageError
from gptoss_patch.options import (
    JsonOption,
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

DryRunOption = Annotated[bool, clikit.Option("--dry-run", help="Do nothing; print what would be done. Here: the diff; nothing is written.")]
CheckOption = Annotated[
    bool,
    clikit.Option("--check", help="Write nothing; say which patches and files would change and exit 1 if any would (for CI). "
                  "-v adds the diff."),
]
WithDiffOption = Annotated[
    list[Path] | None,
    clikit.Option("--with-diff", metavar="FILE", help="Apply this unified diff (paths a/vllm/...) first (repeatable)."),
]
AllowUnknownOption = Annotated[
    bool,
    clikit.Option(
        "--allow-unknown-version",
        help="Write to a vLLM not proven to be a checked release (newer, pre-release, or a build whose target files differ).",
    ),
]


@handles_errors
def apply(
    python: PythonOption = None, venv: VenvOption = None, vllm: VllmOption = None,
    only: OnlyOption = None, skip: SkipOption = None, with_: WithOption = None, dry_run: DryRunOption = False,
    with_diff: WithDiffOption = None, allow_unknown_version: AllowUnknownOption = False,
    check: CheckOption = False, patch_dir: PatchDirOption = None, json: JsonOption = False, verbose: VerboseOption = False,
) -> None:
    """Apply every patch the installed vLLM needs. Nothing is written unless every patch succeeds.

    --check writes nothing, names the patches and files that would change and exits 1 if any would, like ruff's and
    black's --check (-v or `gptoss-patch diff` shows the diff); --dry-run shows the diff instead, and the two do not combine.
    -v adds every patch's state and reason (as `status` shows them); -vv also the diff of what was written.
    """
    if check and dry_run:
        raise UsageError("--check and --dry-run do not combine: --check names what would change and exits 1 (for CI), "
                         "--dry-run shows the diff; pass one of them")
    dry_run = dry_run or check
    user = user_patches(patch_dir)
    chosen = selection(only, skip, with_, user=user)
    report = engine.apply(
        installation(python, venv, vllm), chosen, dry_run=dry_run, diffs=with_diff or (),
        allow_unknown_version=allow_unknown_version, user=user, with_diffs=int(verbose) >= 2,
    )
    render.detected(report)
    if ((dry_run and not check) or int(verbose) >= (1 if check else 2)) and not json:  # --check: a summary, ruff-like
        clikit.echo("".join(dict.fromkeys(r.diff for r in report.results if r.diff)), nl=False)
    render.narrate(report.results, verb="Patched", dry_run=dry_run)
    if verbose and not json:
        render.status_table(report, wide=True)
    if json:
        diffs = {"diffs": {r.id: r.diff for r in report.results if r.diff}} if dry_run else {}
        render.report_json(report, dry_run=dry_run, **diffs)
    if dry_run and not any(r.changed for r in report.results):
        render.info("Nothing to apply: " + render.tally(report.results, verb="patched"))
    else:
        render.info(("Would apply: " if dry_run else "Done: ") + render.tally(report.results, verb="to patch" if dry_run else "patched"))
    if check and any(r.changed for r in report.results):
        raise clikit.Exit(int(ExitCode.ACTION_NEEDED))


def register(app: clikit.App) -> None:
    app.command()(apply)
