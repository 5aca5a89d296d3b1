"""`python ARGV` without an interpreter's start-up: a fork server for tests that run the CLI hundreds of times.

    with ForkServer() as forks:              # one fresh interpreter imports the CLI (PRELOAD), then only forks
        proc = forks.run(argv, timeout=120)   # as subprocess.run([sys.executable, *argv], capture_output=True,
                                              #                   text=True, timeout=120)

The server is this file run as a script by ForkServer (`python tests/support/forkserver.py`, as crash_runner.py
runs: the same interpreter, sys.path[0] and signal dispositions, the caller's environment and working directory,
stdout and stderr not a terminal). It imports gptoss_patch's CLI and what its commands import, and never runs a
command: each request forks a child from that pristine, single-threaded state, so no command sees what another
left (the registry's caches, the interrupt handlers' state, render's consoles). The child takes the caller's
stdin and two fresh files as fds 0-2, closes every other descriptor, takes the request's environment,
working directory and umask, and runs ARGV as `python` would (`-m MODULE ARGS...` or `SCRIPT ARGS...`, with
runpy: the same sys.argv and sys.path[0]); then it ends as an interpreter does (non-daemon threads joined, atexit
handlers, streams flushed; an uncaught KeyboardInterrupt kills it with SIGINT). The server reaps it and sends its
wait status back, so a SIGKILL reads -9 exactly as subprocess.run reports it; past `timeout` it SIGKILLs the
child and the caller gets subprocess.TimeoutExpired.

What a fork cannot give, it refuses: a request whose environment differs from the server's anywhere but
RUNTIME_ONLY (modules read some variables when imported: render's consoles read NO_COLOR, COLUMNS and TERM),
or an ARGV of another shape. Python's hash seed is the server's for every child, where fresh interpreters
would each draw one.

Bounded and always stopped: the server exits (killing its children) when its caller closes the pipe it
watches, which ForkServer.stop() does and the caller's own death does; stop() then waits at most 10 s before a
SIGKILL. A reply that does not come within `timeout` + 60 s fails the request.
"""

from __future__ import annotations

import atexit
import importlib
import json
import locale
import os
import pkgutil
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

# What `apply`, `revert` and `status` import (-X importtime, and sys.modules after a forked run), imported once by
# the server; `PKG.*` is every public module of PKG. A module left out only costs its import in each child; one
# added must be one those commands import anyway.
PRELOAD = (
    "gptoss_patch.interrupts",
    "gptoss_patch.engine.faults",
    "gptoss_patch.cli",
    "gptoss_patch.commands.apply",
    "gptoss_patch.commands.revert",
    "gptoss_patch.commands.status",
    "gptoss_patch.registry",
    "gptoss_patch.distinfo",
    "gptoss_patch.hook.installer",
    "gptoss_patch.patches._base",
    "gptoss_patch.patches._shapes",
    "gptoss_patch.patches.*",  # registry.all_specs() imports each (it is not called here: its cache stays empty)
    "libcst",
    "libcst.native",
    "libcst.helpers",
    "libcst.metadata",
    "rich.table",
    "rich._emoji_codes",
    "tomllib",
    "argparse",
    "runpy",
    "traceback",
    "logging",
)
RUNTIME_ONLY = frozenset({"PYTEST_CURRENT_TEST"})  # pytest's, which gptoss_patch never reads
HEADER = struct.Struct("!Q")
STOP_WAIT = 10.0  # seconds for the server to exit after stop(), then SIGKILL
REPLY_MARGIN = 60.0  # seconds past a request's timeout before the caller gives up on the server


@dataclass
class _Job:
    conn: socket.socket
    pidfd: int
    deadline: float
    timed_out: bool = False


# -- the server (this file as a script) ---------------------------------------------------------------------------


def _serve(listener: socket.socket, watch: int) -> None:
    """Until `watch` reaches EOF: fork a child per request, reply with its wait status."""
    dispositions = {sig: signal.getsignal(sig) for sig in signal.valid_signals() if signal.getsignal(sig) is not None}
    jobs: dict[int, _Job] = {}
    try:
        while True:
            now = time.monotonic()
            wait = max(0.0, min((j.deadline for j in jobs.values()), default=now + 3600) - now)
            ready, _, _ = select.select([listener, watch, *(j.pidfd for j in jobs.values())], [], [], wait)
            if watch in ready:
                return
            if listener in ready:
                conn, _ = listener.accept()
                _accept(conn, jobs, dispositions)
            for pid, job in list(jobs.items()):
                if job.pidfd in ready:
                    _, status = os.waitpid(pid, 0)
                    os.close(job.pidfd)
                    del jobs[pid]
                    _reply(job.conn, {"status": status, "timed_out": job.timed_out})
                elif not job.timed_out and time.monotonic() >= job.deadline:
                    job.timed_out = True
                    os.kill(pid, signal.SIGKILL)  # reaped when its pidfd says so
                    job.deadline = time.monotonic() + 3600
    finally:
        for pid, job in jobs.items():
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            job.conn.close()


def _accept(conn: socket.socket, jobs: dict[int, _Job], dispositions: Mapping[int, Any]) -> None:
    fds: list[int] = []
    owned = False  # by a job, once its child runs
    try:
        conn.settimeout(10)
        head, fds, _, _ = socket.recv_fds(conn, HEADER.size, 3)
        if len(head) != HEADER.size or len(fds) != 3:
            raise ValueError("a request is a header and three descriptors")
        (size,) = HEADER.unpack(head)
        body = b""
        while len(body) < size:
            chunk = conn.recv(size - len(body))
            if not chunk:
                raise ValueError("the request ended early")
            body += chunk
        request = json.loads(body)
        refused = _refusal(request)
        if refused:
            _reply(conn, {"refused": refused})
            return
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request, fds, dispositions)  # never returns
        jobs[pid] = _Job(conn, os.pidfd_open(pid), time.monotonic() + float(request["timeout"]))
        owned = True
    except (OSError, ValueError) as exc:
        print(f"forkserver: a request failed: {exc!r}", file=sys.stderr, flush=True)
        _reply(conn, {"refused": f"the server could not take the request: {exc!r}"})
    finally:
        for fd in fds:
            os.close(fd)
        if not owned:
            conn.close()


def _refusal(request: Mapping[str, Any]) -> str | None:
    argv = request["argv"]
    if not argv or (argv[0] == "-m" and len(argv) < 2) or (argv[0].startswith("-") and argv[0] != "-m"):
        return f"only `-m MODULE ARGS...` or `SCRIPT ARGS...` can be forked: {argv!r}"
    env = request["env"]
    differs = sorted(k for k in set(env) | set(os.environ) if k not in RUNTIME_ONLY and env.get(k) != os.environ.get(k))
    if differs:
        return f"the environment differs from the server's in {', '.join(differs)}: start one with this environment"
    return None


def _reply(conn: socket.socket, message: Mapping[str, Any]) -> None:
    try:
        conn.sendall(json.dumps(message).encode() + b"\n")
    except OSError:
        pass  # the caller gave up: nothing to tell
    finally:
        conn.close()


def _child(request: Mapping[str, Any], fds: Sequence[int], dispositions: Mapping[int, Any]) -> None:
    """In the forked child: become `python ARGV` in a fresh process, then exit as it would."""
    code = 1
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # as subprocess's close_fds: only 0-2 reach the command
        for sig, handler in dispositions.items():  # the server's own, untouched since its start: restated
            if signal.getsignal(sig) is not handler:
                signal.signal(sig, handler)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        os.umask(request["umask"])
        code = _run_as_main(request["argv"])
        _finalize()
    except BaseException:  # noqa: B036 - nothing may escape into the server's loop
        try:
            traceback.print_exc()
            sys.stderr.flush()
        finally:
            os._exit(1)
    os._exit(code)


def _run_as_main(argv: Sequence[str]) -> int:
    """`python ARGV` from here, in a fresh `__main__`: the exit status and the traceback an interpreter would give."""
    import runpy

    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        if argv[0] == "-m":
            sys.argv = ["-m", *argv[2:]]  # runpy puts the module's path first, as `python -m` does
            sys.path[0] = os.getcwd()
            runpy._run_module_as_main(argv[1], alter_argv=True)  # type: ignore[attr-defined]  # what `-m` calls
        else:
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(os.path.realpath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
        return 0
    except SystemExit as exc:
        if exc.code is None:
            return 0
        if isinstance(exc.code, int):
            return exc.code & 0xFF
        print(exc.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:  # the interpreter prints it and dies of SIGINT
        exc.__traceback__ = _from_main(exc.__traceback__, argv)
        traceback.print_exception(exc)
        _finalize()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)
        return 130
    except BaseException as exc:  # noqa: B036 - the interpreter's last handler
        exc.__traceback__ = _from_main(exc.__traceback__, argv)  # what the hook prints
        sys.excepthook(type(exc), exc, exc.__traceback__)
        return 1


def _from_main(tb: types.TracebackType | None, argv: Sequence[str]) -> types.TracebackType | None:
    """The traceback from where `python ARGV` starts it: runpy's `-m` frame, or the script's own."""
    first = tb
    while first is not None:
        code = first.tb_frame.f_code
        if code.co_name == "_run_module_as_main" if argv[0] == "-m" else (
                code.co_name == "<module>" and os.path.realpath(code.co_filename) == os.path.realpath(argv[0])):
            return first
        first = first.tb_next
    return tb


def _finalize() -> None:
    """What Py_FinalizeEx does that a command could see: threads joined, atexit handlers, streams flushed."""
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def _main() -> None:
    listener = socket.socket(fileno=int(sys.argv[1]))
    watch = int(sys.argv[2])
    preload = sys.argv[3:]
    del sys.argv[1:]
    for name in preload:
        if name.endswith(".*"):
            package = importlib.import_module(name[:-2])
            for info in pkgutil.iter_modules(package.__path__):
                if not info.name.startswith("_"):
                    importlib.import_module(f"{package.__name__}.{info.name}")
        else:
            importlib.import_module(name)
    if threading.active_count() != 1:  # fork() keeps only the calling thread: children would lose the others
        raise SystemExit(f"forkserver: the preloaded modules started threads: {threading.enumerate()}")
    _serve(listener, watch)


# -- the caller's side ----------------------------------------------------------------------------------------------


class ForkServer:
    """One server process; run() may be called from several threads at once. Stop it (or use `with`)."""

    def __init__(self, env: Mapping[str, str] | None = None, preload: Sequence[str] = PRELOAD) -> None:
        self.env = dict(os.environ if env is None else env)
        self._dir = Path(tempfile.mkdtemp(prefix="gptoss-forkserver-"))
        self.address = str(self._dir / "socket")
        self.log = self._dir / "server.log"  # the server's own stdout and stderr (quoted when a request fails)
        self._watch = -1
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        watch_r = -1
        try:
            listener.bind(self.address)
            listener.listen(64)
            watch_r, self._watch = os.pipe()
            with open(self.log, "ab") as log:
                # stdin inherited, as subprocess.run's children get it; stdout and stderr a file: not a terminal
                self.proc = subprocess.Popen(
                    [sys.executable, __file__, str(listener.fileno()), str(watch_r), *preload],
                    stdout=log, stderr=log, env=self.env, pass_fds=(listener.fileno(), watch_r),
                )
        except BaseException:
            if self._watch >= 0:
                os.close(self._watch)
            shutil.rmtree(self._dir, ignore_errors=True)
            raise
        finally:
            listener.close()  # the server holds it now: when it exits, waiting callers see the end at once
            if watch_r >= 0:
                os.close(watch_r)

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """The server kills what still runs and exits; SIGKILL after STOP_WAIT seconds. Safe to call twice."""
        if self._watch >= 0:
            os.close(self._watch)  # the server's cue: it kills its children, reaps them and exits
            self._watch = -1
        try:
            self.proc.wait(STOP_WAIT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(STOP_WAIT)
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | Path | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """As subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=timeout, env=env)."""
        args = [sys.executable, *argv]
        request = {"argv": list(argv), "env": dict(os.environ if env is None else env),
                   "cwd": str(cwd or os.getcwd()), "umask": _umask(), "timeout": timeout}
        body = json.dumps(request).encode()
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
                socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout + REPLY_MARGIN)
            conn.connect(self.address)
            socket.send_fds(conn, [HEADER.pack(len(body))], [_stdin(), out.fileno(), err.fileno()])
            conn.sendall(body)
            reply = self._reply(conn, args)
            stdout, stderr = _text(out), _text(err)
        if "refused" in reply:
            raise RuntimeError(f"forkserver refused {args!r}: {reply['refused']}")
        if reply["timed_out"]:
            raise subprocess.TimeoutExpired(args, timeout, output=stdout, stderr=stderr)
        return subprocess.CompletedProcess(args, os.waitstatus_to_exitcode(reply["status"]), stdout, stderr)

    def _reply(self, conn: socket.socket, args: list[str]) -> dict[str, Any]:
        data = b""
        try:
            while not data.endswith(b"\n"):
                chunk = conn.recv(4096)
                if not chunk:
                    break
                data += chunk
        except TimeoutError:
            raise RuntimeError(f"forkserver: no reply for {args!r} in time{self._log_tail()}") from None
        if not data.endswith(b"\n"):
            raise RuntimeError(f"forkserver: the server ended without a reply for {args!r}{self._log_tail()}")
        reply: dict[str, Any] = json.loads(data)
        return reply

    def _log_tail(self) -> str:
        try:
            tail = self.log.read_text(errors="replace")[-2000:]
        except OSError:
            return ""
        state = f"exit {self.proc.returncode}" if self.proc.poll() is not None else "running"
        return f" (server {state}; its log: {tail.strip() or 'empty'})"


def _umask() -> int:
    """This process's umask, read without setting it (os.umask would race with other threads)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Umask:"):
            return int(line.split()[1], 8)
    raise RuntimeError("no Umask line in /proc/self/status")


def _stdin() -> int:
    """fd 0, which subprocess.run's child inherits (open, or the run must fail as the real one would not)."""
    os.fstat(0)
    return 0


def _text(stream: IO[bytes]) -> str:
    """The bytes as subprocess.run(text=True) decodes them: the locale's encoding, universal newlines."""
    stream.seek(0)
    data = stream.read().decode(locale.getpreferredencoding(False))
    return data.replace("\r\n", "\n").replace("\r", "\n")


if __name__ == "__main__":
    _main()
