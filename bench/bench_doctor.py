"""`gptoss-patch doctor` (every static pre-flight check) against `vllm serve --help`, in the same CPU environment.

Target (issue 4): doctor <= 0.1 x `vllm serve --help`.

    .venv/bin/python bench/bench_doctor.py [--venv ~/.cache/gptoss-patch/venvs/cpu-vllm-0.17.1] [--runs 3]

The environment is the CPU harness of docs/development.md (built by tests/support/harness.py). `vllm serve --help` fails on
a machine without a GPU unless the CPU platform is forced first (known issue G25), so it runs through a
small wrapper written here. doctor is timed cold (its static-read cache emptied) and warm. Side by side,
alternating, in one run; medians reported.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_VENV = Path.home() / ".cache" / "gptoss-patch" / "venvs" / "cpu-vllm-0.17.1"
TARGET_RATIO = 0.1
# Force the CPU platform before vLLM's CLI imports, as docs/development.md ("The CPU harness") describes; then run `vllm`.
CPU_CLI = """\
import sys
import vllm.platforms
from vllm.platforms.cpu import CpuPlatform
CpuPlatform.import_kernels = classmethod(lambda cls: None)
vllm.platforms._current_platform = CpuPlatform()
from vllm.entrypoints.cli.main import main
sys.exit(main())
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    python = args.venv / "bin" / "python"
    if not python.exists():
        print(f"missing: the CPU harness venv {args.venv} (build it with the harness tests: tests/support/harness.py, cpu_venv('0.17.1'))")
        return 2
    with tempfile.TemporaryDirectory(prefix="bench-doctor-") as scratch:
        return _compare(python, Path(scratch), args.runs)


def _compare(python: Path, scratch: Path, runs: int) -> int:
    wrapper = scratch / "vllm_cpu_cli.py"
    wrapper.write_text(CPU_CLI)
    help_times, cold, warm = [], [], []
    for _ in range(runs):
        help_times.append(_timed([str(python), str(wrapper), "serve", "--help"], _help_env(python)))
        cold.append(_timed(_doctor(python), _doctor_env(scratch / f"cold-{len(cold)}")))
        warm.append(_timed(_doctor(python), _doctor_env(scratch / "warm")))
    return _report(statistics.median(help_times), statistics.median(cold), statistics.median(warm))


def _help_env(python: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["TIKTOKEN_ENCODINGS_BASE"] = str(python.parent.parent / "tiktoken")
    return env


def _doctor(python: Path) -> list[str]:
    exe = Path(sys.executable).parent / "gptoss-patch"
    return [str(exe), "doctor", "openai/gpt-oss-20b", "--python", str(python), "--gpu", "cpu", "--port", "18999"]


def _doctor_env(cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    env["XDG_CACHE_HOME"] = str(cache)
    return env


def _timed(command: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    proc = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if proc.returncode not in (0, 1):  # doctor exits 1 when a check fails (e.g. pending patches): still timed
        detail = (proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"missing or broken: `{' '.join(command[:4])} ...` exited {proc.returncode}: {detail}")
    return elapsed


def _report(help_time: float, cold: float, warm: float) -> int:
    print(f"vllm serve --help (CPU platform forced): {help_time:7.2f} s")
    print(f"gptoss-patch doctor, cold cache       : {cold:7.2f} s  ratio {cold / help_time:.3f}")
    print(f"gptoss-patch doctor, warm cache       : {warm:7.2f} s  ratio {warm / help_time:.3f}")
    verdict = "PASS" if cold <= TARGET_RATIO * help_time else "FAIL"
    print(f"target: doctor <= {TARGET_RATIO} x serve --help (judged on the cold run): {verdict}")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
