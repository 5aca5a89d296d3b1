"""Golden diffs: the real engine on files read from the real vLLM wheels, at each band's ends.

For every patch, every band's first and last known release and the upstream fix release (if any)
are checked; the expected verdict and diff live in patches/<id>/vllm-<version>.diff (written by
`pytest --update-golden`, reviewed like code). Each run also proves idempotency.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from packaging.version import Version

from gptoss_patch import engine
from gptoss_patch.registry import all_specs
from gptoss_patch.spec import PatchSpec, Selection
from gptoss_patch.target import Installation
from gptoss_patch.versions import KNOWN_RELEASES, in_range
from tests.support.upstream import sources_path

pytestmark = pytest.mark.upstream
ROOT = Path(__file__).resolve().parent.parent


def golden_versions(spec: PatchSpec) -> list[Version]:
    chosen: set[Version] = set()
    for band in spec.bands:
        inside = [v for v in KNOWN_RELEASES if in_range(v, band.versions)]
        chosen.update(inside[:1] + inside[-1:])
    if spec.fixed_in:
        chosen.add(Version(spec.fixed_in))
    return sorted(chosen)


CASES = [pytest.param(spec, v, id=f"{spec.id}-vllm-{v}") for spec in all_specs() for v in golden_versions(spec)]


def extracted(version: Version, tmp_path: Path) -> Installation:
    """A site-packages tree holding only the files the patches read, taken from the wheel."""
    site = tmp_path / "site-packages"
    wanted = {f"vllm/{rel}" for s in all_specs() for rel in (*(b.target for b in s.bands), *s.reads)}
    with zipfile.ZipFile(sources_path(str(version))) as zf:
        names = set(zf.namelist())
        dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/RECORD"))
        for rel in [*sorted(wanted & names), f"{dist_info}/RECORD"]:
            (site / rel).parent.mkdir(parents=True, exist_ok=True)
            (site / rel).write_bytes(zf.read(rel))
    return Installation("python3", version, site, site / dist_info)


@pytest.mark.parametrize("spec, version", CASES)
def test_golden(spec, version, tmp_path, request):
    inst = extracted(version, tmp_path)
    only = Selection(only=(spec.id,))
    report = engine.apply(inst, only, dry_run=True, allow_unknown_version=True)
    result = report.results[0]
    text = f"# {spec.id} on vllm {version}: {result.state.value} ({result.reason})\n{result.diff}"
    golden = ROOT / "patches" / spec.id / f"vllm-{version}.diff"
    if request.config.getoption("--update-golden"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert golden.exists(), f"{golden.relative_to(ROOT)} is missing: run pytest --update-golden and review it"
    assert text == golden.read_text()
    if result.diff:
        engine.apply(inst, only)
        assert engine.status(inst, only).results[0].state.value == "applied"
        assert not engine.apply(inst, only).results[0].changed
