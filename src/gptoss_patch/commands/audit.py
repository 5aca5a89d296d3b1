"""`gptoss-patch audit`: every vLLM file against its RECORD and the ledger; exit 1 on anything else."""

from gptoss_patch import clikit, render
from gptoss_patch.errors import ExitCode
from gptoss_patch.options import (
    JsonOption,
    PythonOption,
    VenvOption,
    VerboseOption,
    VllmOption,
    handles_errors,
    installation,
)


@handles_errors
def audit(
    python: PythonOption = None, venv: VenvOption = None, vllm: VllmOption = None,
    json: JsonOption = False, verbose: VerboseOption = False,
) -> None:
    """Check every file of the vLLM distribution: it must match RECORD or hold exactly what a patch
    (built-in or yours) wrote. Exit 1 listing each other file (changed, missing, added), with a hint, and each
    file patched by a patch no installed patch set provides any more (orphaned: a plugin removed after apply)."""
    from gptoss_patch.engine.audit import audit as run

    result = run(installation(python, venv, vllm))
    for notice in result.notices:
        render.warn(notice)
    if json:
        render.json_out(result.to_json())
    else:
        rows = [(f.path, f.kind, f.detail, f.hint) for f in result.findings]
        if rows:
            render.table(None, ("file", "finding", "detail", "hint"), rows)
    patched = f", {len(result.patched)} patched by gptoss-patch" if result.patched else ""
    render.info(f"{result.installation.label}: {result.checked} files checked{patched}, {len(result.findings)} finding(s)")
    raise clikit.Exit(int(ExitCode.OK if result.clean else ExitCode.ACTION_NEEDED))


def register(app: clikit.App) -> None:
    app.command()(audit)
