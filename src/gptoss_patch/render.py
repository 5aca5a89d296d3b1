"""Results -> terminal (rich, on stderr) or JSON (stdout). The only module that knows rich."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape

from gptoss_patch.spec import PatchResult, Report, State

# Piped output is not cut to 80 columns: tables stay one row per patch for grep and logs.
err = Console(stderr=True, highlight=False, soft_wrap=True, width=None if sys.stderr.isatty() else 200)
out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 200)

STATE_STYLE = {
    State.APPLIED: "green",
    State.PENDING: "yellow",
    State.NOT_NEEDED: "dim",
    State.FIXED_UPSTREAM: "cyan",
    State.OUT_OF_RANGE: "dim",
    State.DRIFTED: "red",
    State.MODIFIED: "red",
    State.CONFLICT: "red",
}


def error(message: str, hint: str | None = None) -> None:
    err.print(f"[red]error:[/] {escape(message)}")
    if hint:
        err.print(f"[dim]hint:[/] {escape(hint)}")


def warn(message: str) -> None:
    err.print(f"[yellow]warning:[/] {escape(message)}")


def info(message: str) -> None:
    err.print(escape(message))


def json_out(payload: Any) -> None:
    sys.stdout.write(json.dumps(payload, indent=2, sort_keys=False) + "\n")


def table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[str]], *, to_stdout: bool = True) -> None:
    from rich.table import Table  # only tables need it; keep the hot paths' imports light

    grid = Table(title=title, title_justify="left", show_lines=False)
    for column in columns:
        grid.add_column(column, overflow="fold")
    for row in rows:
        grid.add_row(*row)
    (out if to_stdout else err).print(grid)


def detected(report: Report) -> None:
    inst = report.installation
    info(f"Detected {inst.label} at {inst.site_packages} (python {inst.python})")
    identity = report.identity
    if identity is not None and identity.evidence:  # only builds that are not stock vllm need evidence
        if identity.release:
            info(identity.evidence)
        else:
            warn(f"{identity.evidence}; apply writes to it only with --allow-unknown-version")
    for other in inst.shadowed:
        warn(f"another vllm is installed later on sys.path and is shadowed: {other}")
    for notice in report.notices:
        warn(notice)


def status_table(report: Report) -> None:
    rows = [
        (r.id, f"[{STATE_STYLE[r.state]}]{r.state.value}[/]", "\n".join(r.files) or r.file or "-", escape(r.reason))
        for r in report.results
    ]
    table(None, ("patch", "state", "file", "reason"), rows)


def report_json(report: Report, **extra: Any) -> None:
    identity = report.identity.to_json() if report.identity is not None else {}
    json_out({"vllm": {**report.installation.to_json(), **identity}, "patches": [r.to_json() for r in report.results], **extra})


def narrate(results: Sequence[PatchResult], *, verb: str, dry_run: bool = False) -> None:
    """`Patched <file> (<id>)` for what changed; `Would patch ...` under --dry-run."""
    for r in results:
        if r.changed:
            info(f"{'Would ' + verb.lower().removesuffix('ed') if dry_run else verb} {', '.join(r.files) or r.file} ({r.id})")
        for w in r.warnings:
            warn(f"{r.id}: {w}")


def tally(results: Sequence[PatchResult]) -> str:
    counts: dict[str, int] = {}
    for r in results:
        key = "changed" if r.changed else r.state.value
        counts[key] = counts.get(key, 0) + 1
    return ", ".join(f"{n} {k}" for k, n in counts.items()) or "no patches selected"


# -- launcher: serve / doctor / smoke ------------------------------------------------------------

CHECK_STYLE = {"pass": "green", "warn": "yellow", "fail": "red"}


def checks_table(checks: Sequence[Any], *, title: str | None = None, to_stdout: bool = True) -> None:
    """Pre-flight or smoke verdicts (launcher.results.Check): name, result, detail, fix, known issue."""
    rows = [
        (escape(c.name), f"[{CHECK_STYLE[c.status.value]}]{c.status.value}[/]", escape(c.message), escape(c.fix), c.issue)
        for c in checks
    ]
    table(title, ("check", "result", "detail", "fix", "issue"), rows, to_stdout=to_stdout)


def notes(lines: Iterable[str]) -> None:
    for line in lines:
        err.print(f"[dim]note:[/] {escape(line)}")


def passthrough(text: str) -> None:
    """vLLM's own log lines and generated scripts: verbatim on stdout, flushed (a log is read live)."""
    sys.stdout.write(text)
    sys.stdout.flush()


def probe_table(probes: Sequence[Any], *, verbose: bool) -> None:
    """Behaviour probes: pass / FAIL / not run, with the evidence; the rendered prompts on --verbose."""
    label = {True: "[green]pass[/]", False: "[red]FAIL[/]", None: "[yellow]not run[/]"}
    table("behaviour", ("patch", "result", "evidence"), [(p.id, label[p.passed], escape(p.evidence)) for p in probes])
    if verbose:
        for p in probes:
            if p.detail:
                out.print(f"[bold]{p.id}[/]")
                out.print(escape(p.detail), markup=True)
