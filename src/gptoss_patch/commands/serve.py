"""`gptoss-patch serve MODEL [options] [-- vllm serve args]`: pre-flight, then run vLLM and watch it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

from gptoss_patch import clikit
from gptoss_patch.commands._launch import LaunchGroup, gate, show_tuned
from gptoss_patch.options import VerboseOption, handles_errors

if TYPE_CHECKING:  # imported when `serve` runs: every other command starts without them
    from gptoss_patch.launcher import runner
    from gptoss_patch.launcher.results import LaunchPlan, RunOutcome, SmokeReport

PrintScriptOption = Annotated[bool, clikit.Option("--print-script", help="Write the equivalent bash script to stdout instead.")]
DryRunOption = Annotated[bool, clikit.Option("--dry-run", help="Do nothing; print what would be done. Here: the resolved environment and command.")]
SmokeOption = Annotated[bool, clikit.Option("--smoke", help="Once ready, run the smoke canary; stop vLLM if it fails.")]
LogFileOption = Annotated[
    Path | None,
    clikit.Option("--log-file", metavar="PATH", help="Also write vLLM's log here (default: a new file in logs/ of `gptoss-patch cache dir`).",
                  show_default=False),
]


def register(app: clikit.App) -> None:
    app.command("serve", no_args_is_help=True)(serve)


@handles_errors
def serve(
    launch: LaunchGroup,
    print_script: PrintScriptOption = False,
    dry_run: DryRunOption = False,
    run_smoke: SmokeOption = False,
    log_file: LogFileOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Run `vllm serve` for gpt-oss with a GPU profile, after pre-flight checks; watch its log and /health.

    MODEL is a model id or a local path, as for `vllm serve`. Arguments after -- go to `vllm serve`
    unchanged (and win over the profile's). A profile `gptoss-patch tune` measured for this GPU, vLLM and
    model shape is used and named in one line (--no-tuned: the built-in profile alone). Exit code: vLLM's
    own; 1 when a check stopped it; 130 (Ctrl-C), 143 (SIGTERM) or 129 (SIGHUP) when a signal stopped it.
    """
    from gptoss_patch import render
    from gptoss_patch.launcher import plan as planning, runner, script
    from gptoss_patch.launcher.prepare import prepare

    prepared = prepare(launch, notify=render.info, port=not print_script)
    gate(prepared)
    plan = prepared.plan
    show_tuned(plan)  # `tune`'s profile for this stack: used, or why not (stale, corrupt), in one line
    if not print_script:  # the script carries them as comments
        render.notes(plan.notes)  # what the profile left out and why (sm90: the MoE kernel, --fast-moe's trade)
    if print_script or dry_run:
        render.passthrough(script.render_script(plan) if print_script else script.render_dry_run(plan))
        return
    log_file = log_file or runner.default_log_file()
    _finish(runner.run(plan, log_file=log_file, health_url=planning.health_url(plan), hooks=_hooks(plan, run_smoke)))


def _hooks(plan: LaunchPlan, run_smoke: bool) -> runner.Hooks:
    from gptoss_patch import render
    from gptoss_patch.launcher import plan as planning, runner

    def canary() -> SmokeReport:
        from gptoss_patch.launcher import smoke

        report = smoke.run_smoke(planning.server_url(plan), model=planning.served_model(plan), api_key=planning.api_key(plan))
        render.checks_table(report.checks, title="smoke", to_stdout=False)
        return report

    return runner.Hooks(echo=render.passthrough, notify=render.info, smoke=canary if run_smoke else None)


def _finish(outcome: RunOutcome) -> None:
    from gptoss_patch import render
    from gptoss_patch.errors import CheckFailed, GptossPatchError

    render.info(f"vLLM exited with code {outcome.exit_code}; log: {outcome.log_file}")
    if outcome.stopped_for:
        raise CheckFailed(outcome.stopped_for, hint=f"log: {outcome.log_file}")
    if outcome.last_lines:  # the one error path's rendering; the command still ends with vLLM's own code, below
        render.failure(GptossPatchError(f"vLLM crashed (exit code {outcome.exit_code}); its last lines:", last_lines=outcome.last_lines))
    if outcome.known_issue:
        issue = outcome.known_issue
        render.warn(f"this matches known issue {issue.id}: {issue.title}")
        render.info(f"fix: {issue.fix}")
    if outcome.signal is not None:  # the user stopped it: 130/143/129 like every command, whatever vLLM returned
        import signal

        render.error(f"interrupted by {signal.Signals(outcome.signal).name}; vLLM was stopped")
        raise clikit.Exit(128 + outcome.signal)
    if outcome.exit_code:
        raise clikit.Exit(outcome.exit_code)
