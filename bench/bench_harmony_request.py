"""Patched vs unpatched `_make_request_with_harmony`, per request, on the equivalence table (target <= 1.05x).

Both run in CPU harness venvs of vLLM 0.17.1: the cached stock one and a hardlinked clone patched
with harmony_instructions. Each round renders every case of tests/test_equivalence.TABLE REPEAT
times per setting of VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS (ChatCompletionRequest construction
plus the builder call, as a server pays per request) and keeps the median; rounds alternate
stock/patched so that machine noise hits both. The ratio is the sum of per-case medians.

    .venv/bin/python bench/bench_harmony_request.py [--repeat 200] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests import harness  # noqa: E402 - after the path tweak
from tests.test_equivalence import SETTINGS, TABLE  # noqa: E402

TARGET = 1.05


def measure(python: Path, repeat: int) -> dict[str, dict[str, float]]:
    return harness.render_table(python, TABLE, settings=SETTINGS, repeat=repeat)["seconds"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    stock = harness.cpu_venv("0.17.1")
    with tempfile.TemporaryDirectory(prefix="bench-harmony-") as scratch:
        patched = harness.clone_venv(stock, Path(scratch) / "venv")
        harness.apply_patches(patched, ["harmony_instructions"])
        runs: dict[str, list[dict[str, dict[str, float]]]] = {"stock": [], "patched": []}
        for _ in range(args.rounds):
            runs["stock"].append(measure(stock, args.repeat))
            runs["patched"].append(measure(patched, args.repeat))
    return report(runs)


def median_of(runs: list[dict[str, dict[str, float]]], setting: str, case: str) -> float:
    return statistics.median(run[setting][case] for run in runs)


def report(runs: dict[str, list[dict[str, dict[str, float]]]]) -> int:
    print(f"{'setting':8} {'case':24} {'stock us':>9} {'patched us':>10} {'ratio':>6}")
    worst = 0.0
    for setting in SETTINGS:
        totals = [0.0, 0.0]
        for case in TABLE:
            a, b = median_of(runs["stock"], setting, case), median_of(runs["patched"], setting, case)
            totals[0], totals[1] = totals[0] + a, totals[1] + b
            print(f"{setting:8} {case:24} {a * 1e6:9.1f} {b * 1e6:10.1f} {b / a:6.3f}")
        ratio = totals[1] / totals[0]
        worst = max(worst, ratio)
        print(f"{setting:8} {'ALL (sum of medians)':24} {totals[0] * 1e6:9.1f} {totals[1] * 1e6:10.1f} {ratio:6.3f}")
    print(f"worst ratio {worst:.3f} (target <= {TARGET}): {'OK' if worst <= TARGET else 'TOO SLOW'}")
    return 0 if worst <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
