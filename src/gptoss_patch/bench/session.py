"""One bench run: start every server, wait until all are ready, feed the schedule to the benchmark driver
(driver.py, in the target interpreter), read its results while watching the servers, stop everything."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import IO, Any, NoReturn

from gptoss_patch.bench.schedule import Run, bench_argv, schedule, warmup, warmups
from gptoss_patch.bench.servers import HEALTH_INTERVAL, TAIL_LINES, RunningServer, check_ports, start_side_by_side
from gptoss_patch.bench.spec import BenchFailed, ServerSpec, Workload
from gptoss_patch.bench.stats import BenchReport, Sample, sample_from, summarize
from gptoss_patch.launcher import runner

DRIVER = Path(__file__).with_name("driver.py")


def run(
    python: str,
    specs: Sequence[ServerSpec],
    workload: Workload,
    *,
    log_dir: Path,
    start_timeout: float,
    run_timeout: float,
    notify: Callable[[str], None],
    variants: Sequence[str] = (),
    one_at_a_time: bool = False,
    on_ready: Callable[[Sequence[RunningServer]], None] | None = None,
) -> BenchReport:
    """Start every server, wait until all are ready, run the schedule, stop everything; the report. With
    `one_at_a_time`, each server instead runs alone (started, warmed up, measured, stopped) before the next:
    for servers that do not fit the GPUs together. `on_ready` is called with the ready servers before any load
    reaches them (tune's served numerics check: the same start serves the check and the measurement)."""
    check_ports(specs)
    started = time.monotonic()
    names = [spec.name for spec in specs]
    runs = schedule(names, workload)
    groups = [[spec] for spec in specs] if one_at_a_time else [list(specs)]
    samples: list[Sample] = []
    finished: list[RunningServer] = []
    for group in groups:
        members = {spec.name for spec in group}
        mine = [r for r in runs if r.server in members]
        samples += _measure(python, group, workload, mine, log_dir, start_timeout, run_timeout, notify, finished, on_ready)
    return BenchReport(
        servers=[
            {"name": s.spec.name, "command": list(s.spec.argv), "ready_seconds": s.ready_after, "log": str(s.log_file),
             "gpus": s.spec.gpus, "kv_cache": dict(s.kv_cache)}
            for s in finished
        ],
        workload=asdict(workload),
        rows=summarize(samples, names, variants),
        samples=samples,
        bench_argv=["vllm", "bench", "serve", *bench_argv(specs[0], workload, workload.concurrency[0], 0)],
        seconds=time.monotonic() - started,
        one_at_a_time=one_at_a_time,
    )


def _measure(
    python: str,
    specs: Sequence[ServerSpec],
    workload: Workload,
    runs: Sequence[Run],
    log_dir: Path,
    start_timeout: float,
    run_timeout: float,
    notify: Callable[[str], None],
    finished: list[RunningServer],
    on_ready: Callable[[Sequence[RunningServer]], None] | None = None,
) -> list[Sample]:
    """Start `specs` side by side, warm each up, run `runs` against them, stop them all (on every exit path);
    the servers are appended to `finished` once stopped."""
    by_name = {spec.name: spec for spec in specs}
    servers: list[RunningServer] = []
    driver: subprocess.Popen | None = None
    try:
        start_side_by_side(specs, log_dir, start_timeout, notify, servers)
        if on_ready is not None:
            on_ready(servers)
        untimed = warmups([spec.name for spec in specs], workload)
        payload = [{"id": r.id, "argv": bench_argv(by_name[r.server], warmup(workload), r.concurrency, 0)} for r in untimed]
        payload += [
            {"id": r.id, "argv": bench_argv(by_name[r.server], workload, r.concurrency, r.round)} for r in runs
        ]
        driver = runner.start([python, str(DRIVER)], os.environ, stdout=subprocess.PIPE, stdin=subprocess.PIPE)
        return _drive(driver, payload, {r.id: r for r in runs}, servers, run_timeout, notify)
    finally:
        if driver is not None:
            runner.stop(driver, grace=5)
            for pipe in (driver.stdin, driver.stdout):  # the driver's pipes are ours to close, also after a failure
                if pipe is not None:
                    with contextlib.suppress(OSError):  # a driver that died leaves a broken pipe to flush
                        pipe.close()
        for server in servers:
            server.stop()
        finished.extend(servers)


def _drive(
    driver: subprocess.Popen,
    payload: list[dict[str, Any]],
    runs: dict[str, Run],
    servers: Sequence[RunningServer],
    run_timeout: float,
    notify: Callable[[str], None],
) -> list[Sample]:
    """Feed the driver the schedule; read one JSON line per run while watching that every server lives."""
    assert driver.stdin is not None and driver.stdout is not None
    driver.stdin.write((json.dumps({"runs": payload}) + "\n").encode())
    driver.stdin.close()
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_lines, args=(driver.stdout, lines), daemon=True).start()
    samples: list[Sample] = []
    done = 0
    last = time.monotonic()
    while done < len(payload):
        for server in servers:
            if not server.alive():
                raise server.failure(f"died during the benchmark (exit code {server.child.returncode})")
        try:
            line = lines.get(timeout=HEALTH_INTERVAL)
        except queue.Empty:
            if time.monotonic() - last > run_timeout:
                raise BenchFailed(f"a `vllm bench serve` run gave no result in {run_timeout:.0f} s") from None
            continue
        if line is None:
            raise BenchFailed(f"the benchmark driver exited (code {driver.wait()}) after {done} of {len(payload)} runs")
        message = _parse(line)
        if message is None:
            continue  # a library printed to stdout; results are JSON lines with an id
        if "fatal" in message:
            raise BenchFailed(str(message["fatal"]))
        last = time.monotonic()
        done += 1
        run_ = runs.get(str(message["id"]))
        if "error" in message:
            name = run_.server if run_ else str(message.get("id")).rsplit("-", 1)[-1]
            _raise_for(f"vllm bench serve failed against the {name} server: {message['error']}", name, servers)
        if run_ is None:
            continue  # a warm-up
        try:
            sample = sample_from(message.get("result") or {}, run_)
        except BenchFailed as exc:  # every request failed: most often the server broke (out of memory, a crash)
            _raise_for(str(exc), run_.server, servers)
        samples.append(sample)
        notify(
            f"round {run_.round + 1} c={run_.concurrency} {run_.server}: {sample.generation:.1f} tok/s, TPOT {sample.tpot_ms:.2f} ms"
        )
    return samples


def _raise_for(what: str, name: str, servers: Sequence[RunningServer]) -> NoReturn:
    """A failed run as BenchFailed with the server's last lines: the server's own failure where it has exited."""
    time.sleep(HEALTH_INTERVAL)  # a server that broke the run is usually gone a moment later
    for server in servers:
        if not server.alive():
            raise server.failure(f"died during the benchmark (exit code {server.child.returncode}); {what}")
    named = next((s for s in servers if s.spec.name == name), None)
    if named is None:
        raise BenchFailed(what)
    raise BenchFailed(what, last_lines=list(named.tail)[-TAIL_LINES:], log_file=named.log_file)


def _parse(line: str) -> dict[str, Any] | None:
    try:
        message = json.loads(line)
    except ValueError:
        return None
    return message if isinstance(message, dict) and ("id" in message or "fatal" in message) else None


def _lines(stream: IO[bytes], into: queue.Queue[str | None]) -> None:
    for raw in iter(stream.readline, b""):
        into.put(raw.decode("utf-8", "replace"))
    into.put(None)
