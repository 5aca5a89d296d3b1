"""Meta-tests: every patch id ties its module, tests, dossier, golden diffs, probe and the CHANGELOG together.

A patch is declared once, in src/gptoss_patch/patches/<id>.py; every other piece is found by its id
(docs/adding-a-patch.md). These tests fail when a piece is missing on either side: a module without
its dossier, test file or CHANGELOG entry, or a dossier, test file or probe left without its module.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.version import Version

from gptoss_patch.registry import all_specs, ids
from gptoss_patch.spec import module_id
from gptoss_patch.verify.probes import probe_ids
from gptoss_patch.versions import specifier
from tests.support.golden import golden_versions

ROOT = Path(__file__).resolve().parent.parent
SPECS = [pytest.param(spec, id=spec.id) for spec in all_specs()]


@pytest.mark.parametrize("spec", SPECS)
def test_patch_is_fully_documented_and_tested(spec):
    assert spec.id == module_id(spec.codemod.__module__)
    assert spec.summary and spec.upstream and spec.bands
    assert (ROOT / "tests" / "patches" / f"test_{spec.id}.py").exists()
    assert (ROOT / "patches" / spec.id / "README.md").exists()
    assert spec.id in (ROOT / "patches" / "README.md").read_text()
    assert spec.id in (ROOT / "CHANGELOG.md").read_text()
    for version in golden_versions(spec):
        assert (ROOT / "patches" / spec.id / f"vllm-{version}.diff").exists()


def test_no_piece_of_a_patch_outlives_its_module():
    """A dossier, test file or probe whose id has no module: a patch half-removed, or a typo in a name."""
    modules = set(ids())
    dossiers = {path.name for path in (ROOT / "patches").iterdir() if path.is_dir()}
    generated = {"test_verdicts.py"}  # one module for every patch: the version gate and the verdict per release
    test_files = {p.stem.removeprefix("test_") for p in (ROOT / "tests" / "patches").glob("test_*.py") if p.name not in generated}
    assert dossiers - modules == set(), "patches/<id>/ without src/gptoss_patch/patches/<id>.py"
    assert test_files - modules == set(), "tests/patches/test_<id>.py without src/gptoss_patch/patches/<id>.py"
    assert probe_ids() - modules == set(), "verify/probes/probe_<id>.py without src/gptoss_patch/patches/<id>.py"


@pytest.mark.parametrize("spec", SPECS)
def test_probe_facts_belong_to_a_probe(spec):
    """probe_needs_vocabulary and probe_runs_on describe probes/probe_<id>.py: they need one to describe."""
    if spec.probe_needs_vocabulary or spec.probe_runs_on:
        assert spec.id in probe_ids(), f"{spec.id} declares probe facts but has no verify/probes/probe_{spec.id}.py"


@pytest.mark.parametrize("spec", SPECS)
def test_ranges_are_valid_specifiers(spec):
    """(That the bands neither overlap nor outlive the fix: tests/patches/test_verdicts.py.)"""
    for versions in (*(band.versions for band in spec.bands), spec.stock_not_needed, spec.probe_runs_on):
        if versions is not None:
            assert str(specifier(versions)), versions


def test_the_patch_set_each_release_gets():
    """What `vllm==X` gets, pinned so a reviewer sees any change (fixed-upstream patches drop out)."""

    def patch_set(version: str) -> list[str]:
        v = Version(version)
        return [s.id for s in all_specs() if s.band_for(v) and not (s.fixed_in and v >= Version(s.fixed_in))]

    assert "harmony_instructions" in patch_set("0.17.1")
    assert "harmony_instructions" not in patch_set("0.23.0")
    assert "marlin_atomic_add_sm121" in patch_set("0.33.0")
    assert patch_set("0.14.1") == []
