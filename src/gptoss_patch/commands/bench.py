"""`gptoss-patch bench MODEL [--concurrency ...] [--repeat N] [--compare vanilla|recipe|eager] [-- vllm serve args]`."""

from __future__ import annotations

from typing import Annotated

from gptoss_patch import clikit
from gptoss_patch.commands._launch import CompareOption, ServersLaunchGroup, VariantOption, gate
from gptoss_patch.commands._measure import InputLenOption, OutputLenOption, RunOptions
from gptoss_patch.options import handles_errors

ConcurrencyOption = Annotated[
    str,
    clikit.Option(
        "--concurrency", metavar="N,N,...",
        help="The concurrencies you serve at (parallel requests, e.g. 1,5,10). Each is measured (vllm bench serve --max-concurrency).",
    ),
]
RepeatOption = Annotated[
    int, clikit.Option("--repeat", metavar="N", help="How many times each measurement is repeated. The table shows medians over the rounds and their range.")
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
WavesOption = Annotated[int, clikit.Option("--waves", help="Prompts per run = waves x concurrency.")]
WarmUpOption = Annotated[
    bool,
    clikit.Option(
        "--warm-up/--no-warm-up",
        help="Before round 1, run each server once, untimed, at every concurrency, so that first-use compilation "
        "(the Triton MoE kernels' per batch shape) is not timed.",
    ),
]
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
    launch: ServersLaunchGroup,
    concurrency: ConcurrencyOption = "1,2,4,5,8,10,16,32,64",
    repeat: RepeatOption = 3,
    compare: CompareOption = None,
    variant: VariantOption = None,
    bound: BoundOption = False,
    capture: CaptureOption = None,
    input_len: InputLenOption = 128,
    output_len: OutputLenOption = 256,
    waves: WavesOption = 2,
    one_at_a_time: OneAtATimeOption = False,
    warm_up: WarmUpOption = True,
    *,
    run: RunOptions,
) -> None:
    """Measure the launcher's profile with vLLM's own `vllm bench serve`, against plain `vllm serve` with --compare vanilla.

    Starts the servers itself (side by side: the second once the first has sized its KV cache; each with a share of GPU memory unless you pass --gpu-memory-utilization after --), drives them in turn with identical requests (random dataset, fixed lengths, ignore_eos, /v1/completions), alternating which goes first, and prints per concurrency the medians over --repeat rounds with their range: prefill tok/s (concurrent streams x prompt length / mean time to first token), generation tok/s, peak tok/s (best one-second sample), median TPOT, and the profile/compared generation ratio. --compare recipe runs vLLM's published Hopper config (GPT-OSS_Hopper.yaml) as published, the flags this vLLM lacks left out and those it already defaults to named below the table; its peak tok/s is marked, as --stream-interval 20 distorts it. When the servers use different GPU counts (-tp/-dp in a --variant), a generation-per-GPU column is added. The servers' KV-cache sizes, as their logs state them, are compared below the table. Every server is stopped on every exit path.
    """  # noqa: E501 - rich keeps a docstring's line breaks, so each paragraph is one line
    import dataclasses

    from gptoss_patch import bench as engine, render
    from gptoss_patch.bench import launch as servers
    from gptoss_patch.errors import GptossPatchError
    from gptoss_patch.launcher import profiles
    from gptoss_patch.launcher.prepare import prepare

    model = str(launch.model)
    sizes = profiles.parse_concurrency(concurrency)
    comparisons = engine.parse_compare(compare)
    variants = engine.parse_variants(variant or (), comparisons)
    engine.check_repeat(repeat)
    recipe = servers.bound_recipe(model, sizes) if bound else None
    count = 1 if one_at_a_time else len(comparisons) + len(variants) + 1
    shared = servers.memory_share(count, launch.extra_args, launch.gpu)
    launch = dataclasses.replace(launch, concurrency=capture or concurrency, extra_args=launch.extra_args + shared)
    prepared = prepare(launch, notify=render.info)
    plan = prepared.plan
    engine.require_bench(plan.installation.package_root, str(plan.installation.python))
    gate(prepared)
    for name, args in variants:  # each variant's layout through the same checks (exit 4 / exit 1 as for the base)
        try:
            other = prepare(dataclasses.replace(launch, extra_args=launch.extra_args + args), notify=lambda _text: None)
        except GptossPatchError as exc:
            exc.args = (f"--variant {name}: {exc}",)
            raise
        gate(dataclasses.replace(other, checks=servers.variant_checks(prepared.checks, name, other.checks)))
    specs = servers.server_specs(plan, launch.port, comparisons, variants)
    notes = servers.comparison_notes(plan, specs, one_at_a_time=one_at_a_time)
    workload = engine.Workload(
        model=model, concurrency=sizes, repeat=repeat, input_len=input_len, output_len=output_len, waves=waves,
        warm_up=warm_up,
    )
    notes.append(engine.warmup_note(workload))
    from gptoss_patch import distinfo

    libraries = distinfo.kernel_versions(plan.installation.site_packages)
    notes.append(distinfo.kernel_versions_line(libraries))
    from gptoss_patch.launcher import knowledge

    notes += knowledge.kernel_library_notes(libraries, str(plan.installation.version))  # G50
    python_path = str(plan.installation.python)
    engine.check_ports(specs)
    limit = None
    if recipe is not None:  # before any server takes GPU memory
        render.info("measuring the GPU's copy bandwidth (--bound)")
        limit = servers.measure_bound(python_path, recipe, input_len + output_len // 2)
    # a BenchFailed (the cause in one line, then the server's last lines) goes to the one error path
    report = engine.run(
        python_path, specs, workload, log_dir=run.logs("bench"), start_timeout=run.start_timeout,
        run_timeout=RUN_TIMEOUT, notify=render.info, variants=[name for name, _ in variants], one_at_a_time=one_at_a_time,
    )  # fmt: skip
    fractions = servers.fractions(report, limit) if limit else {}
    if run.json:
        extra_json = {"bound": {**limit.to_json(), "fraction_at_c1": fractions, "gpus": servers.server_gpus(report)}} if limit else {}
        render.json_out(
            {**report.to_json(), "vllm": str(plan.installation.version), "kernel_libraries": libraries, "profile": plan.profile,
             "notes": notes, **extra_json}
        )
        return
    render.bench_table(report, notes)
    if limit:
        render.bench_bound(limit, fractions, servers.server_gpus(report))
