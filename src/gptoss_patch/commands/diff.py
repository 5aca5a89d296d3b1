"""`gptoss-patch diff`: the unified diff `apply` would write (git apply -p1 from site-packages)."""

import typer

from gptoss_patch import engine, render
from gptoss_patch.commands.apply import WithDiffOption
from gptoss_patch.options import (
    OnlyOption, PythonOption, SkipOption, VenvOption, VerboseOption, VllmOption, handles_errors, installation, selection,
)


@handles_errors
def diff(
    python: PythonOption = None, venv: VenvOption = None, vllm: VllmOption = None,
    only: OnlyOption = None, skip: SkipOption = None, with_diff: WithDiffOption = None, verbose: VerboseOption = False,
) -> None:
    """Print the diff `apply` would write; empty when nothing is pending."""
    report = engine.apply(installation(python, venv, vllm), selection(only, skip), dry_run=True, diffs=with_diff or ())
    render.detected(report)
    typer.echo("".join(dict.fromkeys(r.diff for r in report.results if r.diff)), nl=False)


def register(app: typer.Typer) -> None:
    app.command()(diff)
