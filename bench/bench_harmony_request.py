"""Patched vs unpatched `_make_request_with_harmony`, per request, on the equivalence table (target <= 1.05x).

Both run in the CPU harness venv of vLLM 0.17.1, in one process so that process-to-process noise
(hash seeds, memory layout: +-10% on this 2-core machine) does not swamp a difference of a few us:
the stock class comes from the installed serving.py, the patched one from the same file after
harmony_instructions was applied in a hardlinked clone, loaded under another module name (the
helper it calls imports the same, already loaded, vLLM modules). For each case and each setting of
VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS, batches of stock and patched calls alternate, and each
side keeps its fastest batch (timeit's advice: the minimum is the estimate least hit by other load).
A call is ChatCompletionRequest construction plus the builder (what a server pays per request).

    .venv/bin/python bench/bench_harmony_request.py [--batch 100] [--rounds 15]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gptoss_patch.verify.behaviour import START_DATE  # noqa: E402 - after the path tweak
from gptoss_patch.verify.probes import MARKER, PROBES_DIR  # noqa: E402
from tests.support import harness  # noqa: E402
from tests.support.chat_cases import SETTINGS, TABLE  # noqa: E402

TARGET = 1.05
SERVING = "vllm/entrypoints/openai/chat_completion/serving.py"

# Runs in the harness venv: argv = probes dir, patched serving.py, JSON {cases, settings, batch, rounds}.
INNER = r"""
import importlib.util, json, sys, time
sys.path.insert(0, sys.argv[1])
from _builder import Builder
from _common import EnvVar, emit
stock = Builder()
patched = Builder()
spec = importlib.util.spec_from_file_location("gptoss_bench_patched_serving", sys.argv[2])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
patched.server = object.__new__(module.OpenAIServingChat)
patched.server.supports_browsing = patched.server.supports_code_interpreter = False
job = json.loads(sys.argv[3])

def batch(builder, case, n):
    started = time.perf_counter()
    for _ in range(n):
        builder.build(builder.request(case))
    return (time.perf_counter() - started) / n

out = {}
for setting in job["settings"]:
    with EnvVar("VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS", None if setting == "unset" else setting):
        for name, case in job["cases"].items():
            a, b = [], []
            for _ in range(job["rounds"]):
                a.append(batch(stock, case, job["batch"]))
                b.append(batch(patched, case, job["batch"]))
            out.setdefault(setting, {})[name] = [min(a), min(b)]
emit(out)
"""


def measure(stock: Path, patched_serving: Path, batch: int, rounds: int) -> dict[str, dict[str, list[float]]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "TIKTOKEN_"))}
    env.update(VLLM_SYSTEM_START_DATE=START_DATE, VLLM_LOGGING_LEVEL="ERROR", TIKTOKEN_ENCODINGS_BASE=str(harness.vocab_dir(stock)))
    job = json.dumps({"cases": TABLE, "settings": list(SETTINGS), "batch": batch, "rounds": rounds})
    command = [str(stock), "-B", "-c", INNER, str(PROBES_DIR), str(patched_serving), job]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARKER)]
    if not lines:
        raise SystemExit(f"timing run failed: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(lines[-1][len(MARKER) :])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    stock = harness.cpu_venv("0.17.1")
    with tempfile.TemporaryDirectory(prefix="bench-harmony-") as scratch:
        patched = harness.clone_venv(stock, Path(scratch) / "venv")
        harness.apply_patches(patched, ["harmony_instructions"])
        timings = measure(stock, harness.site_packages(patched) / SERVING, args.batch, args.rounds)
    return report(timings)


def report(timings: dict[str, dict[str, list[float]]]) -> int:
    print(f"{'setting':8} {'case':24} {'stock us':>9} {'patched us':>10} {'ratio':>6}")
    worst = 0.0
    for setting in SETTINGS:
        total_a = total_b = 0.0
        for case, (a, b) in timings[setting].items():
            total_a, total_b = total_a + a, total_b + b
            print(f"{setting:8} {case:24} {a * 1e6:9.1f} {b * 1e6:10.1f} {b / a:6.3f}")
        ratio = total_b / total_a
        worst = max(worst, ratio)
        print(f"{setting:8} {'ALL (per request, mean)':24} {total_a * 1e6 / len(TABLE):9.1f} {total_b * 1e6 / len(TABLE):10.1f} {ratio:6.3f}")
    print(f"worst ratio {worst:.3f} (target <= {TARGET}): {'OK' if worst <= TARGET else 'TOO SLOW'}")
    return 0 if worst <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
