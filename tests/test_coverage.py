"""Version coverage on the real wheels, at every band boundary (the CI subset of scripts/compat_matrix.py).

Each release is installed --no-deps and taken through state -> apply -> verify -> apply again ->
revert (byte-identical to RECORD); then, in its CPU harness, patched and probed for behaviour.
The expected state of each patch before apply, and each probe's verdict after it, come from its SPEC.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from gptoss_patch import target
from gptoss_patch.registry import by_id
from gptoss_patch.verify.behaviour import ProbeResult
from tests.support.catalogue import probed, stock_states, verdict_after_apply
from tests.support.roundtrip import roundtrip
from tests.support.upstream import fresh_install

pytestmark = pytest.mark.upstream

# Every band boundary whose CPU harness the suite builds; what each patch does there comes from its
# SPEC (tests/support/catalogue.py), facts tests/patches/test_verdicts.py checks on all 27 wheels.
BOUNDARIES = ("0.15.1", "0.17.1", "0.18.0", "0.22.1", "0.23.0", "0.33.0")


@pytest.mark.parametrize("version", [pytest.param(v, id=f"vllm-{v}") for v in BOUNDARIES])
def test_round_trip_at_band_boundaries(version: str, tmp_path: Path):
    python = fresh_install(version, tmp_path / "venv")
    outcome = roundtrip(target.discover(str(python)))
    expected = stock_states(version)
    assert {k: outcome.before[k] for k in expected} == expected, outcome.reasons
    assert outcome.ok, outcome.steps
    assert all(state != "pending" for state in outcome.after.values()), outcome.after


# Behaviour probes after `apply` of every patch, per band boundary (tests/conftest.py's probes_after_apply, whose runs
# test_behaviour reads too): True = passed; None = the probe cannot run on that release (its SPEC's probe_runs_on:
# 0.25+ renders through OnlineRenderer, 0.32+ has no stream helper to call; both fixed upstream there, and `status`
# says so by shape).
@pytest.mark.harness
@pytest.mark.probe
@pytest.mark.parametrize("version", [pytest.param(v, id=f"vllm-{v}") for v in BOUNDARIES])
def test_behaviour_after_apply_at_band_boundaries(version: str, probes_after_apply: Callable[[str], dict[str, ProbeResult]]):
    results = probes_after_apply(version)
    expected = {patch_id: verdict_after_apply(by_id()[patch_id], version) for patch_id in probed()}
    assert {i: r.passed for i, r in results.items()} == expected, {i: r.evidence for i, r in results.items()}
