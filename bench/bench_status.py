"""Issue 2: `status`, and `apply` when everything is applied, <= 0.5x `pip show vllm` in the same environment."""

from __future__ import annotations

import shutil

from _common import TOOL, applied_install, side_by_side, verdict

VERSION = "0.17.1"


def main(runs: int = 7) -> int:
    scratch, python = applied_install(VERSION, "bench-status-")
    times = side_by_side(
        runs,
        pip_show=([str(python), "-m", "pip", "show", "vllm"], None),
        status=([*TOOL, "status", "--venv", str(scratch / "venv")], None),
        apply_noop=([*TOOL, "apply", "--venv", str(scratch / "venv")], None),
    )
    shutil.rmtree(scratch)
    ok = verdict("status vs pip show vllm", times["status"], times["pip_show"], 0.5)
    ok &= verdict("apply (all applied) vs pip show vllm", times["apply_noop"], times["pip_show"], 0.5)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
