"""`gptoss-patch vocab status` against `pip show vllm`, side by side in one run (target: ratio <= 0.5).

Both are fresh processes timed by wall clock, interleaved, median of N runs. `pip show vllm` runs
in the CPU harness venv of vLLM 0.17.1 (where vllm is installed); `vocab status` runs from the
environment running this script, with TIKTOKEN_ENCODINGS_BASE pointing at that venv's vocabulary,
so it really reads and hashes the 3.6 MB file.

    .venv/bin/python bench/bench_vocab_status.py [--runs 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support import harness  # noqa: E402 - after the path tweak

TARGET = 0.5


def wall(command: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--vllm", default="0.17.1")
    args = parser.parse_args()
    python = harness.cpu_venv(args.vllm)
    env = dict(os.environ, TIKTOKEN_ENCODINGS_BASE=str(harness.vocab_dir(python)))
    ours = [str(Path(sys.executable).parent / "gptoss-patch"), "vocab", "status"]
    theirs = [str(python), "-m", "pip", "show", "vllm"]
    wall(ours, env), wall(theirs, env)  # warm the page cache for both
    a, b = [], []
    for _ in range(args.runs):
        a.append(wall(ours, env))
        b.append(wall(theirs, env))
    ratio = statistics.median(a) / statistics.median(b)
    print(f"gptoss-patch vocab status : median {statistics.median(a) * 1000:7.1f} ms  (min {min(a) * 1000:.1f})")
    print(f"pip show vllm ({args.vllm})  : median {statistics.median(b) * 1000:7.1f} ms  (min {min(b) * 1000:.1f})")
    print(f"ratio {ratio:.2f} (target <= {TARGET}): {'OK' if ratio <= TARGET else 'TOO SLOW'}")
    return 0 if ratio <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
