"""`gptoss-patch bench`: the launcher's profile against plain `vllm serve`, measured side by side with vLLM's own benchmark.

Both servers run at once on one machine (each with its share of memory; the second starts once the
first has sized its KV cache), and every round drives them in turn, alternating which goes first, with
identical requests (`vllm bench serve`: random dataset, fixed input and output lengths, `ignore_eos`, the
completions endpoint). The figures are medians over the rounds with their spread, so a difference
smaller than the spread reads as noise.

    spec.py       what a run is: ServerSpec, Workload, BenchFailed; --compare, --variant and --repeat checked
    launch.py     the servers from the launcher's plan (profile, vanilla, recipe, eager, variants), memory shares, --bound,
                  each server's GPU count, the notes below the table
    recipe.py     vLLM's published Hopper config (--compare recipe), checked against the installed release
    schedule.py   which run comes when (the order alternates), the `vllm bench serve` arguments, the warm-ups
    servers.py    a started server: log file and tail, /health (launcher/http.py: never a proxy), stop
    session.py    one run: start, wait ready, drive driver.py, stop everything on every exit path
    stats.py      samples from vLLM's result JSON, medians and ranges, ratios: the BenchReport
    driver.py     runs `vllm bench serve` in the target interpreter (not imported here)
    bound.py      the memory-bandwidth bound of decode at one stream (imported by --bound only)

Engine only: results come back as data (BenchReport); commands/bench.py and render.py print. Every server
and the benchmark driver run in their own process group with a parent-death signal (launcher/runner.py),
and every exit path stops them all.
"""

from gptoss_patch.bench.schedule import Run, bench_argv, schedule, warmup, warmup_note, warmups
from gptoss_patch.bench.servers import HEALTH_INTERVAL, TAIL_LINES, RunningServer, check_ports, port_free, wait_ready
from gptoss_patch.bench.session import DRIVER, run
from gptoss_patch.bench.spec import (
    COMPARISONS,
    DEFAULT_CONCURRENCY,
    SHARED_MEMORY_UTILIZATION,
    BenchFailed,
    ServerSpec,
    Workload,
    check_repeat,
    parse_compare,
    parse_variants,
    require_bench,
)
from gptoss_patch.bench.stats import BenchReport, Row, Sample, Stat, sample_from, summarize

__all__ = [
    "COMPARISONS", "DEFAULT_CONCURRENCY", "DRIVER", "HEALTH_INTERVAL", "SHARED_MEMORY_UTILIZATION", "TAIL_LINES",
    "BenchFailed", "BenchReport", "Row", "Run", "RunningServer", "Sample", "ServerSpec", "Stat", "Workload",
    "bench_argv", "check_ports", "check_repeat", "parse_compare", "parse_variants", "port_free", "require_bench",
    "run", "sample_from", "schedule", "summarize", "wait_ready", "warmup", "warmup_note", "warmups",
]  # fmt: skip
