"""Results -> terminal (rich, on stderr) or JSON (stdout). The only module that knows rich."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.markup import escape

from gptoss_patch.spec import PatchResult, Report, State

PIPE_WIDTH = 200  # piped output is not cut to 80 columns (COLUMNS, when set, still wins): one row per patch
MIN_WRAPPED = 16  # the narrowest a wrapped column (a reason, a summary) may get before columns are left out
QUIET = False  # -q: info lines are dropped; warnings, errors and results (tables, JSON, diffs) stay


def _console(*, stderr: bool = False, color: str | None = None) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    if color == "always":
        styling: dict[str, Any] = {"force_terminal": True, "no_color": False}
    elif color == "never":
        styling = {"color_system": None, "no_color": True}
    else:  # auto: a terminal gets colour; rich honours NO_COLOR and FORCE_COLOR
        styling = {}
    return Console(stderr=stderr, highlight=False, soft_wrap=True, width=None if stream.isatty() else PIPE_WIDTH, **styling)


err = _console(stderr=True)
out = _console()


def configure(*, quiet: bool = False, color: str | None = None) -> None:
    """-q and --color (clikit calls this before the command runs, only when one of them was given)."""
    global err, out, QUIET  # noqa: PLW0603 - the two consoles are this module's state by design
    QUIET = quiet
    if color is not None:
        err, out = _console(stderr=True, color=color), _console(color=color)


def width(console: Console) -> int:
    """The width a table must fit: the terminal's, else COLUMNS, else PIPE_WIDTH for a pipe or file."""
    if console.is_terminal:
        return console.width
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) > 0 else PIPE_WIDTH

STATE_STYLE = {
    State.APPLIED: "green",
    State.PENDING: "yellow",
    State.NOT_NEEDED: "dim",
    State.FIXED_UPSTREAM: "cyan",
    State.OUT_OF_RANGE: "dim",
    State.DRIFTED: "red",
    State.MODIFIED: "red",
    State.OPT_IN: "dim",
    State.CONFLICT: "red",
}


def error(message: str, hint: str | None = None) -> None:
    err.print(f"[red]error:[/] {escape(message)}")
    if hint:
        err.print(f"[dim]hint:[/] {escape(hint)}")


def detail(text: str) -> None:
    """What an error leaves out of its one line (-v): a subprocess's output, indented and dim."""
    for line in text.splitlines():
        err.print(f"  {escape(line)}", style="dim")


def warn(message: str) -> None:
    err.print(f"[yellow]warning:[/] {escape(message)}")


def info(message: str) -> None:
    if not QUIET:
        err.print(escape(message))


@contextmanager
def spinner(label: str) -> Iterator[None]:
    """A spinner with the elapsed time while a long step runs, on a terminal only (a pipe or a log gets the
    step's own start and end lines, which the caller prints either way); nothing under -q."""
    if QUIET or not err.is_terminal:
        yield
        return
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=err, transient=True) as bar:
        bar.add_task(escape(label), total=None)
        yield


@contextmanager
def downloading(label: str) -> Iterator[None]:
    """A download (wheels.py): a line when it starts, a spinner on a terminal while it runs."""
    info(label[0].upper() + label[1:])
    with spinner(label):
        yield


def json_out(payload: Any) -> None:
    sys.stdout.write(json.dumps(payload, indent=2, sort_keys=False) + "\n")


def table(
    title: str | None, columns: Sequence[str], rows: Iterable[Sequence[str]], *, to_stdout: bool = True,
    keys: Sequence[str] = (), optional: Sequence[str] = (), wide: bool = False,
) -> None:
    """A table that fits the width without splitting a key (an id, a path, a URL: `keys` never wrap).

    The other columns wrap at spaces, never inside a word. When that cannot fit, the `optional` columns
    are left out (last first, with a note); if it still cannot, each row becomes a few lines (its keys,
    then one indented line per other column) that the terminal may wrap but that are never cut. `wide`
    (--wide, -v) keeps every column in a table as wide as it needs.
    """  # fmt: skip
    from rich.table import Table  # only tables need it; keep the hot paths' imports light

    console = out if to_stdout else err
    rows = [tuple(row) for row in rows]
    limit = width(console)
    shown = list(columns)
    while not wide and _needed(columns, rows, shown, keys) > limit and any(c in shown for c in optional):
        shown.remove(next(c for c in reversed(optional) if c in shown))
    if not wide and _needed(columns, rows, shown, keys) > limit:
        _as_lines(console, title, columns, rows, keys)
        return
    grid = Table(title=title, title_justify="left", show_lines=False)
    for column in shown:
        grid.add_column(column, no_wrap=column in keys, overflow="ignore" if column in keys else "fold")
    for row in rows:
        grid.add_row(*(cell for column, cell in zip(columns, row, strict=True) if column in shown))
    console.print(grid, width=max(limit, _needed(columns, rows, shown, keys)) if wide else limit)
    left_out = [c for c in columns if c not in shown]
    if left_out:
        info(f"({', '.join(left_out)} left out to fit {limit} columns: --wide or --json shows {'it' if len(left_out) == 1 else 'them'})")


def _needed(columns: Sequence[str], rows: Sequence[Sequence[str]], shown: Sequence[str], keys: Sequence[str]) -> int:
    """The width a table of the `shown` columns needs: whole keys, and each other column its longest word."""
    from rich.text import Text

    total = 1 + 3 * len(shown)
    for index, column in enumerate(columns):
        if column in shown:
            lines = [Text.from_markup(line).plain for row in rows for line in row[index].split("\n")]
            words = lines if column in keys else [word for line in lines for word in line.split()]
            total += max(len(column), *(len(w) for w in words), 0 if column in keys else MIN_WRAPPED)
    return total


def _as_lines(console: Console, title: str | None, columns: Sequence[str], rows: Sequence[Sequence[str]], keys: Sequence[str]) -> None:
    """A table too wide for the terminal: each row's keys on one line, then `column: value` lines, indented."""
    if title:
        console.print(f"[bold]{escape(title)}[/]")
    heading = [c for i, c in enumerate(columns) if c in keys and not any("\n" in row[i] for row in rows)]
    for row in rows:
        console.print("  ".join(cell for column, cell in zip(columns, row, strict=True) if column in heading and cell))
        for column, cell in zip(columns, row, strict=True):
            if column not in heading and cell.strip():
                for number, line in enumerate(cell.split("\n")):
                    console.print(f"    {column + ':' if number == 0 else ' ' * (len(column) + 1)} {line}")


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


def status_table(report: Report, *, wide: bool = False) -> None:
    rows = [
        (r.id, f"[{STATE_STYLE[r.state]}]{r.state.value}[/]", "\n".join(r.files) or r.file or "-", escape(r.reason))
        for r in report.results
    ]
    table(None, ("patch", "state", "file", "reason"), rows, keys=("patch", "state", "file"), optional=("file",), wide=wide)


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
    table(title, ("check", "result", "detail", "fix", "issue"), rows, to_stdout=to_stdout, keys=("check", "result", "issue"))


def notes(lines: Iterable[str]) -> None:
    if QUIET:
        return
    for line in lines:
        err.print(f"[dim]note:[/] {escape(line)}")


def passthrough(text: str) -> None:
    """vLLM's own log lines and generated scripts: verbatim on stdout, flushed (a log is read live)."""
    sys.stdout.write(text)
    sys.stdout.flush()


def probe_table(probes: Sequence[Any], *, verbose: bool) -> None:
    """Behaviour probes: pass / FAIL / not run, with the evidence; the rendered prompts on --verbose."""
    label = {True: "[green]pass[/]", False: "[red]FAIL[/]", None: "[yellow]not run[/]"}
    table("behaviour", ("patch", "result", "evidence"), [(p.id, label[p.passed], escape(p.evidence)) for p in probes], keys=("patch", "result"))
    if verbose:
        for p in probes:
            if p.detail:
                out.print(f"[bold]{p.id}[/]")
                out.print(escape(p.detail), markup=True)
