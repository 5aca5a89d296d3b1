"""`gptoss-patch bench MODEL [--concurrency ...] [--repeat N] [--compare vanilla|recipe|eager] [-- vllm serve args]`."""

from __future__ import annotations

from typing import Annotated

from gptoss_patch import clikit
from gptoss_patch.commands._launch import (
    AllowUnpatchedOption,
    CompareOption,
    ExtraArgs,
    FastMoeOption,
    GpuOption,
    InstructionsOption,
    LogDirOption,
    ServersPortOption,
    StartTimeoutOption,
    VariantOption,
    deferred_options,
    resolve_plan,
)
from gptoss_patch.options import (
    JsonOption,
    PythonOption,
    VenvOption,
    VerboseOption,
    VllmOption,
    VocabOption,
    handles_errors,
)

ConcurrencyOption = Annotated[
    str,
    clikit.Option(
        "--concurrency", metavar="N,N,...", help="Concurrencies to measure (vllm bench serve --max-concurrency)."
    ),
]
RepeatOption = Annotated[
    int, clikit.Option("--repeat", metavar="N", help="Rounds; the table shows medians over them and their range.")
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
BoundOption = Annotated[
    bool,
    clikit.Option(
        "--bound",
        help="Measure the GPU's copy bandwidth first and report decode at concurrency 1 against the memory-bandwidth "
        "bound of MODEL (a local gpt-oss directory).",
    ),
]
InputLenOption = Annotated[int, clikit.Option("--input-len", help="Prompt tokens per request (random dataset).")]
OutputLenOption = Annotated[int, clikit.Option("--output-len", help="Generated tokens per request (ignore_eos).")]
WavesOption = Annotated[int, clikit.Option("--waves", help="Prompts per run = waves x concurrency.")]
OneAtATimeOption = Annotated[
    bool,
    clikit.Option(
        "--one-at-a-time",
        help="Run each server alone, with all its GPUs' memory: started, measured at every concurrency and round, "
        "stopped, then the next. For servers that do not fit the GPUs together (120b on one GPU); the rounds are then "
        "no longer interleaved between servers, which the table says.",
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
    port: ServersPortOption = 8000,
    input_len: InputLenOption = 128,
    output_len: OutputLenOption = 256,
    waves: WavesOption = 2,
    one_at_a_time: OneAtATimeOption = False,
    start_timeout: StartTimeoutOption = 900.0,
    allow_unpatched: AllowUnpatchedOption = False,
    instructions: InstructionsOption = None,
    fast_moe: FastMoeOption = False,
    log_dir: LogDirOption = None,
    python: PythonOption = None,
    venv: VenvOption = None,
    vllm: VllmOption = None,
    vocab: VocabOption = None,
    json: JsonOption = False,
    verbose: VerboseOption = False,
) -> None:
    """Measure the launcher's profile with vLLM's own `vllm bench serve`, against plain `vllm serve` with --compare vanilla.

    Starts the servers itself (side by side: the second once the first has sized its KV cache; each with a share of GPU memory unless you pass --gpu-memory-utilization after --), drives them in turn with identical requests (random dataset, fixed lengths, ignore_eos, /v1/completions), alternating which goes first, and prints per concurrency the medians over --repeat rounds with their range: prefill tok/s (concurrent streams x prompt length / mean time to first token), generation tok/s, peak tok/s (best one-second sample), median TPOT, and the profile/compared generation ratio. --compare recipe runs vLLM's published Hopper config (GPT-OSS_Hopper.yaml) as published, the flags this vLLM lacks left out and those it already defaults to named below the table; its peak tok/s is marked, as --stream-interval 20 distorts it. When the servers use different GPU counts (-tp/-dp in a --variant), a generation-per-GPU column is added. The servers' KV-cache sizes, as their logs state them, are compared below the table. Every server is stopped on every exit path.
    """  # noqa: E501 - rich keeps a docstring's line breaks, so each paragraph is one line
    from gptoss_patch import bench as engine, render
    from gptoss_patch.bench import launch
    from gptoss_patch.commands.serve import _preflight
    from gptoss_patch.launcher import preflight, profiles

    sizes = profiles.parse_concurrency(concurrency)
    comparisons = engine.parse_compare(compare)
    variants = engine.parse_variants(variant or (), comparisons)
    engine.check_repeat(repeat)
    recipe = launch.bound_recipe(model, sizes) if bound else None
    user_args = tuple(extra or ())
    servers = 1 if one_at_a_time else len(comparisons) + len(variants) + 1
    shared = launch.memory_share(servers, user_args, gpu)
    options = deferred_options(
        model, gpu=gpu, concurrency=capture or concurrency, host=launch.LOOPBACK, port=port, extra_args=user_args + shared,
        allow_unpatched=allow_unpatched, allow_unauthenticated=False, expect_reasoning=True, vocab=vocab,
        instructions=instructions, fast_moe=fast_moe,
    )  # fmt: skip
    plan = resolve_plan(python, venv, vllm, options)
    preflight.require_launchable(plan)
    preflight.require_parallel(plan)
    engine.require_bench(plan.installation.package_root, str(plan.installation.python))
    _preflight(plan)
    specs = launch.server_specs(plan, port, comparisons, variants)
    notes = launch.comparison_notes(plan, specs, one_at_a_time=one_at_a_time)
    workload = engine.Workload(
        model=model, concurrency=sizes, repeat=repeat, input_len=input_len, output_len=output_len, waves=waves
    )
    python_path = str(plan.installation.python)
    try:
        engine.check_ports(specs)
        limit = None
        if recipe is not None:  # before any server takes GPU memory
            render.info("measuring the GPU's copy bandwidth (--bound)")
            limit = launch.measure_bound(python_path, recipe, input_len + output_len // 2)
        report = engine.run(
            python_path, specs, workload, log_dir=log_dir or launch.default_log_dir(), start_timeout=start_timeout,
            run_timeout=RUN_TIMEOUT, notify=render.info, variants=[name for name, _ in variants],
            one_at_a_time=one_at_a_time,
        )  # fmt: skip
    except engine.BenchFailed as exc:  # the cause in one line, then the server's last lines
        render.bench_failed(exc, as_json=json)
        raise clikit.Exit(int(exc.exit_code)) from None
    fractions = launch.fractions(report, limit) if limit else {}
    if json:
        extra_json = {"bound": {**limit.to_json(), "fraction_at_c1": fractions}} if limit else {}
        render.json_out(
            {**report.to_json(), "vllm": str(plan.installation.version), "profile": plan.profile, "notes": notes, **extra_json}
        )
        return
    render.bench_table(report, notes)
    if limit:
        render.bench_bound(limit, fractions)
