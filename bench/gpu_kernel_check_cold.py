"""A machine's first kernel check: `gptoss-patch numerics --level kernels` with empty compile caches, the
default (a process per GPU MoE backend, side by side) against `--sequential` (one process), in one run; then
both again once the caches are warm.

Target (issue 24): the kernel check of the 20b shape <= 60 s on an H100, a machine's first run included. A
machine's first run pays for compiling the MoE kernels: Triton's (by Triton, into TRITON_CACHE_DIR) and, on
GPUs newer than sm_80, Marlin's PTX (by the CUDA driver, into CUDA_CACHE_PATH). Each cold run here gets
fresh, empty directories for those and for the inductor and vLLM caches, which is what a new machine has (its
disk's page cache aside: the first run of this script on a machine is the truest figure). Run it with the
tool's interpreter and the target's:

    python bench/gpu_kernel_check_cold.py --python $PY [--shape 20b] [--rounds 1] [--json OUT]

It prints each run's wall time and phases, then the ratios of the medians (side by side / one process) and
the verdict against the target. It needs a CUDA GPU and a vLLM whose MXFP4 MoE oracle the check drives
(0.19+); it measures, it asserts nothing, and is not part of `make bench` (which needs no GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from gptoss_patch.numerics import kernels  # noqa: E402

TARGET_SECONDS = 60.0
CACHES = ("CUDA_CACHE_PATH", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "VLLM_CACHE_ROOT")
WAYS = {"side by side": False, "one process": True}  # name -> --sequential


def check(python: str, shape: kernels.LayerShape, caches: Path, *, sequential: bool) -> kernels.KernelReport:
    """One kernel check whose compile caches are under `caches` (empty: a machine's first run)."""
    for name in CACHES:
        os.environ[name] = str(caches / name.lower())
    return kernels.run(python, shape, sequential=sequential)


def line(label: str, report: kernels.KernelReport) -> str:
    spent = ", ".join(f"{name} {value}" for name, value in report.phases.items())
    return f"{label}: {report.seconds:.1f} s ({report.device}; vLLM {report.vllm}): {spent}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", required=True, help="the target interpreter (vLLM and torch on a CUDA GPU)")
    parser.add_argument("--shape", default="20b", help="tiny, 20b or 120b (default 20b)")
    parser.add_argument("--rounds", type=int, default=1, help="cold runs of each way (they alternate first)")
    parser.add_argument("--json", type=Path, help="write every run's report here")
    args = parser.parse_args()
    shape = kernels.layer_shape(None, args.shape)
    seconds: dict[str, list[float]] = {}
    runs = []
    with tempfile.TemporaryDirectory(prefix="kernel-check-cold-") as scratch:
        for round_ in range(args.rounds):
            names = list(WAYS) if round_ % 2 == 0 else list(reversed(WAYS))
            for name in names:
                report = check(args.python, shape, Path(scratch) / f"{round_}-{name}", sequential=WAYS[name])
                label = f"cold, {name} (round {round_ + 1})"
                print(line(label, report), flush=True)
                seconds.setdefault(f"cold, {name}", []).append(report.seconds)
                runs.append({"run": label, **report.to_json()})
        for name in WAYS:  # the caches the first round's run of this way filled
            report = check(args.python, shape, Path(scratch) / f"0-{name}", sequential=WAYS[name])
            print(line(f"warm, {name}", report), flush=True)
            seconds[f"warm, {name}"] = [report.seconds]
            runs.append({"run": f"warm, {name}", **report.to_json()})
    median = {key: statistics.median(values) for key, values in seconds.items()}
    for state in ("cold", "warm"):
        apart, together = median[f"{state}, side by side"], median[f"{state}, one process"]
        print(f"{state}: side by side {apart:.1f} s vs one process {together:.1f} s -> ratio {apart / together:.2f}")
    first = median["cold, side by side"]
    print(f"a machine's first kernel check (default): {first:.1f} s; target <= {TARGET_SECONDS:.0f} s: "
          f"{'PASS' if first <= TARGET_SECONDS else 'FAIL'}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
