"""Shared checks for patch unit tests (django-upgrade's tools.py): dedent, apply twice, parse."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

from gptoss_patch.patches._base import Drift, run_codemod
from gptoss_patch.spec import PackageView, PatchSpec


def _package(tmp_path: Path | None, files: dict[str, str] | None) -> PackageView:
    """A fake `vllm` package holding `files` (relative path -> source), for detectors that look around."""
    root = (tmp_path or Path("/nonexistent")) / "vllm"
    for relpath, text in (files or {}).items():
        (root / relpath).parent.mkdir(parents=True, exist_ok=True)
        (root / relpath).write_text(textwrap.dedent(text))
    return PackageView(root)


def check_transformed(
    before: str, after: str, *, spec: PatchSpec, tmp_path: Path | None = None, package_files: dict[str, str] | None = None
) -> None:
    """`before` becomes exactly `after`; the result parses, is detected as applied, and a second pass is drift."""
    package = _package(tmp_path, package_files)
    before, after = textwrap.dedent(before), textwrap.dedent(after)
    result = run_codemod(spec.codemod(), before, package)
    assert result == after
    ast.parse(result)
    assert not spec.is_applied(before, package)
    assert spec.is_applied(result, package)
    with pytest.raises(Drift):
        run_codemod(spec.codemod(), result, package)  # the codemod matches only the unpatched shape


def check_drift(source: str, *, spec: PatchSpec, tmp_path: Path | None = None, package_files: dict[str, str] | None = None) -> str:
    """The codemod refuses `source` (its anchor is missing or ambiguous); returns the drift message."""
    package = _package(tmp_path, package_files)
    with pytest.raises(Drift) as info:
        run_codemod(spec.codemod(), textwrap.dedent(source), package)
    return str(info.value)
