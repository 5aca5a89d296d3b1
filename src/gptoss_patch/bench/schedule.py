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


def warmup(workload: Workload) -> Workload:
    """One short untimed run per server first: the first requests after start-up pay one-off costs."""
    return Workload(
        model=workload.model,
        concurrency=(1,),
        repeat=1,
        input_len=workload.input_len,
        output_len=16,
        waves=1,
        min_prompts=2,
    )
