"""Every patch's version gate and its verdict on every checked release, generated from its SPEC.

A patch declares its stock facts once, in patches/<id>.py: its bands (`>=L,<U` and the target file there),
`fixed_in`, `stock_not_needed`, `opt_in`. The tests here are generated from those declarations for every
registered patch, so no id, release or state is typed: the gate is probed at each edge the bands and `fixed_in`
name, and the verdict `status` gives on the real wheel of each of KNOWN_RELEASES is the one
tests/support/catalogue.py derives from the SPEC. What is particular to one patch (its codemod on hand-written
snippets, its fake-site status, where its code lives in each wheel) stays in tests/patches/test_<id>.py.

A verdict that the declarations cannot give would be an explicit, commented test in that patch's own module,
with the release left out here; every verdict on the 27 releases follows from them today.
"""

from __future__ import annotations

import pytest
from packaging.version import Version

from gptoss_patch.registry import all_specs
from gptoss_patch.spec import Band, PatchSpec
from gptoss_patch.versions import KNOWN_RELEASES, NEWEST_KNOWN
from tests.support.catalogue import stock_state

SPECS = [pytest.param(spec, id=spec.id) for spec in all_specs()]

# -- the version gate ------------------------------------------------------------------------------------------


def bounds(band: Band) -> tuple[Version, Version | None]:
    """A band's `>=L` and optional `<U`: the only shapes the patches declare (anything else fails here)."""
    parts = [part.strip() for part in band.versions.split(",")]
    lower = [Version(p[2:]) for p in parts if p.startswith(">=")]
    upper = [Version(p[1:]) for p in parts if p.startswith("<") and not p.startswith("<=")]
    assert len(lower) == 1 and len(upper) <= 1 and len(parts) == 1 + len(upper), band.versions
    return lower[0], (upper[0] if upper else None)


def inside(version: Version, band: Band) -> bool:
    """The band read with plain comparisons, and PEP 440's one rule on top: `<U` excludes U's own pre-releases
    (an rc of a band's start is in no band). An independent reading of what SPEC.band_for does with specifiers."""
    lower, upper = bounds(band)
    if version < lower:
        return False
    if upper is None:
        return True
    return version < upper and not (version.is_prerelease and Version(version.base_version) == upper)


def expected_target(spec: PatchSpec, version: Version) -> str | None:
    targets = [band.target for band in spec.bands if inside(version, band)]
    assert len(targets) <= 1, f"{spec.id}: bands overlap at {version}"
    return targets[0] if targets else None


def release_before(version: Version) -> Version:
    earlier = [r for r in KNOWN_RELEASES if r < version]
    return earlier[-1] if earlier else Version(f"{version.major}.{version.minor}.{max(version.micro - 1, 0)}")


def edges(spec: PatchSpec) -> dict[str, str]:
    """{version: what it is} at every edge the SPEC declares: each band's start, end and their release
    candidates, a local build and a dev build inside the band, the release before the first band, `fixed_in`."""
    probes: dict[str, str] = {}
    first = min(bounds(band)[0] for band in spec.bands)
    probes[str(release_before(first))] = "below-the-first-band"
    for band in spec.bands:
        lower, upper = bounds(band)
        last = max((r for r in KNOWN_RELEASES if inside(r, band)), default=lower)
        probes[str(lower)] = f"start-of-{band.target}"
        probes[f"{lower}rc1"] = f"rc-of-the-start-of-{band.target}"
        probes[f"{last}+cu129"] = f"local-build-of-the-last-release-in-{band.target}"
        probes[f"{last.major}.{last.minor}.{last.micro + 1}.dev3"] = f"dev-after-the-last-release-in-{band.target}"
        if upper is not None:
            probes[str(upper)] = f"end-of-{band.target}"
            probes[f"{upper}rc1"] = f"rc-of-the-end-of-{band.target}"
    if spec.fixed_in:
        probes[spec.fixed_in] = "fixed-upstream"
        probes[f"{spec.fixed_in}rc1"] = "rc-of-the-fix-release"
    probes[f"{NEWEST_KNOWN.major}.{NEWEST_KNOWN.minor + 1}.0.dev1"] = "dev-of-an-unknown-newer-release"
    return probes


GATE = [
    pytest.param(spec, version, id=f"{spec.id}-{version}-{what}")
    for spec in all_specs()
    for version, what in edges(spec).items()
]


@pytest.mark.parametrize("spec, version", GATE)
def test_version_gate(spec: PatchSpec, version: str):
    band = spec.band_for(Version(version))
    assert (band.target if band else None) == expected_target(spec, Version(version))


@pytest.mark.parametrize("spec", SPECS)
def test_bands_do_not_overlap_and_end_by_the_fix_release(spec: PatchSpec):
    """Each band starts where the one before ended or later; a fixed patch's last band ends by `fixed_in`."""
    spans = [bounds(band) for band in spec.bands]
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert end is not None and start >= end, spec.versions
    if spec.fixed_in:
        end = spans[-1][1]
        assert end is not None and end <= Version(spec.fixed_in), (spec.versions, spec.fixed_in)


# -- the verdict on every checked release ----------------------------------------------------------------------

VERDICTS = [pytest.param(spec, str(v), id=f"{spec.id}-vllm-{v}") for spec in all_specs() for v in KNOWN_RELEASES]


@pytest.mark.upstream
@pytest.mark.parametrize("spec, version", VERDICTS)
def test_verdict_on_the_real_wheel(spec: PatchSpec, version: str, real_states):
    """`status` on the files of the real wheel (one run per release, shared by every patch) says what the SPEC
    declares: pending in a band, not-needed where stock already behaves, out-of-range between bands,
    fixed-upstream from `fixed_in`, opt-in for an opt-in patch that would be pending."""
    state, reason = real_states(version)[spec.id]
    assert state == stock_state(spec, version).value, reason
