"""The test files that cover what changed since BASE (default: HEAD), for `make test-changed`: a developer's loop.

    python scripts/changed_tests.py [BASE]     prints one test file per line (nothing: no test covers the change)

A changed source module brings the test files docs/development.md's table names for it (tests/test_layout.py keeps
that table true); a changed test file brings itself; a changed module of tests/support brings every test file that
imports it; a changed conftest.py brings the test files beside and under it. Untracked files count as changed. Any
other change (docs, the Makefile) selects nothing. CI never uses this: it runs everything (.ci/run).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support import module_table  # noqa: E402

PACKAGE = "src/gptoss_patch/"


def changed(base: str) -> list[str]:
    def git(*args: str) -> list[str]:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True, timeout=60)
        return [line for line in done.stdout.splitlines() if line]

    return sorted(set(git("diff", "--name-only", base)) | set(git("ls-files", "--others", "--exclude-standard")))


def selected(paths: list[str]) -> list[str]:
    every_test = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py"))
    chosen: set[str] = set()
    for path in paths:
        if path.startswith(PACKAGE) and path.endswith(".py"):
            chosen.update(module_table.tests_of(path.removeprefix(PACKAGE)))
        elif path.startswith("tests/") and Path(path).name.startswith("test_"):
            chosen.add(path)
        elif path.startswith("tests/support/") and path.endswith(".py"):
            name = Path(path).stem
            pattern = re.compile(rf"from tests\.support(?:\.{name}| import [^\n]*\b{name}\b)")
            chosen.update(t for t in every_test if pattern.search((ROOT / t).read_text(encoding="utf-8")))
        elif Path(path).name == "conftest.py" and path.startswith("tests/"):
            chosen.update(t for t in every_test if t.startswith(str(Path(path).parent) + "/"))
    return sorted(t for t in chosen if (ROOT / t).is_file())


if __name__ == "__main__":
    print("\n".join(selected(changed(sys.argv[1] if len(sys.argv) > 1 else "HEAD"))))
