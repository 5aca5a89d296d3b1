"""What runs in which order: every round visits each concurrency once, alternating which server goes first; the
`vllm bench serve` arguments of one run; the untimed warm-up."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gptoss_patch.bench.spec import ServerSpec, Workload


@dataclass(frozen=True)
class Run:
    """One `vllm bench serve` call in the schedule."""

    id: str
    server: str
    concurrency: int
    round: int


def schedule(servers: Sequence[str], workload: Workload) -> list[Run]:
    """Every round visits each concurrency once and runs each server at it. Which server goes first rotates
    with the round *and* the concurrency (shift = round + concurrency index), so at every concurrency each
    server leads in turn over the rounds, and within a round the lead alternates from one concurrency to the
    next: neither is always first, whatever the number of concurrencies."""
    runs = []
    for round_ in range(workload.repeat):
        for index, concurrency in enumerate(workload.concurrency):
            shift = (round_ + index) % len(servers)
            for name in (*servers[shift:], *servers[:shift]):
                runs.append(Run(f"r{round_}-c{concurrency}-{name}", name, concurrency, round_))
    return runs


def bench_argv(server: ServerSpec, workload: Workload, concurrency: int, round_: int) -> list[str]:
    """`vllm bench serve` arguments for one run: the same requests (seed = round) for every server."""
    return [
        "--backend", "vllm", "--base-url", server.url, "--endpoint", "/v1/completions",
        "--model", server.served_model, "--tokenizer", workload.model,
        "--dataset-name", "random", "--random-input-len", str(workload.input_len),
        "--random-output-len", str(workload.output_len), "--random-range-ratio", "0", "--ignore-eos",
        "--max-concurrency", str(concurrency), "--num-prompts", str(workload.prompts(concurrency)),
        "--seed", str(round_), "--percentile-metrics", "ttft,tpot,itl", "--disable-tqdm",
    ]  # fmt: skip


WARMUP_OUTPUT_LEN = 16


def warmup(workload: Workload) -> Workload:
    """The requests of an untimed warm-up run: one prompt per stream, 16 tokens out."""
    return Workload(
        model=workload.model,
        concurrency=(1,),
        repeat=1,
        input_len=workload.input_len,
        output_len=WARMUP_OUTPUT_LEN,
        waves=1,
        min_prompts=2,
    )


def warmups(servers: Sequence[str], workload: Workload) -> list[Run]:
    """The untimed runs before round 1, each server in turn. With `workload.warm_up`, one at every concurrency:
    the Triton MoE kernels compile on first use for each batch shape a load brings (issue 38: the first round at
    16 and 64 streams had 2-8x the time to first token of the second), and vLLM's start-up warms up neither those
    prompt batches nor their decode batches. Without it, one short run at concurrency 1 (the first requests after
    start-up pay one-off costs)."""
    sizes = workload.concurrency if workload.warm_up else (1,)
    return [Run(f"warmup-c{size}-{name}", name, size, -1) for size in sizes for name in servers]


def warmup_note(workload: Workload) -> str:
    """What the table's reader must know about the warm-up."""
    if workload.warm_up:
        sizes = ", ".join(str(c) for c in workload.concurrency)
        return (f"every server ran one untimed warm-up at each concurrency ({sizes}; one prompt per stream, "
                f"{WARMUP_OUTPUT_LEN} tokens out) before round 1: first-use compilation is not in the figures "
                "(--no-warm-up times it in round 1)")
    return ("no warm-up per concurrency (--no-warm-up): round 1 at each concurrency includes first-use compilation, "
            "which shows as a stalled time to first token")
