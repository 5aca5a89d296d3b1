"""Launcher overhead: time-to-exec of `gptoss-patch serve` against a fake `vllm`, side by side with the fake alone.

Target (issue 4): the launcher adds at most 0.3 s before `vllm serve` starts.

    .venv/bin/python bench/bench_launch.py [--runs 9]

Both sides start the same fake `vllm` (tests/support/fakes/fake_vllm.py) as the entry point of a venv holding the
real vLLM 0.17.1 wheel (--no-deps, patched, vocabulary installed; tests/launcher/installs.py). The fake
writes time.time() as its first act and exits at once; time-to-exec = that stamp - spawn time. The runs
alternate; the machine's load is printed, since on 2 busy cores every figure inflates.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.launcher.installs import build_install, install_vocabulary  # noqa: E402

VERSION = "0.17.1"
TARGET_ADDED = 0.3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-launch-") as scratch:
        work = Path(scratch)
        inst = build_install(work / "venv", VERSION)
        env = _environment(work)
        install_vocabulary(env)
        direct, launched = [], []
        for _ in range(args.runs):  # alternating, so a change in machine load hits both sides alike
            direct.append(_time_to_exec(_direct_command(inst), env, work))
            launched.append(_time_to_exec(_launcher_command(work / "venv"), env, work))
    return _report(direct, launched)


def _environment(work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "TIKTOKEN_"))}
    env.update(
        XDG_CACHE_HOME=str(work / "cache"),
        XDG_STATE_HOME=str(work / "state"),
        GPTOSS_PATCH_TEST_FAKE_VLLM="exit",
        GPTOSS_PATCH_TEST_FAKE_STAMP=str(work / "stamp"),
    )
    return env


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _direct_command(inst) -> list[str]:
    return [str(Path(inst.python).parent / "vllm"), "serve", "openai/gpt-oss-20b", "--host", "127.0.0.1", "--port", str(_free_port())]


def _launcher_command(venv: Path) -> list[str]:
    exe = Path(sys.executable).parent / "gptoss-patch"
    return [str(exe), "serve", "openai/gpt-oss-20b", "--venv", str(venv), "--gpu", "cpu", "--port", str(_free_port())]


def _time_to_exec(command: list[str], env: dict[str, str], work: Path) -> tuple[float, float]:
    """(wall seconds from spawn to the fake's first act, CPU seconds of the whole run incl. children)."""
    stamp = work / "stamp"
    stamp.unlink(missing_ok=True)
    cpu_before = _children_cpu()
    started = time.time()
    proc = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
    if proc.returncode != 0 or not stamp.exists():
        raise SystemExit(f"{command[0]} failed ({proc.returncode}): {proc.stderr.strip()[-400:]}")
    return float(stamp.read_text()) - started, _children_cpu() - cpu_before


def _children_cpu() -> float:
    times = os.times()
    return times.children_user + times.children_system


def _report(direct: list[tuple[float, float]], launched: list[tuple[float, float]]) -> int:
    print(f"load average           : {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
    base, total = (statistics.median(w for w, _ in runs) for runs in (direct, launched))
    base_cpu, total_cpu = (statistics.median(c for _, c in runs) for runs in (direct, launched))
    print(f"fake vllm alone        : median {base * 1000:7.1f} ms wall (min {min(w for w, _ in direct) * 1000:.1f}), {base_cpu * 1000:.0f} ms CPU")
    print(f"gptoss-patch serve     : median {total * 1000:7.1f} ms wall (min {min(w for w, _ in launched) * 1000:.1f}), {total_cpu * 1000:.0f} ms CPU")
    added = total - base
    verdict = "PASS" if added <= TARGET_ADDED else "FAIL"
    print(f"added by the launcher  : {added * 1000:7.1f} ms wall, {(total_cpu - base_cpu) * 1000:.0f} ms CPU "
          f"(target <= {TARGET_ADDED * 1000:.0f} ms wall): {verdict}")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
