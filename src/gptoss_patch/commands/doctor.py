"""`gptoss-patch doctor [MODEL] [options] [-- vllm serve args]`: every pre-flight check, nothing started."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from gptoss_patch import clikit
from gptoss_patch.commands._launch import (
    LOOPBACK,
    AllowUnauthenticatedOption,
    AllowUnpatchedOption,
    ConcurrencyOption,
    ExpectReasoningOption,
    ExtraArgs,
    FastMoeOption,
    GpuOption,
    HostOption,
    InstructionsOption,
    PortOption,
    deferred_options,
    resolve_plan,
    show_checks,
)
from gptoss_patch.errors import ExitCode
from gptoss_patch.options import (
    JsonOption,
    PythonOption,
    VenvOption,
    VerboseOption,
    VllmOption,
    VocabOption,
    handles_errors,
)

if TYPE_CHECKING:
    from gptoss_patch.launcher.results import Check, LaunchPlan


def register(app: clikit.App) -> None:
    app.command("doctor")(doctor)


@handles_errors
def doctor(
    model: Annotated[str | None, clikit.Argument(help="Model id or path to check (optional).", show_default=False)] = None,
    extra: ExtraArgs = None,
    gpu: GpuOption = None,
    concurrency: ConcurrencyOption = None,
    host: HostOption = LOOPBACK,
    port: PortOption = 8000,
    allow_unpatched: AllowUnpatchedOption = False,
    allow_unauthenticated: AllowUnauthenticatedOption = False,
    expect_reasoning: ExpectReasoningOption = False,
    instructions: InstructionsOption = None,
    fast_moe: FastMoeOption = False,
    json: JsonOption = False,
    python: PythonOption = None,
    venv: VenvOption = None,
    vllm: VllmOption = None,
    vocab: VocabOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Run every pre-flight check `serve` runs, against the installed vLLM, and print the table.

    MODEL (optional) and the arguments after -- are checked as `serve` would check them.
    Exit 0 when nothing fails (warnings allowed), 1 when `serve` would refuse to start.
    """
    options = deferred_options(
        model, gpu=gpu, concurrency=concurrency, host=host, port=port, extra_args=tuple(extra or ()),
        allow_unpatched=allow_unpatched, allow_unauthenticated=allow_unauthenticated, expect_reasoning=expect_reasoning, vocab=vocab,
        instructions=instructions, fast_moe=fast_moe,
    )  # fmt: skip
    plan = resolve_plan(python, venv, vllm, options)
    from gptoss_patch import render
    from gptoss_patch.launcher import preflight, reproducibility
    from gptoss_patch.launcher.results import Status, worst

    checks = (*preflight.run_checks(plan), *reproducibility.checks(plan))
    if json:
        render.json_out(_payload(plan, checks))
    else:
        show_checks(checks, everything=True)
        render.notes(plan.notes)
    if worst(checks) is Status.FAIL:
        raise clikit.Exit(int(ExitCode.ACTION_NEEDED))


def _payload(plan: LaunchPlan, checks: tuple[Check, ...]) -> dict:
    from gptoss_patch.launcher.results import Status, worst

    return {
        "vllm": plan.installation.to_json(),
        "profile": {"name": plan.profile, "source": plan.profile_source},
        "ok": worst(checks) is not Status.FAIL,
        "checks": [c.to_json() for c in checks],
        "settings": [s.to_json() for s in plan.settings],
        "notes": list(plan.notes),
        "command": plan.argv,
        "env": plan.env_additions,
    }
