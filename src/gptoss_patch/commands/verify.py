"""`gptoss-patch verify`: patched files compile in the target interpreter and carry their shapes."""

import typer

from gptoss_patch import engine, render
from gptoss_patch.errors import ExitCode
from gptoss_patch.options import (
    JsonOption, OnlyOption, PythonOption, SkipOption, VenvOption, VerboseOption, VllmOption,
    handles_errors, installation, selection,
)


@handles_errors
def verify(
    python: PythonOption = None, venv: VenvOption = None, vllm: VllmOption = None,
    only: OnlyOption = None, skip: SkipOption = None, json: JsonOption = False, verbose: VerboseOption = False,
) -> None:
    """Byte-compile every patched file with the target interpreter and confirm each applied patch's shape."""
    report = engine.verify(installation(python, venv, vllm), selection(only, skip))
    render.detected(report)
    failed = [r for r in report.results if r.error or r.state.needs_action]
    if json:
        render.report_json(report, ok=not failed)
    else:
        render.status_table(report)
    for r in report.results:
        if r.error:
            render.error(f"{r.id}: {r.error}")
    raise typer.Exit(int(ExitCode.ACTION_NEEDED if failed else ExitCode.OK))


def register(app: typer.Typer) -> None:
    app.command()(verify)
