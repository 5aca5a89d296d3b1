"""Shared by the benchmarks: interleaved side-by-side timing, and the verdict line."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # for tests.support.upstream (the cached real-wheel venvs)
TOOL = [sys.executable, "-m", "gptoss_patch"]


def timed(cmd: Sequence[str], setup: Callable[[], None] | None = None) -> float:
    if setup:
        setup()
    start = time.perf_counter()
    proc = subprocess.run(list(cmd), capture_output=True, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        raise SystemExit(f"benchmark command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr.decode()[-500:]}")
    return elapsed


def side_by_side(runs: int, **commands: tuple[Sequence[str], Callable[[], None] | None]) -> dict[str, float]:
    """Median wall time of each command, run alternately so machine load hits both alike."""
    samples: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, (cmd, setup) in commands.items():
            samples[name].append(timed(cmd, setup))
    return {name: statistics.median(values) for name, values in samples.items()}


def verdict(label: str, measured: float, baseline: float, target: float) -> bool:
    ratio = measured / baseline
    ok = ratio <= target
    print(f"{label}: {measured:.3f}s vs {baseline:.3f}s -> ratio {ratio:.2f} (target <= {target}) {'PASS' if ok else 'FAIL'}")
    return ok


def applied_install(version: str, prefix: str) -> tuple[Path, Path]:
    """(scratch directory, python) of a fresh --no-deps install of `version`, with a pip and every patch applied."""
    import tempfile

    from tests.support.upstream import fresh_install

    scratch = Path(tempfile.mkdtemp(prefix=prefix))
    python = fresh_install(version, scratch / "venv")
    subprocess.run([str(python), "-m", "ensurepip"], check=True, capture_output=True)  # a pip to compare with
    subprocess.run([*TOOL, "apply", "--venv", str(scratch / "venv")], check=True, capture_output=True)
    return scratch, python
