"""Issue 13: `status` with a patch directory of 10 user patches (state proven by the ledger) <= 0.5x
`pip show vllm`, and `audit` (warm page cache, second run) <= 1x `pip show vllm`, in the same environment."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from _common import TOOL, applied_install, side_by_side, verdict

from tests.support.upstream import site_packages, sources_path

VERSION = "0.17.1"


def _ten_patches(venv: Path, patches: Path) -> None:
    """Ten hand edits, each captured as its own user patch (and recorded in the ledger as applied)."""
    site = site_packages(venv)
    files = sorted(p for p in (site / "vllm" / "entrypoints").rglob("*.py") if p.stat().st_size > 200)[:10]
    for i, path in enumerate(files):
        data = path.read_bytes() + f"# local edit {i}\n".encode()
        path.unlink()  # a clone shares inodes with the cached venv: never write in place
        path.write_bytes(data)
        rel = path.relative_to(site).as_posix()
        subprocess.run(
            [*TOOL, "capture", f"edit{i:02d}", "--dir", str(patches), "--files", rel, "--from", str(sources_path(VERSION)),
             "--venv", str(venv)], check=True, capture_output=True,
        )


def main(runs: int = 7) -> int:
    scratch, python = applied_install(VERSION, "bench-userpatches-")
    venv = scratch / "venv"
    patches = scratch / "patches"
    patches.mkdir()
    _ten_patches(venv, patches)
    subprocess.run([*TOOL, "audit", "--venv", str(venv)], check=False, capture_output=True)  # fills the hash cache
    times = side_by_side(
        runs,
        pip_show=([str(python), "-m", "pip", "show", "vllm"], None),
        status_10_user=([*TOOL, "status", "--venv", str(venv), "--patch-dir", str(patches)], None),
        audit=([*TOOL, "audit", "--venv", str(venv)], None),
    )
    shutil.rmtree(scratch)
    ok = verdict("status with 10 user patches vs pip show vllm", times["status_10_user"], times["pip_show"], 0.5)
    ok &= verdict("audit (warm) vs pip show vllm", times["audit"], times["pip_show"], 1.0)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
