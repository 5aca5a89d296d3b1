"""`gptoss-patch verify`: patched files compile in the target interpreter and carry their shapes;
with --behaviour, the patched code paths are exercised in the target interpreter."""

from pathlib import Path
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
    VocabOption,
    WithOption,
    handles_errors,
    installation,
    selection,
    user_patches,
)
from gptoss_patch.spec import Report, State

BehaviourOption = Annotated[
    bool,
    clikit.Option(
        "--behaviour",
        help="Also run each patch's behaviour probe in the target interpreter (imports vLLM there, CPU is enough; "
        "needs torch and openai_harmony in that environment). --verbose shows the rendered prompts.",
    ),
]
PROBED_STATES = (State.APPLIED, State.PENDING, State.FIXED_UPSTREAM, State.MODIFIED)


@handles_errors
def verify(
    python: PythonOption = None, venv: VenvOption = None, vllm: VllmOption = None,
    only: OnlyOption = None, skip: SkipOption = None, with_: WithOption = None, behaviour: BehaviourOption = False,
    patch_dir: PatchDirOption = None, vocab: VocabOption = None, json: JsonOption = False, verbose: VerboseOption = False,
) -> None:
    """Byte-compile every patched file with the target interpreter and confirm each applied patch's shape."""
    user = user_patches(patch_dir)
    report = engine.verify(installation(python, venv, vllm), selection(only, skip, with_, user=user), user)
    render.detected(report)
    failed = any(r.error or r.state.needs_action for r in report.results)
    probes = _behaviour(report, bool(verbose), vocab) if behaviour else []
    failed |= any(p.passed is not True for p in probes)
    if json:
        render.report_json(report, ok=not failed, **({"behaviour": [p.to_json() for p in probes]} if behaviour else {}))
    else:
        render.status_table(report)
        if behaviour:
            render.probe_table(probes, verbose=bool(verbose))
    for r in report.results:
        if r.error:
            render.error(f"{r.id}: {r.error}")
    raise clikit.Exit(int(ExitCode.ACTION_NEEDED if failed else ExitCode.OK))


def _behaviour(report: Report, verbose: bool, vocabulary: Path | None) -> list:
    from gptoss_patch.verify import behaviour

    ids = [r.id for r in report.results if r.state in PROBED_STATES and not r.origin]
    if ids:
        render.info(f"Running behaviour probes in {report.installation.python} (imports vLLM there; this takes a while)...")
    probed = behaviour.probed_ids()  # patches without a probe have nothing to show: left out of the table
    with render.spinner("behaviour probes (importing vLLM in the target)"):
        results = behaviour.run(report.installation.python, ids, verbose=verbose, on_start=lambda pid: render.info(f"  probing {pid}"),
                                 vocabulary=vocabulary)
    return [p for p in results if p.passed is not None or p.id in probed]


def register(app: clikit.App) -> None:
    app.command()(verify)
