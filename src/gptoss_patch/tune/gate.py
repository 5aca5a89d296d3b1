"""The numerics gate every candidate passes before it can win, and the choice of the winner.

Two checks, numerics' own: the kernel check (numerics/kernels.py: each MoE kernel against exact bf16 math, where a
GPU exists; a candidate whose MoE kernel fails it, or was not checked, cannot win) and the served check (numerics/
served.py: the reference configuration's server answers the same prompts twice, the floor; a candidate's server
once; the candidate passes when its median |Δ logprob| against the reference is at most SERVED_LIMIT, or twice the
reference's own floor where that is larger). On vllm-cpu only the served check applies: there are no GPU kernels to
check. A candidate that fails is kept in the table with its figures, and never chosen.

The winner: among the candidates that passed, one that is faster than the reference beyond the spread (its lowest
generation rate above the reference's highest) at some concurrency and slower beyond the spread at none; of those,
the one with the best geometric mean of its generation ratios. None: the reference (the built-in profile) wins.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gptoss_patch.numerics.served import Pass, compare

# |Δ logprob| median against the reference (docs/performance.md, H100): two Triton servers 0.047, Marlin against
# Triton 0.39-0.40, Marlin against itself 0.27. 0.1 admits batching differences and stops a different kernel's drift.
SERVED_LIMIT = 0.1
# The spread of the reference's prompt logprobs at or below which they carry no information (all equal: uniform).
UNINFORMATIVE_SPREAD = 1e-3
KERNEL_OF = {"marlin": "marlin", "triton": "triton", "flashinfer_trtllm": "flashinfer", "flashinfer_cutlass": "flashinfer"}


@dataclass(frozen=True)
class Verdict:
    """One check's answer for one candidate: passed (None: not applicable), and the line that says why."""

    passed: bool | None
    line: str

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "line": self.line}


def served_verdict(reference: Sequence[Pass], candidate: Pass) -> tuple[Verdict, dict[str, Any]]:
    """The candidate's pass against the reference's first, judged by the reference's own floor (its two passes).

    Not judged (None) when the reference's prompt logprobs carry no information: `--load-format dummy` fills the
    weights with values so small that every logprob is ln(1/vocabulary) (-12.2115 for gpt-oss's 201088 tokens, seen on
    an H200 with the 120b shape), and any kernel or backend then "agrees" with the reference. A candidate whose only
    applicable check is not judged cannot win (`passed`)."""
    floor = compare(reference[0], reference[1])
    against = compare(reference[0], candidate)
    figures = {"floor": floor.to_json(), "against_reference": against.to_json()}
    values = [value for prompt in reference[0].prompts for value in prompt.logprobs]
    if not values or max(values) - min(values) <= UNINFORMATIVE_SPREAD:
        line = (f"served check: not judged: every prompt logprob of the reference is {values[0] if values else float('nan'):.4g} "
                "(a uniform distribution over the vocabulary: dummy or near-zero weights, as --load-format dummy gives), "
                "so no change of numerics can show; load real weights to gate on it")
        return Verdict(None, line), {**figures, "limit": None}
    limit = max(SERVED_LIMIT, 2 * floor.median_abs)
    passed = against.median_abs <= limit
    line = (f"median |Δ logprob| {against.median_abs:.3g} against the reference (limit {limit:.3g}; the reference "
            f"against itself {floor.median_abs:.3g}), top-1 agreement {against.top1_same:.0%}")
    return Verdict(passed, line), {**figures, "limit": limit}


def kernel_verdicts(report: Any) -> dict[str, Verdict]:
    """numerics' kernel gate, per MoE backend (the MoE layer's verdicts): `report` is a numerics KernelReport."""
    from gptoss_patch.numerics import kernels

    out: dict[str, Verdict] = {}
    for verdict in kernels.gate(report.results, report.floors):
        if verdict.layer != "moe":
            continue  # the dense projections are the same in every candidate
        ratio = f"{verdict.worst_ratio:.2f}x the exact-bf16 floor" if verdict.worst_ratio is not None else "no floor"
        text = f"kernel check: {ratio} at worst" + ("" if verdict.passed else f"; {verdict.failures[0]}")
        out[verdict.backend] = Verdict(verdict.passed, text)
    for missing in (m for m in report.not_run if m.get("layer") == "moe"):
        out.setdefault(str(missing.get("backend")), Verdict(False, f"kernel check: not run ({missing.get('reason')})"))
    return out


def kernel_verdict(moe_backend: str | None, verdicts: dict[str, Verdict] | None, reason: str) -> Verdict:
    """A candidate's kernel verdict: not applicable when it keeps the reference's MoE kernel, or without a GPU
    (`reason` says why); a MoE kernel the check did not cover fails (the gate never passes by default)."""
    if verdicts is None:
        return Verdict(None, reason)
    if moe_backend is None:
        return Verdict(None, "kernel check: the reference's MoE kernel")
    kernel = KERNEL_OF.get(moe_backend)
    found = verdicts.get(kernel) if kernel else None
    return found or Verdict(False, f"kernel check: {moe_backend} is not covered by it, so it cannot pass")


def passed(gate: dict[str, Any]) -> bool:
    """Every check that applies passed (a candidate with no applicable check cannot win: never by default)."""
    answers = [v.get("passed") for v in gate.values() if isinstance(v, dict)]
    return bool(answers) and all(a is not False for a in answers) and any(a is True for a in answers)


def choose(reference: dict[str, Any], results: Sequence[dict[str, Any]]) -> tuple[str, str]:
    """(the winner's name, why): see the module's docstring. Rows: {"concurrency", "generation": {median, low, high}}."""
    ref = {row["concurrency"]: row["generation"] for row in reference.get("rows") or []}
    best: tuple[float, str, str] | None = None
    for result in results:
        if result.get("status") != "measured" or not passed(result.get("gate") or {}):
            continue
        rows = {row["concurrency"]: row["generation"] for row in result.get("rows") or []}
        common = [c for c in sorted(ref) if c in rows and ref[c]["median"] > 0]
        if not common:
            continue
        slower = [c for c in common if rows[c]["high"] < ref[c]["low"]]
        faster = [c for c in common if rows[c]["low"] > ref[c]["high"]]
        if slower or not faster:
            continue
        ratios = {c: rows[c]["median"] / ref[c]["median"] for c in common}
        score = math.exp(sum(math.log(r) for r in ratios.values()) / len(ratios))
        why = (f"passed the gate and is faster than the reference beyond the spread at concurrency "
               f"{', '.join(map(str, faster))} and slower beyond it at none (generation "
               + ", ".join(f"{ratios[c]:.2f}x at {c}" for c in common) + ")")
        if best is None or score > best[0]:
            best = (score, str(result["name"]), why)
    if best is None:
        return "reference", ("no candidate that passed the gate was faster than the reference beyond the spread at any "
                             "concurrency without being slower beyond it at another: the built-in profile stays")
    return best[1], best[2]
