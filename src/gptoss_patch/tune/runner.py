"""Measure the reference and each candidate, one server at a time, with bench's method (bench.run: its servers, its
schedule of warm-ups and rounds, its statistics), and gate each on numerics (tune/gate.py).

One start per server serves both: once it is ready, the served check's passes (numerics/served.py) go to it, then
bench's load. A candidate that crashes, runs out of memory or fails a request is a result, never fatal; the
reference failing is (there is nothing to compare with). After each server the plan is made again at the pace measured
so far: a candidate the budget left out comes back when the time left holds it (the first start on a fresh machine
is slow, so the reference's pace alone under-fills the budget). After each server the finished results go to the partial
file (tune/profile.py), so an interrupted run resumes where it stopped. Progress goes through `notify` with the
elapsed time and an estimate of what is left; nothing here prints.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gptoss_patch.bench import BenchFailed, RunningServer, ServerSpec, Workload
from gptoss_patch.numerics.served import PROMPTS, Pass, PromptResult, one_pass
from gptoss_patch.tune import gate, planner, profile
from gptoss_patch.tune.candidates import Candidate, Skipped

CHECK_TOKENS = 16  # greedy tokens per prompt in the served check (its logprobs are the prompt's, whatever this is)
REFERENCE = "reference"


@dataclass(frozen=True)
class Job:
    """One server to measure: the reference (candidate None) or a candidate, as its own launch plan starts it."""

    spec: ServerSpec
    candidate: Candidate | None = None

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass
class Outcome:
    """What the run found: every result (the reference first), how many came from an interrupted run, the time in
    servers (start, check, load, stop) against the wall time, and what the budget left out once the reference ran."""

    results: list[dict[str, Any]]
    kept: int
    seconds: float
    server_seconds: float
    left_out: list[Skipped] = field(default_factory=list)
    added: list[Job] = field(default_factory=list)  # candidates the first plan left out, run because time was left


def pass_to_json(done: Pass) -> dict[str, Any]:
    return asdict(done)


def pass_from_json(raw: dict[str, Any]) -> Pass:
    prompts = tuple(PromptResult(tuple(p["logprobs"]), tuple(p["top1"]), str(p["greedy"])) for p in raw["prompts"])
    return Pass(str(raw["server"]), int(raw["index"]), prompts, float(raw["seconds"]))


def run(
    python: str,
    jobs: Sequence[Job],
    workload: Workload,
    *,
    key: profile.Key,
    fingerprint: dict[str, Any],
    plan: planner.TunePlan,
    log_dir: Path,
    start_timeout: float,
    run_timeout: float,
    notify: Callable[[str], None],
    kernels: dict[str, gate.Verdict] | None,
    kernel_reason: str,
    started: float,
    more: Iterator[Job] | None = None,
) -> Outcome:
    """The reference (jobs[0]) then each candidate; see the module's docstring. `more`: the candidates the plan left
    out, in their order, each prepared when it is taken."""
    begun = time.monotonic()
    previous = profile.load_partial(key, fingerprint)
    kept = {(r["name"], tuple(r.get("args") or ())): r for r in (previous or {}).get("results", [])}
    results: list[dict[str, Any]] = []
    reference_passes: list[Pass] = []
    server_seconds = 0.0
    left_out: list[Skipped] = []
    todo = list(jobs)
    waiting: deque[Job] = deque()  # dropped once the reference's pace was known: first in line when time is left
    added: list[Job] = []
    pace: float | None = None
    kept_count = 0
    index = 0
    while index < len(todo):
        job = todo[index]
        index += 1
        args = tuple(job.candidate.args) if job.candidate else ()
        found = kept.get((job.name, args))
        if found is not None and (job.candidate is not None or found.get("passes")):
            results.append(found)
            kept_count += 1
            if job.candidate is None:
                reference_passes = [pass_from_json(p) for p in found["passes"]]
            notify(f"[{index}/{len(todo)}] {job.name}: kept from the interrupted run ({found['status']})")
            continue
        eta = _eta(todo, index - 1, pace, plan)
        notify(f"[{index}/{len(todo)}] {job.name}: starting ({planner.duration(time.monotonic() - started)} elapsed, "
               f"about {planner.duration(eta)} left)")
        t0 = time.monotonic()
        result = _measure(python, job, workload, log_dir, start_timeout, run_timeout, notify)
        took = time.monotonic() - t0
        server_seconds += took
        result["seconds"] = round(took, 1)
        if job.candidate is None:
            reference_passes = [pass_from_json(p) for p in result["passes"]]
            if pace is None:
                pace = took
                remaining = plan.budget - (time.monotonic() - started)
                refitted = planner.refit(plan, took, remaining, done=0)
                dropped = {s.name for s in refitted.left_out[len(plan.left_out):]}
                left_out += refitted.left_out[len(plan.left_out):]
                waiting.extend(j for j in todo if j.name in dropped)
                todo = [j for j in todo if j.name not in dropped]
                for skipped in refitted.left_out[len(plan.left_out):]:
                    notify(f"{skipped.name}: {skipped.reason}")
        else:
            result["gate"] = _gate(job.candidate, result, reference_passes, kernels, kernel_reason)
        results.append(result)
        profile.save_partial(key, fingerprint, results, {})
        notify(f"[{index}/{len(todo)}] {job.name}: {_summary(result)} ({planner.duration(took)})")
        if index == len(todo):
            taken = _next_that_fits(waiting, more or iter(()), plan.budget - (time.monotonic() - started),
                                    _candidate_pace(results, pace, plan), notify)
            if taken is not None:
                todo.append(taken)
                added.append(taken)
                left_out = [s for s in left_out if s.name != taken.name]
    return Outcome(results, kept_count, time.monotonic() - begun, server_seconds, left_out, added)


def _candidate_pace(results: Sequence[dict[str, Any]], pace: float | None, plan: planner.TunePlan) -> float:
    """Seconds a candidate takes: the mean of those measured (kept ones from an interrupted run have no time), else the
    reference's measured time scaled as the plan scales its estimates, else the plan's estimate."""
    measured = [float(r["seconds"]) for r in results[1:] if r.get("seconds")]
    if measured:
        return sum(measured) / len(measured)
    if pace is not None:
        return pace * plan.candidate_seconds / max(plan.reference_seconds, 1e-9)
    return plan.candidate_seconds


def _next_that_fits(waiting: deque[Job], more: Iterator[Job], remaining: float, each: float,
                    notify: Callable[[str], None]) -> Job | None:
    """The next candidate left out for the budget, when `remaining` seconds hold one at `each` seconds a candidate."""
    if remaining < each:
        return None
    taken = waiting.popleft() if waiting else next(more, None)
    if taken is not None:
        notify(f"{taken.name}: taken back in: {planner.duration(remaining)} of the budget left, about "
               f"{planner.duration(each)} a candidate at the pace measured")
    return taken


def _measure(python: str, job: Job, workload: Workload, log_dir: Path, start_timeout: float, run_timeout: float,
             notify: Callable[[str], None]) -> dict[str, Any]:
    """One server: start, the served check's passes, bench's load, stop; crashes and failures as results."""
    from gptoss_patch import bench
    from gptoss_patch.launcher import knowledge

    passes: list[Pass] = []
    count = planner.REFERENCE_PASSES if job.candidate is None else planner.CANDIDATE_PASSES

    def check(servers: Sequence[RunningServer]) -> None:
        server = servers[0]
        for number in range(1, count + 1):
            passes.append(one_pass(server.spec, number, PROMPTS, max_tokens=CHECK_TOKENS, parallel=len(PROMPTS)))
            notify(f"{job.name}: served check, pass {number}: {len(PROMPTS)} prompts in {passes[-1].seconds:.1f} s")

    base: dict[str, Any] = {
        "name": job.name, "axis": job.candidate.axis if job.candidate else REFERENCE,
        "args": list(job.candidate.args) if job.candidate else [], "command": list(job.spec.argv),
    }  # fmt: skip
    try:
        report = bench.run(python, [job.spec], workload, log_dir=log_dir / job.name, start_timeout=start_timeout,
                           run_timeout=run_timeout, notify=notify, on_ready=check)
    except BenchFailed as exc:
        if job.candidate is None:
            raise BenchFailed(f"the reference configuration failed: {exc}", last_lines=exc.last_lines,
                              log_file=exc.log_file) from None
        issue = knowledge.diagnose(list(exc.last_lines))
        status = "out of memory" if issue is not None and issue.id == "G23" else "crashed" if exc.last_lines else "failed"
        return {**base, "status": status, "error": str(exc), "last_lines": list(exc.last_lines),
                "log": str(exc.log_file) if exc.log_file else None, "rows": [], "gate": {}}
    server = report.servers[0] if report.servers else {}
    return {
        **base, "status": "measured", "rows": [asdict(row) for row in report.rows], "ready_seconds": server.get("ready_seconds"),
        "log": server.get("log"), "kv_cache": server.get("kv_cache"), "passes": [pass_to_json(p) for p in passes],
        "gate": {},
    }  # fmt: skip


def _gate(candidate: Candidate, result: dict[str, Any], reference: Sequence[Pass],
          kernels: dict[str, gate.Verdict] | None, kernel_reason: str) -> dict[str, Any]:
    """The candidate's kernel and served verdicts (both as JSON), its served figures under `served_figures`."""
    kernel = gate.kernel_verdict(candidate.moe_backend, kernels, kernel_reason)
    out: dict[str, Any] = {"kernel": kernel.to_json()}
    passes = [pass_from_json(p) for p in result.get("passes") or []]
    if result["status"] == "measured" and passes and len(reference) >= 2:
        served, figures = gate.served_verdict(reference, passes[0])
        out["served"] = served.to_json()
        out["served_figures"] = figures
    result.pop("passes", None)  # a candidate's pass is judged now; only the reference's are kept (for a resume)
    return out


def _summary(result: dict[str, Any]) -> str:
    if result["status"] != "measured":
        return f"{result['status']}: {result.get('error', '')}"
    figures = ", ".join(f"{row['generation']['median']:.1f} tok/s at {row['concurrency']}" for row in result["rows"])
    verdict = result.get("gate") or {}
    if not verdict:
        return f"measured: {figures}"
    return f"measured: {figures}; gate {'passed' if gate.passed(verdict) else 'failed'}"


def _eta(todo: Sequence[Job], done: int, pace: float | None, plan: planner.TunePlan) -> float:
    """Seconds left: the servers still to run at the reference's measured pace, else at the plan's estimate."""
    left = len(todo) - done
    if pace is not None:
        each = pace * plan.candidate_seconds / max(plan.reference_seconds, 1e-9)
        return left * each
    return plan.reference_seconds + (left - 1) * plan.candidate_seconds if left else 0.0
