"""`gptoss-patch doctor [MODEL] [options] [-- vllm serve args]`: every pre-flight check, nothing started."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gptoss_patch import clikit
from gptoss_patch.commands._launch import DoctorLaunchGroup, show_checks, show_tuned
from gptoss_patch.errors import ExitCode
from gptoss_patch.options import JsonOption, VerboseOption, handles_errors

if TYPE_CHECKING:
    from gptoss_patch.launcher.results import Check, LaunchPlan


def register(app: clikit.App) -> None:
    app.command("doctor")(doctor)


@handles_errors
def doctor(launch: DoctorLaunchGroup, json: JsonOption = False, verbose: VerboseOption = False) -> None:
    """Run every pre-flight check `serve` runs, against the installed vLLM, and print the table.

    MODEL (optional) and the arguments after -- are checked as `serve` would check them.
    Exit 0 when nothing fails (warnings allowed), 1 when `serve` would refuse to start; 4, as `serve`, when the
    GPUs cannot run the parallel layout asked for.
    """
    from gptoss_patch import render
    from gptoss_patch.launcher.prepare import prepare
    from gptoss_patch.launcher.results import Status, worst

    prepared = prepare(launch, notify=render.info, starts=False)  # executable, model and port are rows here
    plan, checks = prepared.plan, prepared.checks
    if json:
        render.json_out(_payload(plan, checks))
    else:
        show_checks(checks, everything=True)
        show_tuned(plan)
        render.notes(plan.notes)
    if worst(checks) is Status.FAIL:
        raise clikit.Exit(int(ExitCode.ACTION_NEEDED))


def _payload(plan: LaunchPlan, checks: tuple[Check, ...]) -> dict:
    from gptoss_patch.launcher.results import Status, worst

    return {
        "vllm": plan.installation.to_json(),
        "profile": {"name": plan.profile, "source": plan.profile_source},
        "tuned": plan.tuned.to_json() if plan.tuned is not None else None,
        "ok": worst(checks) is not Status.FAIL,
        "checks": [c.to_json() for c in checks],
        "settings": [s.to_json() for s in plan.settings],
        "notes": list(plan.notes),
        "command": plan.argv,
        "env": plan.env_additions,
    }
