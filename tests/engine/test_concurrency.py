"""Concurrent runs on one real vllm 0.17.1 install: one writer at a time, waits that end, no stale lock.

The CLI runs in real processes (tests/support/crash_runner.py, which logs each named step with its pid and a
monotonic timestamp to a shared trace). Mutual exclusion is proven from that trace: the intervals
between `lock-acquired` and `lock-released` of different processes never overlap. The lock is an
flock on the .dist-info directory, so a killed holder's lock is released by the kernel; the last
test shows it with /proc/locks and a non-blocking flock from the test itself.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.cli import states
from tests.support.safety import (
    KILLED,
    Reference,
    assert_patched,
    assert_pristine,
    changed,
    contents,
    describe,
    dist_info,
    gptoss,
    ledger_dir,
    notices,
    print_line,
    spawn,
)

pytestmark = pytest.mark.upstream
COUNT = 8
TIMEOUT = 120


@dataclass(frozen=True)
class Event:
    step: str
    pid: int
    ns: int


def events(trace: Path) -> list[Event]:
    rows = [line.split("\t") for line in trace.read_text().splitlines()]
    return [Event(r[0], int(r[2]), int(r[3])) for r in rows]


def lock_intervals(trace: Path) -> list[tuple[int, int, int]]:
    """(acquired ns, released ns, pid) for every lock a process held, in acquisition order."""
    acquired: dict[int, int] = {}
    spans = []
    for e in events(trace):
        if e.step == "lock-acquired":
            assert e.pid not in acquired, f"process {e.pid} took the lock twice"
            acquired[e.pid] = e.ns
        elif e.step == "lock-released":
            spans.append((acquired.pop(e.pid), e.ns, e.pid))
    assert not acquired, f"processes {sorted(acquired)} never released the lock"
    return sorted(spans)


def assert_one_holder_at_a_time(spans: list[tuple[int, int, int]]) -> None:
    for (_, released, first), (acquired, _, second) in zip(spans, spans[1:]):
        assert acquired >= released, f"processes {first} and {second} held the lock at the same time"


def finish(procs: list[subprocess.Popen[str]]) -> list[subprocess.CompletedProcess[str]]:
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=TIMEOUT)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return done


@dataclass
class Tally:
    runs: int = 0  # processes that ran at the same time as others
    consistent: int = 0  # of those, the ones whose outcome the lock-order replay confirmed
    notes: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def tally(request: pytest.FixtureRequest) -> Iterator[Tally]:
    counts = Tally()
    yield counts
    print_line(
        request,
        f"concurrency: {counts.runs} concurrent runs, {counts.consistent} consistent, "
        f"{counts.runs - counts.consistent} inconsistent ({'; '.join(counts.notes)})",
    )


@pytest.fixture(scope="module")
def ref(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    return Reference.build(tmp_path_factory.mktemp("concurrency") / "applied")


@pytest.fixture
def holders() -> Iterator[list[subprocess.Popen[str]]]:
    """Background processes a test started; any still alive at the end is killed (by its own pid)."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()  # reaps it and closes its pipes


def wait_for(trace: Path, step: str, proc: subprocess.Popen[str], limit: float = 60) -> None:
    deadline = time.monotonic() + limit
    while not (trace.exists() and any(e.step == step for e in events(trace))):
        assert proc.poll() is None, f"the holder exited early: {proc.communicate()}"
        assert time.monotonic() < deadline, f"{step} not reached in {limit}s"
        time.sleep(0.05)


def test_eight_applies_at_once_one_writes_the_others_wait_and_find_nothing_to_do(venv, ref, tmp_path, tally):
    trace = tmp_path / "trace"
    # The writer (whichever wins) sleeps 2 s with the lock held, journal and ledger written, files not
    # yet replaced: every other process is certainly started and waiting by then.
    procs = [spawn(venv, "apply", "--json", at=("ledger-written:1:pause=2",), trace=trace) for _ in range(COUNT)]
    runs = finish(procs)
    tally.runs += COUNT
    assert all(r.returncode == 0 for r in runs), [describe(r) for r in runs if r.returncode]
    writers = [r for r in runs if changed(r)]
    assert len(writers) == 1, f"{len(writers)} processes wrote"
    assert sorted(changed(writers[0])) == sorted(i for i, s in ref.applied.items() if ref.pending[i] != s)
    assert writers[0].stderr.count("Patched ") == len(changed(writers[0]))
    applied = dict(ref.applied)  # apply lists every patch, the opt-in ones nobody named included, as status does
    for r in runs:
        assert states(r) == applied
        if r is not writers[0]:
            assert "Patched" not in r.stderr and "Done: " in r.stderr

    spans = lock_intervals(trace)
    assert len(spans) == COUNT
    assert_one_holder_at_a_time(spans)
    writer_pid = procs[runs.index(writers[0])].pid
    _, writer_released, first = spans[0]
    assert first == writer_pid, "the first process to take the lock must be the one that wrote"
    started = {e.pid: e.ns for e in events(trace) if e.step == "started"}
    assert all(started[pid] < writer_released for _, _, pid in spans[1:]), "every other run overlapped the writer's"
    assert sum(e.step == "ledger-written" for e in events(trace)) == 1
    assert_patched(venv, ref)
    tally.consistent += COUNT
    tally.notes.append(f"{COUNT} apply at once: 1 wrote, {COUNT - 1} waited then found nothing to do")


@pytest.mark.parametrize("start", ["pristine", "applied"])
def test_apply_racing_revert_is_serialised_and_ends_consistent(venv, ref, tmp_path, start, tally):
    if start == "applied":
        assert gptoss(venv, "apply").returncode == 0
    trace = tmp_path / "trace"
    commands = ["apply", "revert"] * (COUNT // 2)
    procs = [spawn(venv, cmd, "--json", at=("ledger-written:1:pause=0.3",), trace=trace) for cmd in commands]
    runs = finish(procs)
    tally.runs += len(runs)
    assert all(r.returncode == 0 for r in runs), [describe(r) for r in runs if r.returncode]

    spans = lock_intervals(trace)
    assert_one_holder_at_a_time(spans)
    # Replay the runs in lock order: each must have written exactly when its command had work to do.
    by_pid = {p.pid: (cmd, run) for p, cmd, run in zip(procs, commands, runs)}
    state = "patched" if start == "applied" else "original"
    for _, _, pid in spans:
        cmd, run = by_pid[pid]
        due = (cmd == "apply") == (state == "original")
        assert bool(changed(run)) == due, f"{cmd} (pid {pid}) found the files {state} but wrote={bool(changed(run))}"
        if due:
            state = "patched" if cmd == "apply" else "original"
    assert contents(venv, ref) == state
    (assert_patched if state == "patched" else assert_pristine)(venv, ref)
    assert gptoss(venv, "revert").returncode == 0
    assert_pristine(venv, ref)
    tally.consistent += len(runs)
    tally.notes.append(f"{len(runs)} apply/revert raced from {start}: serialised, ended {state}")


def test_lock_timeout_exits_6_with_a_clear_message(venv, ref, tmp_path, holders, tally):
    trace = tmp_path / "trace"
    holder = spawn(venv, "apply", at=("lock-acquired:1:hold",), trace=trace)
    holders.append(holder)
    wait_for(trace, "held", holder)

    began = time.monotonic()
    blocked = gptoss(venv, "apply", env={"GPTOSS_PATCH_LOCK_TIMEOUT": "1"})
    waited = time.monotonic() - began
    assert blocked.returncode == 6, describe(blocked)
    assert f"error: another gptoss-patch run has held the lock on {dist_info(venv)} for more than 1s" in blocked.stderr
    assert "hint: wait for it to finish, or raise GPTOSS_PATCH_LOCK_TIMEOUT" in blocked.stderr
    notice = f"waiting for another gptoss-patch run (pid {holder.pid}) to finish with {dist_info(venv)} (up to 1 s)"
    assert blocked.stderr.count(notice) == 1, describe(blocked)  # said once, before the wait, naming the holder
    assert waited >= 1
    assert_pristine(venv, ref)

    # status has nothing to recover, so it reads without waiting for the lock
    look = gptoss(venv, "status", "--json", env={"GPTOSS_PATCH_LOCK_TIMEOUT": "1"})
    assert look.returncode == 1 and states(look) == ref.pending, describe(look)
    tally.notes.append("lock timeout: exit 6")


def flock_holders(path: Path) -> set[int]:
    """Pids holding (not waiting for) an flock on `path`'s inode, from /proc/locks."""
    inode = str(os.stat(path).st_ino)
    pids = set()
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()  # "1: FLOCK ADVISORY WRITE <pid> <maj>:<min>:<inode> 0 EOF"; waiters have "->"
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5].rsplit(":", 1)[-1] == inode:
            pids.add(int(fields[4]))
    return pids


def test_sigkilled_lock_holder_never_blocks_the_next_run(venv, ref, tmp_path, holders, tally):
    trace = tmp_path / "trace"
    holder = spawn(venv, "apply", at=("ledger-written:1:hold",), trace=trace)
    holders.append(holder)
    wait_for(trace, "held", holder)
    fd = os.open(dist_info(venv), os.O_RDONLY)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert holder.pid in flock_holders(dist_info(venv))

        holder.send_signal(signal.SIGKILL)
        assert holder.wait(timeout=TIMEOUT) == KILLED
        assert holder.pid not in flock_holders(dist_info(venv))
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the kernel released it: taken at once
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
    assert (ledger_dir(venv) / "journal.json").exists()

    began = time.monotonic()
    after = gptoss(venv, "status", "--json", env={"GPTOSS_PATCH_LOCK_TIMEOUT": "5"})
    assert time.monotonic() - began < 5
    assert after.returncode == 0 and states(after) == ref.applied, describe(after)
    assert notices(after) == [f"warning: completed an interrupted apply of {len(ref.targets)} file(s) (process {holder.pid})"]
    assert_patched(venv, ref)
    again = gptoss(venv, "apply", "--json")
    assert again.returncode == 0 and not changed(again)
    tally.notes.append("SIGKILLed holder: lock released by the kernel, next run recovered at once")
