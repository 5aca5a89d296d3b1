"""`gptoss-patch bench MODEL [--concurrency ...] [--repeat N] [--compare vanilla|eager] [-- vllm serve args]`."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

from gptoss_patch import clikit
from gptoss_patch.commands._launch import (
    LOOPBACK,
    AllowUnpatchedOption,
    ExtraArgs,
    GpuOption,
    deferred_options,
    resolve_plan,
)
from gptoss_patch.options import JsonOption, PythonOption, VenvOption, VerboseOption, VllmOption, handles_errors

if TYPE_CHECKING:
    from gptoss_patch.bench import BenchReport, ServerSpec, Stat
    from gptoss_patch.bench.bound import Bound
    from gptoss_patch.launcher.results import LaunchPlan
    from gptoss_patch.model import Recipe

ConcurrencyOption = Annotated[
    str,
    clikit.Option(
        "--concurrency", metavar="N,N,...", help="Concurrencies to measure (vllm bench serve --max-concurrency)."
    ),
]
RepeatOption = Annotated[
    int, clikit.Option("--repeat", metavar="N", help="Rounds; the table shows medians over them and their range.")
]
CompareOption = Annotated[
    str | None,
    clikit.Option(
        "--compare",
        metavar="vanilla|eager",
        help="Also run plain `vllm serve` (vanilla) and/or the profile with --enforce-eager, side by side.",
        show_default=False,
    ),
]
CaptureOption = Annotated[
    str | None,
    clikit.Option(
        "--capture",
        metavar="N,N,...",
        help="The profile server's --concurrency (CUDA-graph sizes). Default: --concurrency.",
        show_default=False,
    ),
]
VariantOption = Annotated[
    list[str] | None,
    clikit.Option(
        "--variant",
        metavar="NAME=ARGS",
        help="Also run the profile with ARGS added (e.g. marlin='--moe-backend marlin'), side by side (repeatable).",
        show_default=False,
    ),
]
BoundOption = Annotated[
    bool,
    clikit.Option(
        "--bound",
        help="Measure the GPU's copy bandwidth first and report decode at concurrency 1 against the memory-bandwidth "
        "bound of MODEL (a local gpt-oss directory).",
    ),
]
PortOption = Annotated[
    int, clikit.Option("--port", help="The profile server's port; compared servers take the next ones.")
]
InputLenOption = Annotated[int, clikit.Option("--input-len", help="Prompt tokens per request (random dataset).")]
OutputLenOption = Annotated[int, clikit.Option("--output-len", help="Generated tokens per request (ignore_eos).")]
WavesOption = Annotated[int, clikit.Option("--waves", help="Prompts per run = waves x concurrency.")]
StartTimeoutOption = Annotated[
    float, clikit.Option("--start-timeout", metavar="SECONDS", help="How long the servers may take to become ready.")
]
LogDirOption = Annotated[
    Path | None,
    clikit.Option(
        "--log-dir",
        metavar="DIR",
        help="Server logs (default: a new directory under the XDG state dir).",
        show_default=False,
    ),
]

RUN_TIMEOUT = 900.0  # seconds one `vllm bench serve` run may go without a result


def register(app: clikit.App) -> None:
    app.command("bench", no_args_is_help=True)(bench)


@handles_errors
def bench(
    model: Annotated[str, clikit.Argument(help="Model id or local path, as for `vllm serve`.", show_default=False)],
    extra: ExtraArgs = None,
    concurrency: ConcurrencyOption = "1,2,4,5,8,10,16,32,64",
    repeat: RepeatOption = 3,
    compare: CompareOption = None,
    variant: VariantOption = None,
    bound: BoundOption = False,
    capture: CaptureOption = None,
    gpu: GpuOption = None,
    port: PortOption = 8000,
    input_len: InputLenOption = 128,
    output_len: OutputLenOption = 256,
    waves: WavesOption = 2,
    start_timeout: StartTimeoutOption = 900.0,
    allow_unpatched: AllowUnpatchedOption = False,
    log_dir: LogDirOption = None,
    python: PythonOption = None,
    venv: VenvOption = None,
    vllm: VllmOption = None,
    json_output: JsonOption = False,
    verbose: VerboseOption = False,
) -> None:
    """Measure the launcher's profile with vLLM's own `vllm bench serve`, against plain `vllm serve` with --compare vanilla.

    Starts the servers itself (side by side: the second once the first has sized its KV cache; each with a share of GPU memory unless you pass --gpu-memory-utilization after --), drives them in turn with identical requests (random dataset, fixed lengths, ignore_eos, /v1/completions), alternating which goes first, and prints per concurrency the medians over --repeat rounds with their range: prefill tok/s (concurrent streams x prompt length / mean time to first token), generation tok/s, peak tok/s (best one-second sample), median TPOT, and the profile/compared generation ratio. Every server is stopped on every exit path.
    """  # noqa: E501 - rich keeps a docstring's line breaks, so each paragraph is one line
    from gptoss_patch import bench as engine, render
    from gptoss_patch.launcher import preflight, profiles, runner

    sizes = profiles.parse_concurrency(concurrency)
    comparisons = engine.parse_compare(compare)
    variants = engine.parse_variants(variant or (), comparisons)
    engine.check_repeat(repeat)
    recipe = _bound_recipe(model, sizes) if bound else None
    user_args = tuple(extra or ())
    shared = _memory_share(len(comparisons) + len(variants) + 1, user_args, gpu)
    options = deferred_options(
        model, gpu=gpu, concurrency=capture or concurrency, host=LOOPBACK, port=port, extra_args=user_args + shared,
        allow_unpatched=allow_unpatched, allow_unauthenticated=False, expect_reasoning=True,
    )  # fmt: skip
    plan = resolve_plan(python, venv, vllm, options)
    preflight.require_launchable(plan)
    engine.require_bench(plan.installation.package_root, str(plan.installation.python))
    from gptoss_patch.commands.serve import _preflight

    _preflight(plan)
    specs = [_profile_spec(plan, port)] + [
        _compared_spec(plan, name, port + i) for i, name in enumerate(comparisons, 1)
    ]
    specs += [_variant_spec(plan, name, args, port + len(specs) + i) for i, (name, args) in enumerate(variants)]
    workload = engine.Workload(
        model=model, concurrency=sizes, repeat=repeat, input_len=input_len, output_len=output_len, waves=waves
    )
    log_dir = log_dir or runner.default_log_file().parent / time.strftime(f"bench-%Y%m%d-%H%M%S-{os.getpid()}")
    try:
        for spec in specs:
            if not engine.port_free(spec.port):
                from gptoss_patch.errors import UsageError

                raise UsageError(f"port {spec.port} ({spec.name} server) is in use; pass --port to choose another")
        limit = None
        if recipe is not None:  # before any server takes GPU memory
            from gptoss_patch.bench import bound as bounds

            render.info("measuring the GPU's copy bandwidth (--bound)")
            bandwidth = bounds.measure_bandwidth(str(plan.installation.python))
            limit = bounds.Bound(bounds.decode_bytes(recipe, input_len + output_len // 2), bandwidth)
        report = engine.run(
            str(plan.installation.python), specs, workload, log_dir=log_dir, start_timeout=start_timeout, run_timeout=RUN_TIMEOUT,
            notify=render.info, variants=[name for name, _ in variants],
        )  # fmt: skip
    except engine.BenchFailed as exc:  # the cause in one line, then the server's last lines
        render.error(str(exc), exc.hint)
        for line in exc.last_lines:
            render.info(f"  | {line}")
        if json_output:
            render.json_out(
                {"error": {"code": int(exc.exit_code), "message": str(exc), "last_lines": list(exc.last_lines)}}
            )
        raise clikit.Exit(int(exc.exit_code)) from None
    fractions = _fractions(report, limit) if limit else {}
    if json_output:
        extra_json = {"bound": {**limit.to_json(), "fraction_at_c1": fractions}} if limit else {}
        render.json_out(
            {**report.to_json(), "vllm": str(plan.installation.version), "profile": plan.profile, **extra_json}
        )
        return
    _show(report)
    if limit:
        _show_bound(limit, fractions)


def _bound_recipe(model: str, sizes: tuple[int, ...]) -> Recipe:
    from gptoss_patch.bench import bound as bounds
    from gptoss_patch.errors import UsageError

    if 1 not in sizes:
        raise UsageError("--bound compares decode at concurrency 1: add 1 to --concurrency")
    return bounds.recipe_from_model(model)


def _fractions(report: BenchReport, limit: Bound) -> dict[str, float]:
    """Per server: the bound's time per token over the median TPOT at concurrency 1."""
    return {row.server: round(limit.fraction(row.tpot_ms.median), 4) for row in report.rows if row.concurrency == 1}


def _show_bound(limit: Bound, fractions: dict[str, float]) -> None:
    from gptoss_patch import render

    parts = limit.bytes
    render.info(
        f"bound at concurrency 1: {parts.total / 1e9:.3f} GB a token (experts {parts.experts / 1e9:.3f}, attention "
        f"{parts.attention / 1e9:.3f}, lm_head {parts.lm_head / 1e9:.3f}, KV at {parts.context} tokens "
        f"{parts.kv_cache / 1e9:.3f}, other {parts.other / 1e9:.3f}) at {limit.bandwidth.gb_per_s:.0f} GB/s "
        f"({limit.bandwidth.device}): {limit.ms_per_token:.2f} ms a token"
    )
    for server, fraction in fractions.items():
        render.info(f"{server}: decode at concurrency 1 runs at {fraction:.0%} of the bound")


def _memory_share(servers: int, user_args: tuple[str, ...], gpu: str | None) -> tuple[str, ...]:
    """Servers sharing one GPU each take a part of its memory, unless the user set the fraction."""
    if servers == 1 or gpu == "cpu" or any(arg.startswith("--gpu-memory-utilization") for arg in user_args):
        return ()
    from gptoss_patch.bench import SHARED_MEMORY_UTILIZATION

    share = SHARED_MEMORY_UTILIZATION if servers == 2 else f"{0.88 / servers:.2f}"
    return ("--gpu-memory-utilization", share)


def _profile_spec(plan: LaunchPlan, port: int) -> ServerSpec:
    from gptoss_patch.bench import ServerSpec
    from gptoss_patch.launcher import plan as planning

    return ServerSpec("profile", tuple(plan.argv), plan.env, port, planning.served_model(plan))


def _variant_spec(plan: LaunchPlan, name: str, args: tuple[str, ...], port: int) -> ServerSpec:
    """The profile server again on its own port, with the variant's arguments last (so they win)."""
    from gptoss_patch.bench import ServerSpec
    from gptoss_patch.launcher import plan as planning

    argv = list(plan.argv)
    at = argv.index("--port") + 1
    argv[at] = str(port)
    return ServerSpec(name, (*argv, *args), plan.env, port, planning.served_model(plan))


def _compared_spec(plan: LaunchPlan, name: str, port: int) -> ServerSpec:
    """vanilla: `vllm serve MODEL --host --port` and your arguments, nothing of the profile but the local
    vocabulary (so it starts offline too); eager: the profile without capture sizes, plus --enforce-eager."""
    from gptoss_patch.bench import ServerSpec
    from gptoss_patch.launcher import plan as planning, profiles

    head = [str(plan.executable), *plan.entry]
    where = ["--host", LOOPBACK, "--port", str(port)]
    if name == "vanilla":
        vocabulary = {s.name: s.values[0] for s in plan.settings if s.kind == "env" and s.name.startswith("TIKTOKEN")}
        argv = [*head, *where, *plan.extra_args]
        return ServerSpec(name, tuple(argv), {**plan.base_env, **vocabulary}, port, planning.served_model(plan))
    kept = [
        s
        for s in plan.settings
        if s.kind == "flag" and s.name not in ("--host", "--port") and not profiles.is_capture_setting(s)
    ]
    argv = [*head, *where, *[a for s in kept for a in s.argv], *plan.extra_args, "--enforce-eager"]
    return ServerSpec(name, tuple(argv), plan.env, port, planning.served_model(plan))


def _show(report: BenchReport) -> None:
    from gptoss_patch import bench as engine, render

    names = [s["name"] for s in report.servers]
    baseline = next((name for name in names if name in engine.COMPARISONS), None)
    variants = [name for name in names if name != "profile" and name not in engine.COMPARISONS]
    ratio_header = (
        f"ratio (profile/{baseline}; variant/profile)" if baseline and variants
        else f"profile/{baseline}" if baseline
        else "variant/profile" if variants
        else ""
    )  # fmt: skip

    def stat(value: Stat, digits: int = 1) -> str:
        if value.low == value.high:
            return f"{value.median:.{digits}f}"
        return f"{value.median:.{digits}f} ({value.low:.{digits}f}-{value.high:.{digits}f})"

    columns = ["C", "server", "prefill tok/s", "generation tok/s", "peak tok/s", "TPOT ms"] + (
        [ratio_header] if ratio_header else []
    )
    rows = []
    for row in report.rows:
        ratio = "" if row.ratio is None else f"{row.ratio:.3f}" + (" (within spread)" if row.within_spread else "")
        rows.append(
            [
                str(row.concurrency),
                row.server,
                stat(row.prefill, 0),
                stat(row.generation),
                stat(row.peak, 0),
                stat(row.tpot_ms, 2),
            ]
            + ([ratio] if ratio_header else [])
        )
    workload = report.workload
    title = (
        f"medians over {workload['repeat']} rounds (min-max); {workload['input_len']} in / {workload['output_len']} out tokens, "
        f"{workload['waves']} prompts per stream"
    )
    render.table(title, columns, rows)
    for server in report.servers:
        ready = server["ready_seconds"]
        render.info(
            f"{server['name']}: ready after {ready:.0f} s; log {server['log']}"
            if ready is not None
            else f"{server['name']}: log {server['log']}"
        )
