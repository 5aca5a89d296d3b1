"""docs/development.md's table of which test files cover which source module: one reader, for tests/test_layout.py
(which keeps the table true) and scripts/changed_tests.py (`make test-changed`: the tests of what changed)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEADING = "### Source module → test files"


def rows(root: Path = ROOT) -> list[tuple[list[str], list[str]]]:
    """(source modules relative to src/gptoss_patch, test files relative to the repository) per row of the table."""
    text = (root / "docs" / "development.md").read_text(encoding="utf-8")
    section = text.split(HEADING, 1)[1].split("\n<a id=", 1)[0]
    found = []
    for line in section.splitlines():
        if line.startswith("| `"):
            modules, tests = line.split("|")[1:3]
            found.append((re.findall(r"`([^`]+\.py)`", modules), re.findall(r"`([^`]+\.py)`", tests)))
    return found


def tests_of(module: str, root: Path = ROOT) -> list[str]:
    """The test files the table names for `module` (e.g. "engine/apply.py")."""
    return sorted({test for modules, tests in rows(root) if module in modules for test in tests})
