"""Golden diffs: the real engine on files read from the real vLLM wheels, at each band's ends.

For every patch, every band's first and last known release and the upstream fix release (if any)
are checked; the expected verdict and diff live in patches/<id>/vllm-<version>.diff (written by
`pytest --update-golden`, reviewed like code). Each run also proves idempotency.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gptoss_patch import engine
from gptoss_patch.registry import all_specs
from gptoss_patch.spec import Selection
from tests.support.golden import extracted, golden_versions

pytestmark = pytest.mark.upstream
ROOT = Path(__file__).resolve().parent.parent
CASES = [pytest.param(spec, v, id=f"{spec.id}-vllm-{v}") for spec in all_specs() for v in golden_versions(spec)]


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
