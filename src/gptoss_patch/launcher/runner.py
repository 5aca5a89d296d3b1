"""Run `vllm serve` as a supervised child: forward signals, tee its log, watch it, and never leave it behind.

The child gets its own process group (so SIGINT/SIGTERM reach vLLM's engine and worker processes as one
group, and only when we forward them) and, on Linux, a parent-death signal (so even a SIGKILL of the
launcher takes vLLM down). Every exit path stops the whole group before returning.

The one owner of server processes: `start` (own process group, parent-death signal), `stop` (the group,
bounded) and `wait_healthy` (/health through launcher/http.py, never a proxy) serve `serve`, `bench` and
the tests' servers alike.
"""

from __future__ import annotations

import collections
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

from gptoss_patch.errors import TargetError
from gptoss_patch.launcher import knowledge, sentinel
from gptoss_patch.launcher.results import LaunchPlan, RunOutcome, SmokeReport

HEALTH_INTERVAL = 0.5  # seconds between /health probes while vLLM loads
STOP_GRACE = 15.0  # vLLM shuts its engine processes down on SIGTERM; SIGKILL after this
ORPHAN_GRACE = 5.0  # after vLLM exits, how long its leftovers may keep the log pipe open
TAIL_LINES = 30  # printed after a crash
DIAGNOSIS_LINES = 200  # searched for a known issue's signature
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


@dataclass(frozen=True)
class Hooks:
    """How the caller (commands/serve.py) sees the run; the runner itself never prints."""

    echo: Callable[[str], None]  # one line of vLLM's log, newline included
    notify: Callable[[str], None]  # the launcher's own narration
    smoke: Callable[[], SmokeReport] | None = None  # run once, when /health first answers


class _Run:
    """Mutable state shared by the log pump, the health probe and the supervising loop."""

    def __init__(self, child: subprocess.Popen, plan: LaunchPlan) -> None:
        self.child = child
        self.plan = plan
        self.events: queue.Queue[tuple[str, object]] = queue.Queue()
        self.tail: collections.deque[str] = collections.deque(maxlen=DIAGNOSIS_LINES)
        self.finished = threading.Event()
        self.started = time.monotonic()
        self.signals: list[int] = []
        self.backend: str | None = None
        self.ready_after: float | None = None
        self.stopped_for: str | None = None
        self.smoke: SmokeReport | None = None


def run(plan: LaunchPlan, *, log_file: Path, health_url: str, hooks: Hooks) -> RunOutcome:
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "a", encoding="utf-8") as log:
        child = spawn(plan)
        hooks.notify(f"Started vLLM (pid {child.pid}): {plan.command_line}")
        state = _Run(child, plan)
        pump = _start(_pump_log, state, child.stdout, log, hooks.echo)
        try:
            with _forwarding_signals(state):
                _start(_probe_health, state, health_url)
                _supervise(state, hooks)
        finally:
            state.finished.set()
            stop(child)
            pump.join(timeout=5)  # the group is gone, so the pipe is at EOF
            if child.stdout is not None:
                child.stdout.close()
    return _outcome(state, log_file)


def default_log_file() -> Path:
    """A new file per run in the cache root's logs/ (`cache clean` keeps them unless --all)."""
    from gptoss_patch import paths

    stamp = time.strftime("%Y%m%d-%H%M%S")
    return paths.log_dir() / f"vllm-serve-{stamp}-{os.getpid()}.log"


def spawn(plan: LaunchPlan) -> subprocess.Popen:
    return start(plan.argv, plan.env, name=str(plan.executable))


def start(
    argv: Sequence[str],
    env: Mapping[str, str] | None,
    *,
    stdout: int | IO[Any] = subprocess.PIPE,
    stdin: int = subprocess.DEVNULL,
    name: str | None = None,
) -> subprocess.Popen:
    """Start a server (or the bench driver) in a process group of its own, stderr merged into stdout, with a
    parent-death signal, and `env` through `loopback_env`; `stop` takes the whole group down. TargetError
    (naming `name`, else argv[0]) if it cannot start."""
    try:
        return subprocess.Popen(
            list(argv),
            env=loopback_env(os.environ if env is None else env),
            stdin=stdin,
            stdout=stdout,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=parent_death_signal(),
        )
    except OSError as exc:
        raise TargetError(f"cannot start {name or argv[0]}: {exc.strerror or exc}") from None


def bind_problem(host: str, port: int) -> str | None:
    """Why a server could not listen on host:port now, or None; SO_REUSEADDR so TIME_WAIT is no false alarm.

    The one answer to "is this port free": pre-flight (serve, doctor) and bench / numerics (bench/servers.py) ask here."""
    import errno
    import socket

    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        return f"cannot resolve {host} ({exc.strerror})"
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            return "the port is in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
    return None


NO_PROXY_HOSTS = ("127.0.0.1", "localhost")  # the servers the tool starts listen on loopback


def loopback_env(env: Mapping[str, str]) -> dict[str, str]:
    """`env` with no_proxy and NO_PROXY extended by 127.0.0.1 and localhost (the user's entries of both kept, first).

    Every process `start` runs (vLLM itself, bench's driver: vLLM's own benchmark client in the target
    interpreter) talks to our loopback servers with clients that honour http_proxy; a company proxy cannot
    reach 127.0.0.1, so without this every benchmark request would fail. launcher/http.py does the same for
    the tool's own requests."""
    entries: list[str] = []
    for name in ("no_proxy", "NO_PROXY"):  # one list for both: clients differ in which of the two wins
        entries += [e.strip() for e in env.get(name, "").split(",") if e.strip() and e.strip() not in entries]
    merged = ",".join([*entries, *(h for h in NO_PROXY_HOSTS if h not in entries)])
    return {**env, "no_proxy": merged, "NO_PROXY": merged}


def wait_healthy(
    health_url: str,
    child: subprocess.Popen,
    *,
    timeout: float | None = None,
    interval: float = HEALTH_INTERVAL,
    cancel: threading.Event | None = None,
) -> float | None:
    """Poll `health_url` until it answers 200: the seconds waited. None if `child` exited, `timeout` passed or
    `cancel` was set first (the caller tells which from `child.poll()`)."""
    from gptoss_patch.launcher import http  # here, after vLLM started: urllib costs ~25 ms of time-to-exec

    started = time.monotonic()
    while not (cancel is not None and cancel.is_set()) and child.poll() is None:
        if http.healthy(health_url):
            return time.monotonic() - started
        if timeout is not None and time.monotonic() - started > timeout:
            return None
        if cancel is not None:
            cancel.wait(interval)
        else:
            time.sleep(interval)
    return None


def parent_death_signal(signum: int = signal.SIGTERM) -> Callable[[], None] | None:
    """prctl(PR_SET_PDEATHSIG, signum), to call in a child (vLLM, a test lane): the kernel sends it `signum` when its
    parent dies, even by SIGKILL. None where Linux's prctl is missing. libc is resolved here, in the parent: a child
    between fork and exec runs only the call."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(PR_SET_PDEATHSIG, signum)


def _start(target: Callable[..., None], *args: object) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    return thread


# -- watching ------------------------------------------------------------------------------------


def _pump_log(state: _Run, stream: IO[bytes], log: IO[str], echo: Callable[[str], None]) -> None:
    """Tee every line to the terminal and the log file; report the MoE backend line when it passes."""
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", "replace")
        echo = _echo_safely(echo, line)
        log.write(line)
        log.flush()
        state.tail.append(line.rstrip("\n"))
        backend = sentinel.moe_backend_in(line)
        if backend is not None:
            state.events.put(("backend", backend))
    state.events.put(("eof", None))


def _echo_safely(echo: Callable[[str], None], line: str) -> Callable[[str], None]:
    """A closed terminal (`serve | head`, a dropped ssh) must not stop the pump: vLLM would block on a full
    pipe. Echoing stops; the log file keeps everything."""
    try:
        echo(line)
    except (OSError, ValueError):
        return lambda _line: None
    return echo


def _probe_health(state: _Run, url: str) -> None:
    if wait_healthy(url, state.child, cancel=state.finished) is not None:
        state.events.put(("ready", time.monotonic() - state.started))


def _supervise(state: _Run, hooks: Hooks) -> None:
    log_done = False
    exited_at: float | None = None
    while not (log_done and state.child.poll() is not None):
        if state.child.poll() is not None:
            exited_at = exited_at or time.monotonic()
            if time.monotonic() - exited_at > ORPHAN_GRACE:
                return  # vLLM exited but a leftover process holds its log pipe; stop() takes the group down
        try:
            kind, detail = state.events.get(timeout=0.2)
        except queue.Empty:
            continue
        if kind == "eof":
            log_done = True
        elif kind == "backend":
            _on_backend(state, str(detail), hooks)
        elif kind == "ready":
            _on_ready(state, cast(float, detail), hooks)


def _on_backend(state: _Run, backend: str, hooks: Hooks) -> None:
    state.backend = backend
    expected = state.plan.expected_moe
    if not sentinel.contradicts(backend, expected):
        hooks.notify(f"MoE backend: {backend}" + (f" (as pinned by the {state.plan.profile} profile)" if expected else ""))
        return
    state.stopped_for = (
        f"vLLM selected the {backend} MXFP4 MoE backend, but the {state.plan.profile} profile pinned {expected} (G14)"
    )
    hooks.notify(f"Stopping vLLM: {state.stopped_for}")
    _signal_group(state.child, signal.SIGTERM)


def _on_ready(state: _Run, after: float, hooks: Hooks) -> None:
    state.ready_after = after
    hooks.notify(f"Ready: /health answered after {after:.1f} s")
    if hooks.smoke is None or state.stopped_for:
        return
    state.smoke = hooks.smoke()
    if not state.smoke.ok and state.child.poll() is None:
        state.stopped_for = "the smoke canary failed"
        _signal_group(state.child, signal.SIGTERM)


# -- signals and stopping ------------------------------------------------------------------------


@contextmanager
def _forwarding_signals(state: _Run) -> Iterator[None]:
    """SIGINT/SIGTERM/SIGHUP go to vLLM's process group; a second one of them kills the group."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def forward(signum: int, _frame: object) -> None:
        state.signals.append(signum)
        _signal_group(state.child, signal.SIGKILL if len(state.signals) > 1 else signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def stop(child: subprocess.Popen, grace: float | None = None) -> None:
    """Stop the child and everything in its process group: SIGTERM, then SIGKILL after `grace` seconds."""
    grace = STOP_GRACE if grace is None else grace
    if child.poll() is None:
        _signal_group(child, signal.SIGTERM)
        try:
            child.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            _signal_group(child, signal.SIGKILL)
            child.wait()
    _reap_group(child.pid, grace)


def _reap_group(pgid: int, grace: float) -> None:
    """vLLM's engine and worker processes may outlive the API server; they share its group."""
    deadline = time.monotonic() + grace
    sent_term = False
    while _group_alive(pgid):
        if time.monotonic() > deadline:
            _killpg(pgid, signal.SIGKILL)
            return
        if not sent_term:
            _killpg(pgid, signal.SIGTERM)
            sent_term = True
        time.sleep(0.05)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_group(child: subprocess.Popen, signum: int) -> None:
    _killpg(child.pid, signum)


def _killpg(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


# -- outcome -------------------------------------------------------------------------------------


def _outcome(state: _Run, log_file: Path) -> RunOutcome:
    code = state.child.returncode
    exit_code = 128 - code if code < 0 else code  # killed by signal N -> 128 + N, like a shell
    crashed = exit_code != 0 and state.stopped_for is None and not state.signals
    tail = list(state.tail)
    return RunOutcome(
        exit_code=exit_code,
        log_file=log_file,
        ready_after=state.ready_after,
        moe_backend=state.backend,
        stopped_for=state.stopped_for,
        last_lines=tuple(tail[-TAIL_LINES:]) if crashed else (),
        known_issue=knowledge.diagnose(tail) if crashed else None,
        smoke=state.smoke,
        signal=state.signals[0] if state.signals else None,
    )
