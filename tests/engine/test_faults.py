"""Fault injection: SIGKILL at every reachable named step of apply and revert, on the real vllm 0.17.1.

For every crash point the real CLI runs under tests/support/crash_runner.py, which SIGKILLs its own process
at the Nth time a step of `gptoss_patch.engine.faults.STEPS` is reached (one crash point per occurrence:
`before-file` is reached once per file, and each one is tried). Then, on that same installation:
  1. `status` exits 0/1 with every target exactly the RECORD original or exactly the patched bytes,
     all files in the same state (no half-applied set), its --json states agreeing with the bytes,
     and the "completed an interrupted ..." notice exactly when the kill left a journal;
  2. `apply` (or `revert`) finishes the job: byte-identical patched files and a ledger whose stored
     originals equal RECORD's (or, after revert, pristine files, RECORD byte-identical to pip's, and
     not one file more or less in site-packages).
The expected patched bytes come from one uninterrupted apply. Four phases: apply, revert, a second
kill during the recovery of an interrupted apply/revert, and a kill during the roll-back of an apply
whose second file write the filesystem refused (EROFS injected by the runner). A module summary line
reports `fault injection: N crash points injected, N recovered, 0 lost`.

The three runs of each crash point are children of a fork server (tests/support/forkserver.py: the CLI
imported once per phase, the same command lines, crash_runner.py and its hook unchanged); each phase's
traced run (and the reference apply) are fresh interpreters, and
test_a_forked_run_is_a_real_run checks that the two give identical results at one crash point.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gptoss_patch.engine import faults
from tests.support.cli import states
from tests.support.forkserver import ForkServer
from tests.support.safety import (
    KILLED,
    VERSION,
    Reference,
    assert_patched,
    assert_pristine,
    contents,
    describe,
    gptoss,
    ledger_dir,
    notices,
    print_line,
)
from tests.support.upstream import fresh_install

pytestmark = pytest.mark.upstream
WORKERS = 4  # subprocess-bound: four crash points at a time on two cores


@dataclass(frozen=True)
class Point:
    step: str
    nth: int  # 1-based occurrence of `step` in the run
    path: str

    @property
    def spec(self) -> str:
        return f"{self.step}:{self.nth}"

    def __str__(self) -> str:
        return f"{self.step}#{self.nth}" + (f" ({Path(self.path).name})" if self.path else "")


def read_trace(trace: Path) -> list[Point]:
    """The steps a run reached, in order, each with its occurrence number."""
    seen: Counter[str] = Counter()
    points = []
    for line in trace.read_text().splitlines():
        step, path, *_ = line.split("\t")
        if step in faults.STEPS:
            seen[step] += 1
            points.append(Point(step, seen[step], path))
    return points


@dataclass
class Tally:
    injected: int = 0
    recovered: int = 0
    steps: set[str] = field(default_factory=set)
    phases: dict[str, int] = field(default_factory=dict)


@pytest.fixture(scope="module")
def tally(request: pytest.FixtureRequest) -> Iterator[Tally]:
    counts = Tally()
    yield counts
    phases = ", ".join(f"{n} in {phase}" for phase, n in counts.phases.items())
    summary = (
        f"fault injection: {counts.injected} crash points injected, {counts.recovered} recovered, "
        f"{counts.injected - counts.recovered} lost ({phases}; {len(counts.steps)} of {len(faults.STEPS)} named steps)"
    )
    print_line(request, summary)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("faults")


@pytest.fixture(scope="module")
def ref(work: Path) -> Reference:
    return Reference.build(work / "applied")  # also the template of every revert crash point


def clone(src: Path, dest: Path) -> Path:
    """A hardlink clone (gptoss-patch and pip only replace files by rename, never in place)."""
    subprocess.run(["cp", "-al", str(src), str(dest)], check=True)
    return dest


def traced(work: Path, name: str, venv: Path, command: str, *, at: tuple[str, ...] = (), rc: int = 0) -> list[Point]:
    trace = work / f"{name}.trace"
    result = gptoss(venv, command, at=at, trace=trace)
    assert result.returncode == rc, describe(result)
    return read_trace(trace)


def check_status(venv: Path, ref: Reference, journal_left: bool, leftover: bool, forks: ForkServer | None) -> str:
    """The first command after the kill: consistent state, honest notice. Returns the contents."""
    status = gptoss(venv, "status", "--json", forks=forks)
    assert status.returncode in (0, 1), describe(status)
    found = contents(venv, ref)
    assert states(status) == ref.states_for(found), describe(status)
    said = notices(status)
    if journal_left:
        assert len(said) == 1 and "completed an interrupted" in said[0], describe(status)
    elif leftover:
        assert len(said) == 1 and "removed the leftover ledger files of an interrupted" in said[0], describe(status)
    else:
        assert not said, describe(status)
    assert not (ledger_dir(venv) / "journal.json").exists()
    return found


def finish(venv: Path, ref: Reference, command: str, forks: ForkServer | None) -> None:
    done = gptoss(venv, command, forks=forks)
    assert done.returncode == 0, describe(done)
    (assert_patched if command == "apply" else assert_pristine)(venv, ref)


def crash_and_recover(venv: Path, ref: Reference, command: str, at: tuple[str, ...], then: str,
                      forks: ForkServer | None) -> None:
    crashed = gptoss(venv, command, at=at, forks=forks)
    assert crashed.returncode == KILLED, f"the crash point was not reached: {describe(crashed)}"
    journal_left = (ledger_dir(venv) / "journal.json").exists()
    leftover = ledger_dir(venv).exists() and not (ledger_dir(venv) / "ledger.json").exists() and not journal_left
    check_status(venv, ref, journal_left, leftover, forks)
    finish(venv, ref, then, forks)


def run_all(tally: Tally, work: Path, phase: str, points: list[Point],
            case: Callable[[Point, Path, ForkServer], None]) -> None:
    """Run `case` for every point (in parallel, the CLI forked from one server), each on its own installation;
    fail with every failure."""

    def one(index_point: tuple[int, Point]) -> str | None:
        index, point = index_point
        venv = work / f"{phase}-{index}"
        try:
            case(point, venv, forks)
            return None
        except AssertionError as exc:
            return f"{phase} killed at {point}: {exc}"
        finally:
            shutil.rmtree(venv, ignore_errors=True)

    with ForkServer() as forks, ThreadPoolExecutor(WORKERS) as pool:
        failures = [f for f in pool.map(one, enumerate(points)) if f]
    tally.injected += len(points)
    tally.recovered += len(points) - len(failures)
    tally.steps |= {p.step for p in points}
    tally.phases[phase] = len(points)
    assert points and not failures, f"{len(failures)} of {len(points)} crash points not recovered:\n" + "\n".join(failures)


# The crash points of each phase, traced once per module: the phase tests kill at each of them, and
# test_every_named_step_was_a_crash_point checks that together they cover every named step, whatever
# order the tests run in.


@pytest.fixture(scope="module")
def apply_points(work: Path) -> list[Point]:
    probe = fresh_install(VERSION, work / "apply-trace")
    return traced(work, "apply", probe.parent.parent, "apply")


@pytest.fixture(scope="module")
def revert_points(ref: Reference, work: Path) -> list[Point]:
    return traced(work, "revert", clone(work / "applied", work / "revert-trace"), "revert")


@pytest.fixture(scope="module")
def recovery_points(ref: Reference, work: Path) -> dict[str, list[Point]]:
    """For an apply and a revert killed after their first file: the points of the `status` that completes them."""
    found = {}
    for interrupted in ("apply", "revert"):
        template = work / f"interrupted-{interrupted}"
        if interrupted == "apply":
            fresh_install(VERSION, template)
        else:
            clone(work / "applied", template)
        first = gptoss(template, interrupted, at=("after-file:1",))
        assert first.returncode == KILLED and (ledger_dir(template) / "journal.json").exists()
        found[interrupted] = traced(work, f"recover-{interrupted}", clone(template, work / f"recover-{interrupted}-trace"),
                                    "status", rc=1 if interrupted == "revert" else 0)
    return found


@pytest.fixture(scope="module")
def rollback_points(ref: Reference, work: Path) -> list[Point]:
    """The last file's write fails (EROFS); the points of apply putting the others back."""
    probe = fresh_install(VERSION, work / "rollback-trace").parent.parent
    trace = work / "rollback.trace"
    last = Path(ref.targets[-1]).name
    refused = gptoss(probe, "apply", at=(f"before-rename@/{last}:1:erofs",), trace=trace)
    assert refused.returncode == 7 and "read-only filesystem; nothing was changed" in refused.stderr, describe(refused)
    assert_pristine(probe, ref)
    points = read_trace(trace)
    fired = next(i for i, p in enumerate(points) if p.step == "before-rename" and p.path.endswith(f"/{last}"))
    return points[fired + 1 :]


def test_kill_at_every_step_of_apply(ref, work, tally, apply_points):
    points = apply_points
    assert {"before-file", "file-replaced", "after-file"} <= {p.step for p in points}
    assert sum(p.step == "before-file" for p in points) == len(ref.targets)  # one per file: each is killed at

    def case(point: Point, venv: Path, forks: ForkServer) -> None:
        fresh_install(VERSION, venv)
        crash_and_recover(venv, ref, "apply", (point.spec,), then="apply", forks=forks)

    run_all(tally, work, "apply", points, case)


def test_kill_at_every_step_of_revert(ref, work, tally, revert_points):
    points = revert_points
    assert {"ledger-removed", "contents-removed", "record-unregistered"} <= {p.step for p in points}

    def case(point: Point, venv: Path, forks: ForkServer) -> None:
        clone(work / "applied", venv)
        crash_and_recover(venv, ref, "revert", (point.spec,), then="revert", forks=forks)

    run_all(tally, work, "revert", points, case)


@pytest.mark.parametrize("interrupted", ["apply", "revert"])
def test_kill_again_while_the_next_command_recovers(ref, work, tally, recovery_points, interrupted):
    """A second kill, in the `status` that is completing an apply/revert killed after its first file."""
    template = work / f"interrupted-{interrupted}"
    points = recovery_points[interrupted]
    assert "before-file" in {p.step for p in points}

    def case(point: Point, venv: Path, forks: ForkServer) -> None:
        clone(template, venv)
        crash_and_recover(venv, ref, "status", (point.spec,), then=interrupted, forks=forks)

    run_all(tally, work, f"recovery-of-{interrupted}", points, case)


def test_kill_during_the_roll_back_of_a_refused_write(ref, work, tally, rollback_points):
    """The last file's write fails (EROFS); apply puts the others back; a kill at each step of that."""
    last = Path(ref.targets[-1]).name
    undo = rollback_points
    assert "file-replaced" in {p.step for p in undo}  # the first file really was put back

    def case(point: Point, venv: Path, forks: ForkServer) -> None:
        fresh_install(VERSION, venv)
        crash_and_recover(venv, ref, "apply", (f"before-rename@/{last}:1:erofs", point.spec), then="apply", forks=forks)

    run_all(tally, work, "roll-back", undo, case)


def test_every_named_step_was_a_crash_point(apply_points, revert_points, recovery_points, rollback_points):
    """The phases above kill at every point of these traces: together they reach every step of faults.STEPS."""
    traces = [apply_points, revert_points, *recovery_points.values(), rollback_points]
    assert set(faults.STEPS) - {p.step for points in traces for p in points} == set()


def snapshot(venv: Path, killed: str) -> dict[str, bytes | int]:
    """Every file of the venv: a file still hardlinked to the clone's base by its inode (both venvs clone one base),
    any other by its bytes, the venv's own path written as <VENV>. What differs between two runs of one command by
    nature is made equal: the killed process's pid in the journal, and in the name of a temporary file."""
    found: dict[str, bytes | int] = {}
    for path in sorted(venv.rglob("*")):
        if path.is_file() and not path.is_symlink():
            rel = re.sub(r"\.\d+\.[0-9a-f]{8}\.tmp$", ".PID.RANDOM.tmp", str(path.relative_to(venv)))
            if path.stat().st_nlink > 1:
                found[rel] = path.stat().st_ino
                continue
            data = path.read_bytes().replace(str(venv).encode(), b"<VENV>")
            if path.name == "journal.json":
                data = data.replace(f'"pid": {killed},'.encode(), b'"pid": <KILLED>,')
            found[rel] = data
    return found


def outcome(proc: subprocess.CompletedProcess[str], venv: Path, killed: str) -> tuple[int, str, str]:
    """Exit code, stdout and stderr, the venv's path written as <VENV> and the killed run's pid as <KILLED>."""
    return (proc.returncode, *(text.replace(str(venv), "<VENV>").replace(f"(process {killed})", "(process <KILLED>)")
                               for text in (proc.stdout, proc.stderr)))


@dataclass
class Observed:
    outcomes: dict[str, tuple[int, str, str]] = field(default_factory=dict)  # command -> exit code, stdout, stderr
    files: dict[str, dict[str, bytes | int]] = field(default_factory=dict)  # command -> the venv's files after it
    trace: list[str] = field(default_factory=list)  # step and path of each line (pids and times differ)


def test_a_forked_run_is_a_real_run(ref, work, apply_points):
    """The fork path the phases above take, against fresh interpreters, at one crash point that leaves a journal
    (so `status` completes it and says so): the kill, `status --json` and the finishing `apply` give identical
    exit codes, stdout and stderr, identical steps in the trace, and identical files after each command."""
    point = next(p for p in apply_points if p.step == "after-file")
    commands = {"the kill": ("apply", (), (point.spec,)), "status": ("status", ("--json",), ()),
                "apply": ("apply", (), ())}
    seen = {}
    for how in ("real", "forked"):
        venv, trace, observed = work / f"equivalence-{how}", work / f"equivalence-{how}.trace", Observed()
        fresh_install(VERSION, venv)
        with ForkServer() if how == "forked" else nullcontext() as forks:
            for name, (command, args, at) in commands.items():
                proc = gptoss(venv, command, *args, at=at, trace=trace if at else None, forks=forks)
                killed = trace.read_text().split("\t")[2]  # the pid of the run that was killed (its `started` line)
                observed.outcomes[name], observed.files[name] = outcome(proc, venv, killed), snapshot(venv, killed)
        observed.trace = [re.sub(r"^([^\t]*\t[^\t]*)\t.*$", r"\1", line).replace(str(venv), "<VENV>")
                          for line in trace.read_text().splitlines()]
        seen[how] = observed
        shutil.rmtree(venv)
    real, forked = seen["real"], seen["forked"]
    (kill, _, _), (status, _, said), (done, _, _) = real.outcomes.values()
    assert (kill, status, done) == (KILLED, 0, 0), real.outcomes
    assert [line for line in said.splitlines() if "completed an interrupted" in line], said
    journal = [any(f.endswith("/journal.json") for f in files) for files in real.files.values()]
    assert journal == [True, False, False], journal  # the kill left a journal, status completed it
    assert real.files["the kill"] != real.files["apply"] and len(real.trace) > 2
    for name in commands:
        assert forked.outcomes[name] == real.outcomes[name], f"the forked run differs from the real one in {name}"
        assert forked.files[name] == real.files[name], (
            f"the forked run leaves other files than the real one after {name}")
    assert forked.trace == real.trace
