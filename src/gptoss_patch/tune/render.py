"""The tables of `tune` and `tune --show`: what was tried, its figures against the reference, its gate, the winner."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gptoss_patch import render


def _generation(row: dict[str, Any]) -> str:
    g = row["generation"]
    if g["low"] == g["high"]:
        return f"{g['median']:.1f}"
    return f"{g['median']:.1f} ({g['low']:.1f}-{g['high']:.1f})"


def _gate_text(result: dict[str, Any]) -> str:
    from gptoss_patch.tune import gate

    verdicts = result.get("gate") or {}
    if result.get("axis") == "reference":
        return "reference"
    if not verdicts:
        return "-"
    word = "passed" if gate.passed(verdicts) else "FAILED"
    lines = [v["line"] for k, v in verdicts.items() if isinstance(v, dict) and "line" in v]
    return word + ": " + "; ".join(lines)


def table(profile: dict[str, Any], path: Path | None = None) -> None:
    """One row per server measured (the reference first), the winner and why, what was skipped or left out."""
    results = profile.get("table") or []
    reference = next((r for r in results if r.get("axis") == "reference"), None)
    ref = {row["concurrency"]: row["generation"]["median"] for row in (reference or {}).get("rows") or []}
    concurrencies = sorted({row["concurrency"] for r in results for row in r.get("rows") or []})
    columns = ["candidate", "args", "status", *[f"gen tok/s C={c}" for c in concurrencies], "gate"]
    rows = []
    for result in results:
        by_c = {row["concurrency"]: row for row in result.get("rows") or []}
        cells = []
        for c in concurrencies:
            row = by_c.get(c)
            if row is None:
                cells.append("-")
                continue
            ratio = f" {row['generation']['median'] / ref[c]:.2f}x" if c in ref and ref[c] > 0 and result is not reference else ""
            cells.append(_generation(row) + ratio)
        rows.append([str(result["name"]), " ".join(result.get("args") or []) or "-", str(result.get("status")), *cells,
                     _gate_text(result)])
    key = profile.get("key") or {}
    title = f"tune: {key.get('gpu')}, {key.get('vllm')}, {key.get('shape')}"
    render.table(title, columns, rows, keys=["candidate"], optional=["args"])
    for result in results:
        if result.get("status") not in ("measured", None):
            render.warn(f"{result['name']}: {result['status']}: {result.get('error', '')}")
            for line in result.get("last_lines") or []:
                render.info(f"  | {line}")
    for item in [*(profile.get("skipped") or []), *(profile.get("left_out") or [])]:
        render.info(f"not tried: {item['name']}: {item['reason']}")
    for note in profile.get("notes") or []:
        render.info(note)
    winner = profile.get("winner") or {}
    flags = " ".join(w for group in winner.get("settings") or [] for w in group)
    render.info(f"winner: {winner.get('name')}{' (' + flags + ')' if flags else ''}: {winner.get('why')}")
    if path is not None:
        render.info(f"profile: {path}")


def listing(found: list[tuple[Path, dict[str, Any] | None, str]]) -> None:
    """tune --show: every profile, its table; one that cannot be read says why."""
    if not found:
        render.info("no tuned profile: `gptoss-patch tune MODEL` makes one")
        return
    for path, raw, problem in found:
        if raw is None:
            render.warn(f"{path}: cannot be used: {problem}")
            continue
        table(raw, path)
