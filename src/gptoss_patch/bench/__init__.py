"""`gptoss-patch bench`: the launcher's profile against plain `vllm serve`, measured side by side with vLLM's own benchmark.

Both servers run at once on one machine (each with its share of memory; the second starts once the
first has sized its KV cache), and every round drives them
in turn, alternating which goes first, with identical requests (`vllm bench serve`: random dataset,
fixed input and output lengths, `ignore_eos`, the completions endpoint). The figures are medians over
the rounds with their spread, so a difference smaller than the spread reads as noise.

Engine only: results come back as data (BenchReport); commands/bench.py prints. Every server and the
benchmark driver run in their own process group with a parent-death signal, and every exit path stops
them all.
"""

from __future__ import annotations

import collections
import json
import os
import queue
import re
import shlex
import signal
import socket
import statistics
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from gptoss_patch.errors import CheckFailed, UsageError

DRIVER = Path(__file__).with_name("driver.py")
COMPARISONS = ("vanilla", "eager")
DEFAULT_CONCURRENCY = (1, 2, 4, 5, 8, 10, 16, 32, 64)
TAIL_LINES = 15  # a failed server's last log lines, shown with the error
HEALTH_INTERVAL = 1.0
SHARED_MEMORY_UTILIZATION = "0.44"  # each of two servers on one GPU (vLLM's default is 0.9 for one)
# vLLM's log lines once it has sized its KV cache (GPU worker; the scheduler's, also on CPU).
KV_CACHE_SIZED = ("Available KV cache memory", "GPU KV cache size")


class BenchFailed(CheckFailed):
    """A server or the benchmark failed: one line, plus the server's last log lines for the caller to show."""

    def __init__(self, message: str, *, last_lines: Sequence[str] = (), log_file: Path | None = None) -> None:
        super().__init__(message, hint=f"log: {log_file}" if log_file else None)
        self.last_lines = tuple(last_lines)
        self.log_file = log_file


@dataclass(frozen=True)
class ServerSpec:
    """One server to start: `name` is profile, vanilla, eager or a --variant's NAME."""

    name: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(repr=False)
    port: int
    served_model: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def command_line(self) -> str:
        return " ".join(self.argv)


@dataclass(frozen=True)
class Workload:
    """What each `vllm bench serve` run sends: fixed lengths, `waves` prompts per concurrent stream."""

    model: str  # tokenizer path for the random dataset (the model directory or id)
    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    repeat: int = 3
    input_len: int = 128
    output_len: int = 256
    waves: int = 2
    min_prompts: int = 2

    def prompts(self, concurrency: int) -> int:
        return max(self.min_prompts, self.waves * concurrency)


@dataclass(frozen=True)
class Run:
    """One `vllm bench serve` call in the schedule."""

    id: str
    server: str
    concurrency: int
    round: int


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


@dataclass
class BenchReport:
    servers: list[dict[str, Any]]
    workload: dict[str, Any]
    rows: list[Row]
    samples: list[Sample]
    bench_argv: list[str]
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {
            "servers": self.servers,
            "workload": self.workload,
            "rows": [asdict(row) for row in self.rows],
            "samples": [asdict(sample) for sample in self.samples],
            "bench_command": self.bench_argv,
            "seconds": round(self.seconds, 1),
        }


# -- the plan: what runs, in which order ------------------------------------------------------------


def parse_compare(text: str | None) -> tuple[str, ...]:
    if not text:
        return ()
    names = tuple(dict.fromkeys(item.strip() for item in text.split(",")))
    unknown = [n for n in names if n not in COMPARISONS]
    if unknown or not names:
        raise UsageError(f"--compare {text!r}: expected {' or '.join(COMPARISONS)} (comma-separated for both)")
    return names


def require_bench(package_root: Path, python: str) -> None:
    """`vllm bench serve` is vllm/benchmarks/serve.py (read statically, before any server starts)."""
    if not (Path(package_root) / "benchmarks" / "serve.py").is_file():
        raise BenchFailed(
            f"vllm bench serve is not available in {python}: no vllm/benchmarks/serve.py in {package_root}"
        )


def check_repeat(repeat: int) -> int:
    if repeat < 1:
        raise UsageError(f"--repeat {repeat}: expected 1 or more rounds")
    return repeat


def schedule(servers: Sequence[str], workload: Workload) -> list[Run]:
    """Every round visits each concurrency once and runs each server at it; the order of the servers alternates
    (rotates, for three) from one concurrency and round to the next, so neither is always first."""
    runs = []
    step = 0
    for round_ in range(workload.repeat):
        for concurrency in workload.concurrency:
            shift = step % len(servers)
            for name in (*servers[shift:], *servers[:shift]):
                runs.append(Run(f"r{round_}-c{concurrency}-{name}", name, concurrency, round_))
            step += 1
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


# -- figures --------------------------------------------------------------------------------------


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
                overlap = row.generation.low <= other.generation.high and other.generation.low <= row.generation.high
                row = Row(
                    **{
                        **row.__dict__,
                        "ratio": row.generation.median / other.generation.median,
                        "within_spread": overlap,
                    }
                )
            ordered.append(row)
    return ordered


VARIANT_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,31}")


def parse_variants(texts: Sequence[str], taken: Sequence[str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """`NAME=ARGS` items: the profile server again with ARGS (shell words) added, named NAME."""
    variants: dict[str, tuple[str, ...]] = {}
    for text in texts:
        name, sep, words = text.partition("=")
        name = name.strip()
        if not sep or not VARIANT_NAME.fullmatch(name):
            raise UsageError(
                f"--variant {text!r}: expected NAME=ARGS, NAME in lower-case letters, digits, '_', '-', '.'"
            )
        if name in ("profile", *COMPARISONS, *taken, *variants):
            raise UsageError(f"--variant {text!r}: the name {name!r} is already a server of this run")
        try:
            args = tuple(shlex.split(words))
        except ValueError as exc:
            raise UsageError(f"--variant {text!r}: {exc}") from None
        if not args:
            raise UsageError(f"--variant {text!r}: no arguments after '='")
        variants[name] = args
    return tuple(variants.items())


# -- servers ----------------------------------------------------------------------------------------


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


class RunningServer:
    """A started server: its log goes to a file and a tail; /health says when it is ready."""

    def __init__(self, spec: ServerSpec, log_file: Path) -> None:
        from gptoss_patch.launcher import runner

        self.spec = spec
        self.log_file = log_file
        self.tail: collections.deque[str] = collections.deque(maxlen=200)
        self.memory_settled = False
        log_file.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_file, "a", encoding="utf-8")  # noqa: SIM115 - closed in stop()
        self.child = _spawn(list(spec.argv), spec.env, stdout=subprocess.PIPE)
        self._pump = threading.Thread(target=self._read, args=(self.child.stdout,), daemon=True)
        self._pump.start()
        self._stop = runner.stop
        self.ready_after: float | None = None
        self.started = time.monotonic()

    def _read(self, stream: IO[bytes]) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace")
            self._log.write(line)
            self._log.flush()
            self.tail.append(line.rstrip("\n"))
            if any(marker in line for marker in KV_CACHE_SIZED):
                self.memory_settled = True

    def alive(self) -> bool:
        return self.child.poll() is None

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.spec.url + "/health", timeout=2) as response:  # noqa: S310 - our own loopback URL
                return bool(response.status == 200)
        except OSError:
            return False

    def failure(self, what: str) -> BenchFailed:
        return BenchFailed(
            f"{self.spec.name} server ({self.spec.url}) {what}",
            last_lines=list(self.tail)[-TAIL_LINES:],
            log_file=self.log_file,
        )

    def stop(self) -> None:
        self._stop(self.child)
        self._pump.join(timeout=5)
        if self.child.stdout:
            self.child.stdout.close()
        self._log.close()


def _spawn(argv: list[str], env: dict[str, str], *, stdout: int, stdin: int = subprocess.DEVNULL) -> subprocess.Popen:
    from gptoss_patch.errors import TargetError
    from gptoss_patch.launcher import runner

    try:
        return subprocess.Popen(
            argv, env=env, stdin=stdin, stdout=stdout, stderr=subprocess.STDOUT if stdout == subprocess.PIPE else None,
            start_new_session=True, preexec_fn=runner._parent_death_signal(),
        )  # fmt: skip
    except OSError as exc:
        raise TargetError(f"cannot start {argv[0]}: {exc.strerror or exc}") from None


def _wait_memory_settled(server: RunningServer, deadline: float) -> None:
    """The next server starts once this one has sized its KV cache (or is ready): vLLM sizes the cache from
    the memory it sees used while profiling, so two servers profiling at once would count each other's."""
    while time.monotonic() < deadline:
        if not server.alive():
            raise server.failure(f"exited with code {server.child.returncode} before it was ready")
        if server.memory_settled or server.healthy():
            return
        time.sleep(HEALTH_INTERVAL)
    raise server.failure("was not ready in time")


def wait_ready(servers: Sequence[RunningServer], timeout: float, notify: Callable[[str], None]) -> None:
    """All servers answer /health, or the first that exits (or the timeout) is an error."""
    waiting = list(servers)
    deadline = time.monotonic() + timeout
    while waiting:
        for server in list(waiting):
            if not server.alive():
                raise server.failure(f"exited with code {server.child.returncode} before it was ready")
            if server.healthy():
                server.ready_after = time.monotonic() - server.started
                notify(f"{server.spec.name} server ready after {server.ready_after:.0f} s")
                waiting.remove(server)
        if waiting and time.monotonic() > deadline:
            raise waiting[0].failure(f"was not ready after {timeout:.0f} s")
        if waiting:
            time.sleep(HEALTH_INTERVAL)


# -- the run --------------------------------------------------------------------------------------


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
) -> BenchReport:
    """Start every server, wait until all are ready, run the schedule, stop everything; the report."""
    for spec in specs:
        if not port_free(spec.port):
            raise UsageError(f"port {spec.port} ({spec.name} server) is in use; pass --port to choose another")
    started = time.monotonic()
    names = [spec.name for spec in specs]
    runs = schedule(names, workload)
    by_name = {spec.name: spec for spec in specs}
    servers: list[RunningServer] = []
    driver: subprocess.Popen | None = None
    with _terminating_as_interrupt():
        try:
            deadline = time.monotonic() + start_timeout
            for spec in specs:
                if servers:
                    _wait_memory_settled(servers[-1], deadline)
                servers.append(RunningServer(spec, log_dir / f"{spec.name}.log"))
                notify(f"started {spec.name} server (pid {servers[-1].child.pid}): {spec.command_line}")
            wait_ready(servers, max(1.0, deadline - time.monotonic()), notify)
            warmup = [Run(f"warmup-{name}", name, 1, -1) for name in names]
            payload = [{"id": r.id, "argv": bench_argv(by_name[r.server], _warmup(workload), 1, 0)} for r in warmup]
            payload += [
                {"id": r.id, "argv": bench_argv(by_name[r.server], workload, r.concurrency, r.round)} for r in runs
            ]
            driver = _spawn([python, str(DRIVER)], dict(os.environ), stdout=subprocess.PIPE, stdin=subprocess.PIPE)
            samples = _drive(driver, payload, {r.id: r for r in runs}, servers, run_timeout, notify)
        finally:
            if driver is not None:
                from gptoss_patch.launcher import runner

                runner.stop(driver, grace=5)
            for server in servers:
                server.stop()
    return BenchReport(
        servers=[
            {"name": s.spec.name, "command": list(s.spec.argv), "ready_seconds": s.ready_after, "log": str(s.log_file)}
            for s in servers
        ],
        workload=asdict(workload),
        rows=summarize(samples, names, variants),
        samples=samples,
        bench_argv=["vllm", "bench", "serve", *bench_argv(specs[0], workload, workload.concurrency[0], 0)],
        seconds=time.monotonic() - started,
    )


def _warmup(workload: Workload) -> Workload:
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
        if "error" in message:
            _raise_for(message, runs, servers)
        run_ = runs.get(str(message["id"]))
        if run_ is None:
            continue  # a warm-up
        sample = sample_from(message.get("result") or {}, run_)
        samples.append(sample)
        notify(
            f"round {run_.round + 1} c={run_.concurrency} {run_.server}: {sample.generation:.1f} tok/s, TPOT {sample.tpot_ms:.2f} ms"
        )
    return samples


def _raise_for(message: dict[str, Any], runs: dict[str, Run], servers: Sequence[RunningServer]) -> None:
    time.sleep(HEALTH_INTERVAL)  # a server that broke the run is usually gone a moment later
    for server in servers:
        if not server.alive():
            raise server.failure(f"died during the benchmark (exit code {server.child.returncode})")
    run_ = runs.get(str(message.get("id")))
    name = run_.server if run_ else str(message.get("id")).rsplit("-", 1)[-1]
    named = next((s for s in servers if s.spec.name == name), None)
    what = f"vllm bench serve failed against the {name} server: {message['error']}"
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


class _terminating_as_interrupt:
    """SIGTERM/SIGHUP during a bench unwind like Ctrl-C, so the finally stops every server."""

    def __enter__(self) -> None:
        self.previous: dict[int, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGHUP):
            self.previous[sig] = signal.signal(sig, self._raise)

    @staticmethod
    def _raise(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    def __exit__(self, *_exc: object) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
