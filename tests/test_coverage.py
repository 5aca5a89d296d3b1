"""Version coverage on the real wheels, at every band boundary (the CI subset of scripts/compat_matrix.py).

Each release is installed --no-deps and taken through state -> apply -> verify -> apply again ->
revert (byte-identical to RECORD). The expected state of each patch before apply is pinned here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gptoss_patch import target
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
