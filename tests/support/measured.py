"""The GPU figures docs/performance.md records, read from its tables: what the code's notes quote must be these.

launcher/profiles.py keeps its own copy of the figures (MARLIN_SPEED, MARLIN_ERROR: no GPU here to measure
them again), so a test that compared the code's note with a constant of its own would compare the code with
itself. These readers take each figure from the table that holds the measurement instead, and recompute it
from the table's own columns, so that an edited figure on either side (code or measurement) fails a test.
"""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).parents[2] / "docs" / "performance.md"

SPEED_20B = "The sm90 profile with Marlin (`--fast-moe` today) against vanilla"  # the 20b shape, H100
SPEED_120B = "gpt-oss-120b on one H200 (TP = 1)"
NUMERICS = "Numerics: does the faster profile serve the same model?"


def section(heading: str) -> list[str]:
    """The lines of the `## heading` section (up to the next `## `)."""
    lines = DOC.read_text().splitlines()
    start = lines.index(f"## {heading}")  # ValueError: the section was renamed or removed
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return lines[start + 1 : end]


def tables(heading: str) -> list[list[dict[str, str]]]:
    """Every table of the section, each a list of rows keyed by the header's cells."""
    found: list[list[dict[str, str]]] = []
    block: list[list[str]] = []
    for line in [*section(heading), ""]:
        if line.startswith("|"):
            block.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
            continue
        if block:
            header, _rule, *rows = block
            found.append([dict(zip(header, row)) for row in rows])
            block = []
    return found


def _median(cell: str) -> float:
    """`317.9 (317.7–318.3)` or `230.7 (230.1–231.3), 4.25, 25`: the median, the cell's first number."""
    return float(re.match(r"\s*([0-9.]+)", cell).group(1))  # type: ignore[union-attr]


def one_stream_speedup_20b() -> str:
    """The profile with Marlin against vanilla at one stream, 20b shape ("1.29"), checked against its tok/s."""
    (row,) = [r for r in tables(SPEED_20B)[0] if r["C"] == "1"]
    ratio = row["ratio"]
    computed = _median(row["generation tok/s, profile"]) / _median(row["generation tok/s, vanilla"])
    assert f"{computed:.2f}" == ratio, f"{SPEED_20B}: ratio {ratio} at C=1, its tok/s give {computed:.3f}"
    return ratio


def one_stream_speedup_120b() -> str:
    """`--fast-moe` against vanilla at one stream, 120b shape at TP=1 ("1.86"), checked against its tok/s."""
    (row,) = [r for r in tables(SPEED_120B)[0] if r["C"] == "1"]
    ratio = row["`--fast-moe` / vanilla"]
    computed = _median(row["profile `--fast-moe`"]) / _median(row["vanilla"])
    assert f"{computed:.2f}" == ratio, f"{SPEED_120B}: ratio {ratio} at C=1, its tok/s give {computed:.3f}"
    return ratio


def marlin_error_ratio() -> str:
    """Marlin's MoE error against float64 over Triton's, over the token counts of the kernel table ("1.5")."""
    (table,) = [t for t in tables(NUMERICS) if t and "kernel" in t[0]]
    column = "relative error against float64 at 1 / 8 / 64 / 512 tokens"

    def errors(kernel: str) -> list[float]:
        (row,) = [r for r in table if r["layer"] == "MoE (experts)" and r["kernel"].startswith(kernel)]
        return [float(value) for value in row[column].split("/")]

    marlin, triton = errors("Marlin"), errors("Triton")
    assert len(marlin) == len(triton) == 4, f"{NUMERICS}: Marlin {marlin} against Triton {triton}"
    assert all(m > t for m, t in zip(marlin, triton)), f"{NUMERICS}: Marlin {marlin} against Triton {triton}"
    return f"{sum(marlin) / sum(triton):.1f}"  # the mean error's ratio (1.51-1.56 token count by token count)
