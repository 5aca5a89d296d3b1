"""tests/support/forkserver.py: a forked child is `python ARGV`, starts from the pristine server, and is bounded.

Offline and cheap (a server preloads only what each test needs). That the fork path gives the CLI's real
results is tested on the real vllm 0.17.1 by tests/engine/test_faults.py::test_a_forked_run_is_a_real_run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support.forkserver import ForkServer

SCRIPT = """\
import os, signal, sys
print(sys.argv, sys.path[0], os.getcwd(), os.environ.get("FORKSERVER_TEST"), __name__, __file__, oct(os.umask(0)))
print("to stderr", sys.stderr.isatty(), sys.stdout.isatty(), signal.getsignal(signal.SIGINT), file=sys.stderr)
what = sys.argv[1] if len(sys.argv) > 1 else ""
if what == "raise":
    def inner():
        raise ValueError("from the script")
    inner()
if what == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
if what == "interrupt":
    raise KeyboardInterrupt
if what == "sleep":
    open(sys.argv[2], "w").write(str(os.getpid()))
    import time
    time.sleep(60)
raise SystemExit(int(what) if what.isdigit() else what or None)
"""


def gone(pid: int, within: float = 10) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.02)
    return False


@pytest.fixture
def script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("FORKSERVER_TEST", "per request")
    path = tmp_path / "script.py"
    path.write_text(SCRIPT)
    return str(path)


def test_a_forked_child_is_python_argv(script, tmp_path):
    """argv, sys.path[0], cwd, environment, __main__, umask, streams, signal handlers, exit codes and tracebacks
    as a fresh interpreter has them (a script and `-m`), four requests at once."""
    module = tmp_path / "failing_module.py"
    module.write_text("def f():\n    raise RuntimeError('from -m')\nf()\n")
    runs = [[script], [script, "3"], [script, "a message"], [script, "raise"], [script, "kill"], [script, "interrupt"],
            ["-m", "failing_module"], ["-m", "gptoss_patch", "--version"], ["-m", "gptoss_patch", "no-such-command"]]
    with ForkServer(preload=("gptoss_patch.cli",)) as forks:
        def both(argv: list[str]) -> tuple[object, object]:
            forked = forks.run(argv, cwd=tmp_path, timeout=60)
            real = subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=tmp_path, timeout=60)
            return ((forked.args, forked.returncode, forked.stdout, forked.stderr),
                    (real.args, real.returncode, real.stdout, real.stderr))

        threads = []
        results: dict[int, tuple[object, object]] = {}
        for index, argv in enumerate(runs):
            threads.append(threading.Thread(target=lambda i=index, a=argv: results.__setitem__(i, both(a))))
            threads[-1].start()
        for thread in threads:
            thread.join(120)
    assert len(results) == len(runs)
    codes = [results[i][1][1] for i in range(len(runs))]  # type: ignore[index]
    assert codes == [0, 3, 1, 1, -signal.SIGKILL, -signal.SIGINT, 1, 0, 2], codes
    for index, argv in enumerate(runs):
        forked, real = results[index]
        assert forked == real, argv
    assert "from the script" in results[3][1][3] and "to stderr False False" in results[0][1][3]  # type: ignore[index]


def test_every_child_starts_from_the_pristine_server(tmp_path):
    """What one command leaves in module state (caches, the interrupts' record, handlers) never reaches the next."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import signal\nfrom gptoss_patch import interrupts, registry\n"
        "print(interrupts.received(), registry.all_specs.cache_info().currsize,\n"
        "      signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)\n"
        "registry.all_specs()\ninterrupts.install()\ninterrupts._handler(signal.SIGTERM, None)\n"
        "print(interrupts.received(), registry.all_specs.cache_info().currsize)\n"
    )
    with ForkServer(preload=("gptoss_patch.interrupts", "gptoss_patch.registry")) as forks:
        first, second = (forks.run([str(probe)], timeout=60) for _ in range(2))
    fresh = subprocess.run([sys.executable, str(probe)], capture_output=True, text=True, timeout=60)
    assert first.returncode == second.returncode == fresh.returncode == 0, (first.stderr, fresh.stderr)
    assert first.stdout == second.stdout == fresh.stdout
    assert first.stdout.splitlines()[0] == "None 0 True" and first.stdout.splitlines()[1] == "15 1"


def test_a_request_the_fork_cannot_make_faithful_is_refused(script, monkeypatch):
    """Another environment (modules read some of it when imported) or a command line other than a script or -m."""
    with ForkServer(preload=()) as forks:
        assert forks.run([script]).returncode == 0
        monkeypatch.setenv("NO_COLOR", "")
        with pytest.raises(RuntimeError, match="environment differs from the server's in NO_COLOR"):
            forks.run([script])
        with pytest.raises(RuntimeError, match="only `-m MODULE ARGS...` or `SCRIPT ARGS...`"):
            forks.run(["-c", "pass"], env=forks.env)


def test_a_child_past_its_timeout_is_killed_and_stop_ends_the_server_and_its_children(script, tmp_path):
    forks = ForkServer(preload=())
    try:
        started = time.monotonic()
        with pytest.raises(subprocess.TimeoutExpired):
            forks.run([script, "sleep", str(tmp_path / "timed-out.pid")], timeout=1)
        assert time.monotonic() - started < 30 and gone(int((tmp_path / "timed-out.pid").read_text()))
        left: list[BaseException] = []

        def still_running_at_stop() -> None:
            try:
                forks.run([script, "sleep", str(tmp_path / "left.pid")])
            except RuntimeError as exc:
                left.append(exc)

        running = threading.Thread(target=still_running_at_stop)
        running.start()
        deadline = time.monotonic() + 30
        while not (tmp_path / "left.pid").exists() or not (tmp_path / "left.pid").read_text():
            assert time.monotonic() < deadline, "the child never started"
            time.sleep(0.02)
    finally:
        forks.stop()
    running.join(30)
    assert forks.proc.returncode == 0 and gone(int((tmp_path / "left.pid").read_text()))
    assert left and "ended without a reply" in str(left[0]) and not Path(forks.address).parent.exists()
