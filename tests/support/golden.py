"""What the golden diffs are checked on (tests/test_golden.py), and the trees the patch tests read from the real
wheels: a band's first and last known release and the upstream fix release; only the files the patches read."""

from __future__ import annotations

import zipfile
from pathlib import Path

from packaging.version import Version

from gptoss_patch.registry import all_specs
from gptoss_patch.spec import PatchSpec
from gptoss_patch.target import Installation
from gptoss_patch.versions import KNOWN_RELEASES, in_range
from tests.support.upstream import sources_path


def golden_versions(spec: PatchSpec) -> list[Version]:
    chosen: set[Version] = set()
    for band in spec.bands:
        inside = [v for v in KNOWN_RELEASES if in_range(v, band.versions)]
        chosen.update(inside[:1] + inside[-1:])
    if spec.fixed_in:
        chosen.add(Version(spec.fixed_in))
    return sorted(chosen)


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
