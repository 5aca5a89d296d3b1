"""The servers of a bench run: started (launcher/runner.py: own process group, parent-death signal), their log
teed to a file and a tail, /health polled through launcher/http.py (never a proxy), stopped with their group."""

from __future__ import annotations

import collections
import re
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

from gptoss_patch.bench.spec import BenchFailed, ServerSpec
from gptoss_patch.errors import UsageError

TAIL_LINES = 15  # a failed server's last log lines, shown with the error
HEALTH_INTERVAL = 1.0
# vLLM's log lines once it has sized its KV cache (GPU worker; the scheduler's, also on CPU).
KV_CACHE_SIZED = ("Available KV cache memory", "GPU KV cache size")
KV_CACHE_GIB = re.compile(r"Available KV cache memory: ([0-9.]+) GiB")
KV_CACHE_TOKENS = re.compile(r"GPU KV cache size: ([0-9,]+) tokens")


def kv_cache_of(line: str) -> tuple[str, float] | None:
    """("gib", 4.2) or ("tokens", 123456.0) from one of vLLM's KV-cache sizing lines, else None."""
    found = KV_CACHE_GIB.search(line)
    if found:
        return "gib", float(found.group(1))
    found = KV_CACHE_TOKENS.search(line)
    if found:
        return "tokens", float(found.group(1).replace(",", ""))
    return None


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could listen there now: pre-flight's one answer (a port in TIME_WAIT is free)."""
    from gptoss_patch.launcher.runner import bind_problem

    return bind_problem(host, port) is None


def check_ports(specs: Sequence[ServerSpec]) -> None:
    """Every server's port is free (before anything starts: a port in use is the user's to change)."""
    for spec in specs:
        if not port_free(spec.port):
            raise UsageError(f"port {spec.port} ({spec.name} server) is in use; pass --port to choose another")


class RunningServer:
    """A started server: its log goes to a file and a tail; /health says when it is ready."""

    def __init__(self, spec: ServerSpec, log_file: Path) -> None:
        from gptoss_patch.launcher import runner

        self.spec = spec
        self.log_file = log_file
        self.tail: collections.deque[str] = collections.deque(maxlen=200)
        self.memory_settled = False
        self.kv_cache: dict[str, float] = {}  # "gib" / "tokens" as logged; the smallest over the ranks
        log_file.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_file, "a", encoding="utf-8")  # noqa: SIM115 - closed in stop()
        self.child = runner.start(spec.argv, spec.env, stdout=subprocess.PIPE)
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
                sized = kv_cache_of(line)
                if sized is not None:
                    kind, value = sized
                    self.kv_cache[kind] = min(value, self.kv_cache.get(kind, value))

    def alive(self) -> bool:
        return self.child.poll() is None

    def healthy(self) -> bool:
        """/health answers 200, asked directly: an http_proxy of the environment never sees loopback."""
        from gptoss_patch.launcher import http

        return http.healthy(self.spec.url + "/health")

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


def wait_memory_settled(server: RunningServer, deadline: float) -> None:
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


def start_side_by_side(
    specs: Sequence[ServerSpec], log_dir: Path, start_timeout: float, notify: Callable[[str], None], into: list[RunningServer]
) -> None:
    """Start each server once the one before has sized its KV cache (servers sharing a GPU would otherwise size
    theirs against each other), then wait until all answer /health. Each is appended to `into` as it starts, so
    the caller's `finally` stops every one that started, also when a later start fails."""
    deadline = time.monotonic() + start_timeout
    for spec in specs:
        if into:
            wait_memory_settled(into[-1], deadline)
        into.append(RunningServer(spec, log_dir / f"{spec.name}.log"))
        notify(f"started {spec.name} server (pid {into[-1].child.pid}): {spec.command_line}")
    wait_ready(into, max(1.0, deadline - time.monotonic()), notify)
