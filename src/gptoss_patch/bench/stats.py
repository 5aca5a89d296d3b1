"""The figures: vLLM's result JSON reduced to a Sample per run, medians and ranges per (server, concurrency), the
ratios, and the report."""

from __future__ import annotations

import collections
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gptoss_patch.bench.schedule import Run
from gptoss_patch.bench.spec import BenchFailed


@dataclass(frozen=True)
class Sample:
    """The figures of one run (vLLM's result JSON, reduced)."""

    server: str
    concurrency: int
    round: int
    prefill: float  # tok/s: concurrent streams x input length / mean time to first token
    generation: float  # tok/s: output tokens / duration (vLLM's output_throughput)
    peak: float  # tok/s: vLLM's max_output_tokens_per_s (highest one-second sample)
    tpot_ms: float  # vLLM's median_tpot_ms
    completed: int
    failed: int
    ttft_ms: float = 0.0  # vLLM's mean_ttft_ms: a prefill stall shows here first


@dataclass(frozen=True)
class Stat:
    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Stat:
        return cls(statistics.median(values), min(values), max(values))


@dataclass(frozen=True)
class Row:
    """One concurrency for one server: medians over the rounds with their range; the ratio to `baseline`."""

    server: str
    concurrency: int
    rounds: int
    prefill: Stat
    generation: Stat
    peak: Stat
    tpot_ms: Stat
    ratio: float | None = None  # generation median / the compared server's, for the profile's rows
    within_spread: bool | None = None  # the two generation ranges overlap: the difference is noise
    ttft_ms: Stat | None = None
    tpot_ratio: float | None = None  # the compared server's median TPOT / this one's: > 1 is faster decode
    ttft_outliers: tuple[int, ...] = ()  # rounds whose mean TTFT stalled (TTFT_OUTLIER x the others' median)
    compared_outliers: tuple[int, ...] = ()  # the compared server's stalled rounds at this concurrency
    tpot_within_spread: bool | None = None  # the two TPOT ranges overlap

    def ratio_text(self) -> str:
        """The ratio cell: the generation ratio, what its spread says, and the TPOT ratio. A stalled round (its own
        or the compared server's) moves generation tok/s through prefill queueing: the ratio then says so rather
        than "within spread", and TPOT is the figure to read."""
        if self.ratio is None:
            return ""
        text = f"{self.ratio:.3f}"
        if self.ttft_outliers or self.compared_outliers:
            text += " (a round stalled in prefill: read TPOT)"
        elif self.within_spread:
            text += f" (within spread of {self.rounds} rounds)"
        if self.tpot_ratio is not None:  # decode speed alone: steadier where prefill queueing moves generation
            text += f"\nTPOT {self.tpot_ratio:.3f}" + (" (within spread)" if self.tpot_within_spread else "")
        return text


TTFT_OUTLIER = 3.0  # a round whose mean TTFT is 3x the median of its other rounds queued in prefill


@dataclass
class BenchReport:
    servers: list[dict[str, Any]]
    workload: dict[str, Any]
    rows: list[Row]
    samples: list[Sample]
    bench_argv: list[str]
    seconds: float
    one_at_a_time: bool = False  # each server ran alone on the GPUs, not side by side

    def to_json(self) -> dict[str, Any]:
        return {
            "servers": self.servers,
            "workload": self.workload,
            "rows": [asdict(row) for row in self.rows],
            "samples": [asdict(sample) for sample in self.samples],
            "bench_command": self.bench_argv,
            "seconds": round(self.seconds, 1),
            "one_at_a_time": self.one_at_a_time,
        }


def sample_from(result: dict[str, Any], run: Run) -> Sample:
    """Reduce vLLM's result JSON to the table's figures; a run where requests failed is an error."""
    completed = int(result.get("completed") or 0)
    failed = int(result.get("failed") or 0)
    if completed == 0:
        raise BenchFailed(f"{run.server} at concurrency {run.concurrency}: no request completed ({failed} failed)")
    mean_ttft = float(result.get("mean_ttft_ms") or 0.0) / 1000
    input_per_request = float(result.get("total_input_tokens") or 0) / completed
    streams = min(run.concurrency, completed)
    return Sample(
        server=run.server,
        concurrency=run.concurrency,
        round=run.round,
        prefill=streams * input_per_request / mean_ttft if mean_ttft > 0 else 0.0,
        generation=float(result.get("output_throughput") or 0.0),
        peak=float(result.get("max_output_tokens_per_s") or 0.0),
        tpot_ms=float(result.get("median_tpot_ms") or 0.0),
        completed=completed,
        failed=failed,
        ttft_ms=mean_ttft * 1000,
    )


def summarize(samples: Sequence[Sample], servers: Sequence[str], variants: Sequence[str] = ()) -> list[Row]:
    """Medians and ranges per (server, concurrency), in schedule order; the profile's rows carry the ratio
    of its median generation rate to the first compared server's (vanilla or eager), a variant's rows the
    ratio of theirs to the profile's, each with whether the two ranges overlap."""
    groups: dict[tuple[str, int], list[Sample]] = collections.defaultdict(list)
    for sample in samples:
        groups[(sample.server, sample.concurrency)].append(sample)
    rows: dict[tuple[str, int], Row] = {}
    for (name, concurrency), found in groups.items():
        rows[(name, concurrency)] = Row(
            server=name,
            concurrency=concurrency,
            rounds=len(found),
            prefill=Stat.of([s.prefill for s in found]),
            generation=Stat.of([s.generation for s in found]),
            peak=Stat.of([s.peak for s in found]),
            tpot_ms=Stat.of([s.tpot_ms for s in found]),
            ttft_ms=Stat.of([s.ttft_ms for s in found]),
            ttft_outliers=ttft_outliers(found, [s for s in samples if s.concurrency == concurrency and s.server != name]),
        )
    baseline = next((s for s in servers if s != "profile" and s not in variants), None)
    ordered = []
    for concurrency in sorted({c for _, c in rows}):
        for name in servers:
            row = rows.get((name, concurrency))
            if row is None:
                continue
            against = baseline if name == "profile" else "profile" if name in variants else None
            other = rows.get((against, concurrency)) if against else None
            if other is not None and other.generation.median > 0:
                row = Row(
                    **{
                        **row.__dict__,
                        "ratio": row.generation.median / other.generation.median,
                        "within_spread": _overlap(row.generation, other.generation),
                        "tpot_ratio": other.tpot_ms.median / row.tpot_ms.median if row.tpot_ms.median > 0 else None,
                        "tpot_within_spread": _overlap(row.tpot_ms, other.tpot_ms),
                        "compared_outliers": other.ttft_outliers,
                    }
                )
            ordered.append(row)
    return ordered


def _overlap(one: Stat, other: Stat) -> bool:
    return one.low <= other.high and other.low <= one.high


def ttft_outliers(samples: Sequence[Sample], peers: Sequence[Sample] = ()) -> tuple[int, ...]:
    """Rounds whose mean time to first token is TTFT_OUTLIER times the median of the server's other rounds at
    that concurrency (one other round is enough: `--repeat 2`), or with a single round, of the other servers'
    runs at that concurrency (`peers`): requests queued in prefill (first-use compilation, a stall seen on H100
    at C=10), which pulls that round's generation rate down while its TPOT stays put. Flagged in the table, not
    dropped: with 3 rounds and more the median resists one such round, with 2 it does not."""
    flagged = []
    for sample in samples:
        others = [s.ttft_ms for s in samples if s is not sample and s.ttft_ms > 0]
        others = others or [s.ttft_ms for s in peers if s.ttft_ms > 0]
        if others and sample.ttft_ms > TTFT_OUTLIER * statistics.median(others):
            flagged.append(sample.round)
    return tuple(sorted(flagged))


def gpu_counts(servers: Sequence[dict[str, Any]]) -> dict[str, int] | None:
    """Each server's GPU count when they differ (the table then adds generation tok/s per GPU), else None."""
    counts = {str(s["name"]): int(s.get("gpus") or 1) for s in servers}
    return counts if len(set(counts.values())) > 1 else None


def per_gpu(row: Row, counts: dict[str, int]) -> float:
    """Median generation tok/s per GPU: the figure of merit when the servers use different GPU counts."""
    return row.generation.median / max(1, counts.get(row.server, 1))


KV_SPREAD = 0.10  # KV cache sizes within 10 % of each other read as equal


def kv_cache_note(servers: Sequence[dict[str, Any]]) -> tuple[bool, str]:
    """(differ, text): whether the servers' KV caches, as their logs state them, differ by more than KV_SPREAD.
    Servers sharing a GPU size their caches one after the other, each from what the others left free."""
    sizes = {str(s["name"]): dict(s.get("kv_cache") or {}) for s in servers}
    if len(sizes) < 2:
        return False, ""
    for kind, unit in (("gib", "GiB"), ("tokens", "tokens")):
        if all(kind in found for found in sizes.values()):
            values = {name: found[kind] for name, found in sizes.items()}
            listed = ", ".join(f"{name} {value:,.2f} {unit}" if unit == "GiB" else f"{name} {value:,.0f} {unit}" for name, value in values.items())
            low, high = min(values.values()), max(values.values())
            if high > 0 and (high - low) / high > KV_SPREAD:
                return True, (f"KV cache sizes differ ({listed}): a server with less KV cache preempts or queues sooner at high "
                              "concurrency, so those rows compare sizing as well as speed")
            return False, f"KV cache sizes within {KV_SPREAD * 100:.0f} % of each other ({listed})"
    return False, "KV cache sizes could not be read from every server's log: the table assumes they are sized equally"
