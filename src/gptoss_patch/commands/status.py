"""`gptoss-patch status`: one line per patch; exit 1 when anything is pending, drifted or modified."""

from gptoss_patch import clikit, engine, render
from gptoss_patch.errors import ExitCode
from gptoss_patch.options import (
    JsonOption,
    OnlyOption,
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
)


@handles_errors
def status(
    python: PythonOption = None, venv: VenvOption = None, vllm: VllmOption = None,
    only: OnlyOption = None, skip: SkipOption = None, with_: WithOption = None,
    json: JsonOption = False, verbose: VerboseOption = False, wide: WideOption = False,
) -> None:
    """Show each patch's state: applied, pending, not-needed, fixed-upstream, out-of-range, drifted, modified, opt-in.

    An opt-in patch (`list` marks them) that nobody named with --only or --with shows as opt-in, not pending.
    """
    chosen = selection(only, skip, with_)
    report = engine.status(installation(python, venv, vllm), chosen)
    render.detected(report)
    clean = not any(r.state.needs_action for r in report.results)
    if json:
        render.report_json(report, clean=clean)
    else:
        render.status_table(report, wide=wide or bool(verbose))
    raise clikit.Exit(int(ExitCode.OK if clean else ExitCode.ACTION_NEEDED))


def register(app: clikit.App) -> None:
    app.command()(status)
