"""One release's round trip through the real engine: state -> apply -> verify -> apply again -> revert.

Shared by tests/test_coverage.py (the CI subset) and scripts/compat_matrix.py (every release).
Every step is timed; a step that fails is recorded with its reason instead of raising.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gptoss_patch import engine
from gptoss_patch.engine.record import read_hashes
from gptoss_patch.errors import GptossPatchError
from gptoss_patch.fsutil import sha256
from gptoss_patch.registry import all_specs
from gptoss_patch.spec import Selection, State
from gptoss_patch.target import Installation

# Before apply `status` runs with the default selection (opt-in patches report `opt-in`); apply, verify and
# apply-again name every opt-in patch too, so that the round trip covers each patch's rewrite and revert.
EVERY = Selection(with_=tuple(spec.id for spec in all_specs() if spec.opt_in))


@dataclass
class Outcome:
    """What happened to one release: per-patch verdicts and per-step results and timings."""

    version: str
    before: dict[str, str] = field(default_factory=dict)  # patch id -> state before apply
    reasons: dict[str, str] = field(default_factory=dict)
    after: dict[str, str] = field(default_factory=dict)  # patch id -> state after apply
    steps: dict[str, str] = field(default_factory=dict)  # step -> "ok" or the failure
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(v == "ok" or v.startswith("n/a") for v in self.steps.values())

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("version", "before", "reasons", "after", "steps", "seconds")}


def _step(outcome: Outcome, name: str, action: Callable[[], str]) -> None:
    start = time.perf_counter()
    try:
        outcome.steps[name] = action()
    except GptossPatchError as exc:
        outcome.steps[name] = f"failed: {exc}"
    except Exception as exc:  # noqa: BLE001 - a row must say why, never crash the matrix
        outcome.steps[name] = f"crashed: {type(exc).__name__}: {exc}"
    outcome.seconds[name] = round(time.perf_counter() - start, 3)


def roundtrip(inst: Installation) -> Outcome:
    outcome = Outcome(str(inst.version))
    _step(outcome, "status", lambda: _status(inst, outcome))
    touched: set[str] = set()
    _step(outcome, "apply", lambda: _apply(inst, outcome, touched))
    _step(outcome, "verify", lambda: _verify(inst))
    _step(outcome, "apply-again", lambda: _apply_again(inst))
    _step(outcome, "revert", lambda: _revert(inst, touched))
    return outcome


def _status(inst: Installation, outcome: Outcome) -> str:
    for result in engine.status(inst).results:
        outcome.before[result.id] = result.state.value
        outcome.reasons[result.id] = result.reason
    return "ok"


def _apply(inst: Installation, outcome: Outcome, touched: set[str]) -> str:
    report = engine.apply(inst, EVERY, allow_unknown_version=True)
    touched.update(r.file for r in report.results if r.changed and r.file)
    outcome.after = {r.id: r.state.value for r in engine.status(inst, EVERY).results}
    stuck = [i for i, s in outcome.after.items() if s == State.PENDING.value]
    return f"failed: still pending: {', '.join(stuck)}" if stuck else "ok"


def _verify(inst: Installation) -> str:
    failures = [f"{r.id}: {r.error}" for r in engine.verify(inst, EVERY).results if r.error]
    return "ok" if not failures else "failed: " + "; ".join(failures)


def _apply_again(inst: Installation) -> str:
    changed = [r.id for r in engine.apply(inst, EVERY, allow_unknown_version=True).results if r.changed]
    return "ok" if not changed else f"failed: wrote again: {', '.join(changed)}"


def _revert(inst: Installation, touched: set[str]) -> str:
    engine.revert(inst)
    record = read_hashes(inst.record, touched)
    differing = [rel for rel in sorted(touched) if sha256((inst.site_packages / rel).read_bytes()) != record.get(rel)]
    if differing:
        return f"failed: differs from RECORD: {', '.join(differing)}"
    if (inst.dist_info / "gptoss_patch").exists():
        return "failed: ledger left behind"
    return "ok" if touched else "n/a (nothing applied)"
