"""Run the gptoss-patch CLI with a fault hook installed: the test-only switch of issue 7.

    python tests/support/crash_runner.py [--trace FILE] [--at STEP[@PATH]:N[:ACTION]]... -- COMMAND ARGS...

`--at` fires at the Nth time STEP (a name in gptoss_patch.engine.faults.STEPS) is reached, counting only
occurrences whose path contains PATH when given. ACTION is one of
  kill      SIGKILL this process (the default; no exception, no clean-up, no flush),
  erofs     raise OSError(EROFS) there, as a read-only filesystem would,
  enospc    raise OSError(ENOSPC) there, as a full disk would,
  hold      write a `held` line to the trace and sleep until killed (to inspect or kill a lock holder),
  pause=S   sleep S seconds there, then go on (to widen a window another process must wait through),
  wait      write a `waiting` line to the trace and sleep until a signal arrives (at most 30 s), then go on:
            the test sends SIGINT, SIGTERM or SIGHUP exactly there (gptoss_patch.interrupts raises it, or
            defers it inside a critical section, in which case the run goes on from here).
`--trace` appends one line per step reached (`step<TAB>path<TAB>pid<TAB>monotonic ns`), plus a
`started` line first, written unbuffered so that they survive the kill. Production code never reads any of this: only this wrapper
installs the hook (gptoss_patch.engine.faults.install).
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from gptoss_patch import interrupts
from gptoss_patch.engine import faults

ACTIONS = ("kill", "erofs", "enospc", "hold", "pause", "wait")


@dataclass(frozen=True)
class Point:
    step: str
    path_part: str
    nth: int
    action: str

    @classmethod
    def parse(cls, text: str) -> Point:
        head, _, rest = text.partition(":")
        nth, _, action = rest.partition(":")
        step, _, path_part = head.partition("@")
        name, _, seconds = action.partition("=")
        if step not in faults.STEPS or not nth.isdigit() or int(nth) < 1 or (name or "kill") not in ACTIONS:
            raise SystemExit(f"crash_runner: bad --at {text!r} (STEP[@PATH]:N[:{'|'.join(ACTIONS)}])")
        if (name == "pause") != bool(seconds) or (seconds and not seconds.replace(".", "", 1).isdigit()):
            raise SystemExit(f"crash_runner: bad --at {text!r} (pause=SECONDS, and only pause takes a value)")
        return cls(step, path_part, int(nth), action or "kill")


class Hook:
    def __init__(self, points: list[Point], trace: Path | None) -> None:
        self.points = points
        self.seen: Counter[tuple[str, str]] = Counter()
        self.trace_fd = os.open(trace, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if trace else None

    def log(self, *fields: str) -> None:
        if self.trace_fd is not None:
            os.write(self.trace_fd, ("\t".join((*fields, str(os.getpid()), str(time.monotonic_ns()))) + "\n").encode())

    def __call__(self, step: str, path: Path | None) -> None:
        self.log(step, str(path or ""))
        keys = {(p.step, p.path_part) for p in self.points if p.step == step and p.path_part in str(path or "")}
        self.seen.update(keys)  # count every matching point before any fires, so counts stay exact
        for point in self.points:
            if (point.step, point.path_part) in keys and self.seen[(point.step, point.path_part)] == point.nth:
                self.fire(point, path)

    def fire(self, point: Point, path: Path | None) -> None:
        if point.action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if point.action == "hold":
            self.log("held", point.step)
            while True:
                time.sleep(60)
        if point.action == "wait":
            self.log("waiting", point.step)
            deadline = time.monotonic() + 30
            while interrupts.received() is None and time.monotonic() < deadline:
                time.sleep(0.005)  # the handler raises out of this sleep, unless it defers the signal
            return
        if point.action.startswith("pause="):
            time.sleep(float(point.action.partition("=")[2]))
            return
        code = errno.EROFS if point.action == "erofs" else errno.ENOSPC
        raise OSError(code, os.strerror(code), str(path or ""))


def main(argv: list[str]) -> None:
    if "--" not in argv:
        raise SystemExit("crash_runner: usage: crash_runner.py [--trace FILE] [--at POINT]... -- COMMAND ARGS...")
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="crash_runner")
    parser.add_argument("--trace", type=Path)
    parser.add_argument("--at", action="append", default=[], type=Point.parse)
    args = parser.parse_args(argv[:split])
    interrupts.install()  # as `python -m gptoss_patch` does before its imports: `started` means signals are handled
    hook = Hook(args.at, args.trace)
    hook.log("started", "")
    faults.install(hook)
    from gptoss_patch.cli import main as cli_main

    sys.argv = ["gptoss-patch", *argv[split + 1 :]]
    cli_main()


if __name__ == "__main__":
    main(sys.argv[1:])
