"""scripts/new_patch.py: a new patch's pieces in one command; bad or taken ids are refused and nothing is written."""

from __future__ import annotations

import ast
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gptoss_patch.versions import KNOWN_RELEASES

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "new_patch.py"
NEW_ID = "harmony_tool_names"


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """The parts of a checkout the scaffold reads and writes: the patch modules, the catalogue, the CHANGELOG."""
    root = tmp_path / "checkout"
    shutil.copytree(ROOT / "src" / "gptoss_patch" / "patches", root / "src" / "gptoss_patch" / "patches",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "patches", root / "patches")
    (root / "tests" / "patches").mkdir(parents=True)
    shutil.copy(ROOT / "CHANGELOG.md", root / "CHANGELOG.md")
    return root


def new_patch(root: Path, patch_id: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(SCRIPT), patch_id, "--root", str(root)]
    return subprocess.run(command, capture_output=True, text=True, check=False)


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_creates_every_piece_the_registry_test_asks_for(checkout: Path):
    result = new_patch(checkout, NEW_ID)
    assert result.returncode == 0, result.stderr
    module = checkout / "src" / "gptoss_patch" / "patches" / f"{NEW_ID}.py"
    spec = load(module, NEW_ID).SPEC
    assert spec.id == NEW_ID and spec.summary and spec.upstream and spec.bands
    assert not any(spec.band_for(v) for v in KNOWN_RELEASES)  # inert until its band is set
    assert (checkout / "patches" / NEW_ID / "README.md").read_text().startswith(f"# {NEW_ID}\n")
    ast.parse((checkout / "tests" / "patches" / f"test_{NEW_ID}.py").read_text())
    assert f"[`{NEW_ID}`]({NEW_ID}/README.md)" in (checkout / "patches" / "README.md").read_text()
    unreleased = (checkout / "CHANGELOG.md").read_text().split("## [Unreleased]", 1)[1].split("\n## ", 1)[0]
    assert f"- Patch `{NEW_ID}`: TODO" in unreleased.split("### Added\n", 1)[1]


def test_the_scaffolded_codemod_runs_and_reports_drift_until_written(checkout: Path):
    from gptoss_patch.patches._base import Drift, run_codemod
    from gptoss_patch.spec import PackageView

    new_patch(checkout, NEW_ID)
    spec = load(checkout / "src" / "gptoss_patch" / "patches" / f"{NEW_ID}.py", NEW_ID).SPEC
    with pytest.raises(Drift, match="not found"):
        run_codemod(spec.codemod(), "x = 1\n", PackageView(checkout))


@pytest.mark.parametrize("patch_id", ["harmony_instructions", "mxfp4_fp4_import"])
def test_an_existing_id_is_refused_in_one_line_and_nothing_is_written(checkout: Path, patch_id: str):
    before = snapshot(checkout)
    result = new_patch(checkout, patch_id)
    assert (result.returncode, result.stdout) == (2, "")
    module = f"src/gptoss_patch/patches/{patch_id}.py"
    assert result.stderr.splitlines() == [f"new_patch: patch id {patch_id!r} exists already: {module}"]
    assert snapshot(checkout) == before


def test_a_dossier_left_behind_makes_the_id_taken(checkout: Path):
    (checkout / "patches" / NEW_ID).mkdir()
    result = new_patch(checkout, NEW_ID)
    assert (result.returncode, result.stderr) == (2, f"new_patch: patch id {NEW_ID!r} exists already: patches/{NEW_ID}\n")


@pytest.mark.parametrize("patch_id", ["Harmony", "1st_patch", "_private", "with-dash", "class", "x" * 49, "a b"])
def test_a_bad_id_is_refused_in_one_line_and_nothing_is_written(checkout: Path, patch_id: str):
    before = snapshot(checkout)
    result = new_patch(checkout, patch_id)
    assert (result.returncode, result.stdout) == (2, "")
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith(f"new_patch: bad patch id {patch_id!r}: ")
    assert snapshot(checkout) == before


def test_a_directory_that_is_no_checkout_is_refused(tmp_path: Path):
    result = new_patch(tmp_path, NEW_ID)
    assert result.returncode == 2 and result.stderr.startswith(f"new_patch: {tmp_path} is not a gptoss-patch checkout")
    assert list(tmp_path.iterdir()) == []
