"""Issue 2: first `apply` of the whole set <= 1.25x the floor (import libcst, parse + regenerate each target once).

Both run on the real vLLM 0.17.1 install; each apply gets a fresh, pristine clone of it.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from _common import TOOL, side_by_side, verdict
from packaging.version import Version

from gptoss_patch.engine import target_of
from gptoss_patch.registry import all_specs
from tests.support.upstream import fresh_install, site_packages

VERSION = "0.17.1"
FLOOR = "import libcst, sys\nfor f in sys.argv[1:]:\n    libcst.parse_module(open(f, encoding='utf-8').read()).code\n"


def main(runs: int = 5) -> int:
    scratch = Path(tempfile.mkdtemp(prefix="bench-apply-"))
    venv = scratch / "venv"

    def fresh() -> None:
        shutil.rmtree(venv, ignore_errors=True)
        fresh_install(VERSION, venv)

    fresh()
    targets = sorted({target_of(s, Version(VERSION)) for s in all_specs()} - {None})
    files = [str(site_packages(venv) / rel) for rel in targets]
    times = side_by_side(
        runs,
        floor=([sys.executable, "-c", FLOOR, *files], None),
        apply=([*TOOL, "apply", "--venv", str(venv)], fresh),
    )
    shutil.rmtree(scratch)
    print(f"targets: {', '.join(targets)}")
    return 0 if verdict("first apply vs libcst floor", times["apply"], times["floor"], 1.25) else 1


if __name__ == "__main__":
    raise SystemExit(main())
