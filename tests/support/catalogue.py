"""What the tests expect of every patch, derived from its SPEC: no patch id is typed here.

A patch declares its stock facts once, in patches/<id>.py (bands, fixed_in, stock_not_needed,
probe_runs_on); the fake site, the integration and coverage tests read them through these functions,
and the real-wheel tests of tests/patches/ check the facts against the code of every release.
"""

from __future__ import annotations

from packaging.version import Version

from gptoss_patch.registry import all_specs
from gptoss_patch.spec import PatchSpec, State
from gptoss_patch.verify.probes import probe_ids
from gptoss_patch.versions import in_range


def stock_state(spec: PatchSpec, version: str | Version) -> State:
    """What `status` reports for `spec` on the stock wheel of `version`, before apply (default selection:
    an opt-in patch that would be pending is reported as opt-in)."""
    state = _stock_state(spec, version)
    return State.OPT_IN if spec.opt_in and state is State.PENDING else state


def _stock_state(spec: PatchSpec, version: str | Version) -> State:
    v = Version(str(version))
    if spec.fixed_in and v >= Version(spec.fixed_in):
        return State.FIXED_UPSTREAM
    if spec.band_for(v) is None:
        return State.OUT_OF_RANGE
    if spec.stock_not_needed and in_range(v, spec.stock_not_needed):
        return State.NOT_NEEDED
    return State.PENDING


def stock_states(version: str | Version) -> dict[str, str]:
    """{id: state} of every patch on the stock wheel of `version`, as `status --json` spells them."""
    return {spec.id: stock_state(spec, version).value for spec in all_specs()}


def probed() -> tuple[str, ...]:
    """The ids that have a behaviour probe, in catalogue order."""
    return tuple(spec.id for spec in all_specs() if spec.id in probe_ids())


def verdict_after_apply(spec: PatchSpec, version: str | Version) -> bool | None:
    """What its behaviour probe reports once the release is patched: passed, or None where it cannot run."""
    runs = spec.probe_runs_on is None or in_range(Version(str(version)), spec.probe_runs_on)
    return True if runs else None
