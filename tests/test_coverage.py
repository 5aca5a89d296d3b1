"""Version coverage on the real wheels, at every band boundary (the CI subset of scripts/compat_matrix.py).

Each release is installed --no-deps and taken through state -> apply -> verify -> apply again ->
revert (byte-identical to RECORD); then, in its CPU harness, patched and probed for behaviour.
The expected state of each patch before apply, and each probe's verdict after it, are pinned here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gptoss_patch import behaviour, engine, target
from tests import harness
from tests.roundtrip import roundtrip
from tests.upstream import fresh_install

pytestmark = pytest.mark.upstream

# State of each patch on the stock release, before apply (facts checked on the wheels).
EXPECTED = {
    "0.15.1": {"harmony_instructions": "pending", "harmony_no_tools_channels": "not-needed", "harmony_stream_guard": "pending",
               "marlin_atomic_add_sm121": "pending", "mxfp4_fp4_import": "not-needed"},
    "0.17.1": {"harmony_instructions": "pending", "harmony_no_tools_channels": "pending", "harmony_stream_guard": "pending",
               "marlin_atomic_add_sm121": "pending", "mxfp4_fp4_import": "not-needed"},
    "0.18.0": {"harmony_instructions": "pending", "harmony_no_tools_channels": "pending", "harmony_stream_guard": "pending",
               "marlin_atomic_add_sm121": "pending", "mxfp4_fp4_import": "not-needed"},
    "0.22.1": {"harmony_instructions": "pending", "harmony_no_tools_channels": "pending", "harmony_stream_guard": "pending",
               "marlin_atomic_add_sm121": "pending", "mxfp4_fp4_import": "not-needed"},
    "0.23.0": {"harmony_instructions": "fixed-upstream", "harmony_no_tools_channels": "pending", "harmony_stream_guard": "pending",
               "marlin_atomic_add_sm121": "pending", "mxfp4_fp4_import": "not-needed"},
    "0.33.0": {"harmony_instructions": "fixed-upstream", "harmony_no_tools_channels": "pending", "harmony_stream_guard": "fixed-upstream",
               "marlin_atomic_add_sm121": "pending", "mxfp4_fp4_import": "not-needed"},
}


@pytest.mark.parametrize("version", [pytest.param(v, id=f"vllm-{v}") for v in EXPECTED])
def test_round_trip_at_band_boundaries(version: str, tmp_path: Path):
    python = fresh_install(version, tmp_path / "venv")
    outcome = roundtrip(target.discover(str(python)))
    assert {k: outcome.before[k] for k in EXPECTED[version]} == EXPECTED[version], outcome.reasons
    assert outcome.ok, outcome.steps
    assert all(state != "pending" for state in outcome.after.values()), outcome.after


# Behaviour probes after `apply`, per band boundary: True = passed; None = the probe cannot run on
# that release (0.25+ renders through OnlineRenderer, 0.24+ streams through a HarmonyParser that
# needs a tokenizer: both fixed upstream there, and `status` says so by shape).
PROBES = ("harmony_instructions", "harmony_no_tools_channels", "harmony_stream_guard", "marlin_atomic_add_sm121")
ALL_PASS = dict.fromkeys(PROBES, True)
EXPECTED_BEHAVIOUR = {
    "0.15.1": ALL_PASS,
    "0.17.1": ALL_PASS,
    "0.18.0": ALL_PASS,
    "0.22.1": ALL_PASS,
    "0.23.0": ALL_PASS,
    "0.33.0": {**ALL_PASS, "harmony_instructions": None, "harmony_stream_guard": None},
}


@pytest.mark.harness
@pytest.mark.parametrize("version", [pytest.param(v, id=f"vllm-{v}") for v in EXPECTED_BEHAVIOUR])
def test_behaviour_after_apply_at_band_boundaries(version: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    python = harness.clone_venv(harness.cpu_venv(version), tmp_path / "venv")
    monkeypatch.setenv("TIKTOKEN_ENCODINGS_BASE", str(harness.vocab_dir(python)))
    engine.apply(target.discover(str(python)))
    results = {r.id: r for r in behaviour.run(str(python), PROBES, verbose=False)}
    assert {i: r.passed for i, r in results.items()} == EXPECTED_BEHAVIOUR[version], {i: r.evidence for i, r in results.items()}
