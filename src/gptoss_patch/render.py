"""Results -> terminal (rich, on stderr) or JSON (stdout). The only module that knows rich."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape

from gptoss_patch.errors import GptossPatchError
from gptoss_patch.spec import PatchResult, Report, State

if TYPE_CHECKING:  # bench is imported when `bench` runs, never for the other commands
    from gptoss_patch.bench import BenchReport, Stat
    from gptoss_patch.bench.bound import Bound

PIPE_WIDTH = 200  # piped output is not cut to 80 columns (COLUMNS, when set, still wins): one row per patch
MIN_WRAPPED = 16  # the narrowest a wrapped column (a reason, a summary) may get before columns are left out
QUIET = False  # -q: info lines are dropped; warnings, errors and results (tables, JSON, diffs) stay


def _console(*, stderr: bool = False, color: str | None = None) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    if color == "always":
        styling: dict[str, Any] = {"force_terminal": True, "no_color": False}
    elif color == "never" or (color is None and os.environ.get("NO_COLOR")):  # NO_COLOR: no bold or dim either
        styling = {"color_system": None, "no_color": True}
    else:  # auto: a terminal gets colour; rich honours FORCE_COLOR
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
    State.ORPHANED: "red",
}


def error(message: str, hint: str | None = None) -> None:
    err.print(f"[red]error:[/] {escape(message)}")
    if hint:
        err.print(f"[dim]hint:[/] {escape(hint)}")


def failure(exc: GptossPatchError, *, verbose: int = 0, as_json: bool = False) -> int:
    """The one error path: every error a command ends with is shown here; returns its exit code.

    One line (the message's first; the rest and `detail` only under -v) and its hint; then the error's
    `last_lines`, unless `detail` holds the whole output they end (then -v shows that); under --json also the one
    JSON shape on stdout, {"error": {code, message, hint, last_lines}}, so a pipe never reads an empty document."""
    message, more = one_line(str(exc), exc.detail)
    hint = exc.hint
    if more and not verbose:
        hint = f"{hint}; -v shows the details" if hint else "re-run with -v for the details"
    error(message, hint)
    if more and verbose:
        detail(more)
    elif not exc.detail:
        for line in exc.last_lines:
            info(f"  | {line}")
    if as_json:
        error_json(int(exc.exit_code), message, hint, exc.last_lines)
    return int(exc.exit_code)


def interrupted(*, as_json: bool = False) -> int:
    """A signal ended the command (interrupts.py gives the line and the code): the line, once; returns 128+N."""
    from gptoss_patch import interrupts

    line, code = interrupts.ending()
    if line is not None:
        error(line)
    if as_json:
        error_json(code, interrupts.message())
    return code


def error_json(code: int, message: str, hint: str | None = None, last_lines: Sequence[str] = ()) -> None:
    """The one JSON shape of an error, on stdout: {"error": {code, message, hint, last_lines}}."""
    json_out({"error": {"code": code, "message": message, "hint": hint, "last_lines": list(last_lines)}})


def one_line(message: str, more: str | None = None) -> tuple[str, str]:
    """The error line (the message's first line) and everything else, which only -v shows."""
    first, *rest = message.strip().splitlines() or ["unknown error"]
    lines = [*rest, *(more or "").splitlines()]
    return first, "\n".join(line.rstrip() for line in lines if line.strip())


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
    then one indented `column: value` line per other column, wrapped at spaces). `wide` (--wide, -v) never
    leaves a column out: a table that cannot fit with all of them becomes those lines instead.
    """  # fmt: skip
    from rich.table import Table  # only tables need it; keep the hot paths' imports light

    console = out if to_stdout else err
    rows = [tuple(row) for row in rows]
    limit = width(console)
    if not console.is_terminal:
        console.width = limit  # a pipe's console is made PIPE_WIDTH wide; COLUMNS may ask for more, and rich
        # would squeeze fixed-width columns (to nothing) into the console's width rather than the table's
    shown = list(columns)
    while not wide and _needed(columns, rows, shown, keys) > limit and any(c in shown for c in optional):
        shown.remove(next(c for c in reversed(optional) if c in shown))
    if _needed(columns, rows, shown, keys) > limit:
        _as_lines(console, title, columns, rows, keys, limit)
        return
    grid = Table(title=title, title_justify="left", show_lines=False)
    widths = _widths(columns, rows, shown, keys, limit)
    for column in shown:
        # fixed widths, each at least the column's longest word: rich never folds a word nor cuts a key
        grid.add_column(column, width=widths[column], no_wrap=column in keys, overflow="ignore" if column in keys else "fold")
    for row in rows:
        grid.add_row(*(cell for column, cell in zip(columns, row, strict=True) if column in shown))
    console.print(grid, width=limit)
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


def _plain_lines(cell: str) -> list[str]:
    from rich.text import Text

    return [Text.from_markup(line).plain for line in cell.split("\n")]


def _widths(
    columns: Sequence[str], rows: Sequence[Sequence[str]], shown: Sequence[str], keys: Sequence[str], limit: int
) -> dict[str, int]:
    """Each shown column's width: keys their longest line; the others at least their longest word (as `_needed`
    counts them), and what is left of `limit` shared out by how much longer their lines are."""
    low: dict[str, int] = {}
    high: dict[str, int] = {}
    for index, column in enumerate(columns):
        if column in shown:
            lines = [line for row in rows for line in _plain_lines(row[index])]
            words = lines if column in keys else [word for line in lines for word in line.split()]
            high[column] = max(len(column), *(len(line) for line in lines))
            low[column] = min(high[column], max(len(column), *(len(w) for w in words), 0 if column in keys else MIN_WRAPPED))
    spare = limit - (1 + 3 * len(shown)) - sum(low.values())
    widths = dict(low)
    while spare > 0:
        growing = [c for c in shown if widths[c] < high[c]]
        if not growing:
            break
        wants = sum(high[c] - widths[c] for c in growing)
        for column in growing:
            more = min(high[column] - widths[column], max(1, spare * (high[column] - widths[column]) // wants), spare)
            widths[column] += more
            spare -= more
            if spare <= 0:
                break
    return widths


def _wrapped(text: Any, width: int) -> list[Any]:
    """`text` (a rich Text) cut into lines of at most `width` at spaces, never inside a word (a longer word
    stands alone on its line)."""
    import re

    plain = text.plain
    offsets = []
    start = 0
    for word in re.finditer(r"\S+", plain):
        if word.end() - start > width and word.start() > start:
            offsets.append(word.start())
            start = word.start()
    lines = list(text.divide(offsets))
    for line in lines:
        line.rstrip()
    return lines


def _as_lines(
    console: Console, title: str | None, columns: Sequence[str], rows: Sequence[Sequence[str]], keys: Sequence[str], limit: int
) -> None:
    """A table too wide for the terminal: each row's first keys on one line (as many as fit), then `column: value`
    lines, indented, the values wrapped at spaces to the width: a key, a path or a URL is never cut."""
    from rich.text import Text

    if title:
        console.print(f"[bold]{escape(title)}[/]")
    heading = [c for i, c in enumerate(columns) if c in keys and not any("\n" in row[i] for row in rows)]
    records = [dict(zip(columns, row, strict=True)) for row in rows]

    def fits(first: list[str]) -> bool:
        return all(len("  ".join(Text.from_markup(cells[c]).plain for c in first if cells[c])) <= limit for cells in records)

    first = next((heading[:n] for n in range(len(heading), 1, -1) if fits(heading[:n])), heading[:1])  # the same keys on every row
    for cells in records:
        console.print(Text("  ").join(Text.from_markup(cells[c]) for c in first if cells[c]))
        for column, cell in cells.items():
            if column in first or not cell.strip():
                continue
            label = f"    {column}: "
            for number, line in enumerate(cell.split("\n")):
                for part, piece in enumerate(_wrapped(Text.from_markup(line), max(limit - len(label), 1))):
                    console.print(Text(label if number == part == 0 else " " * len(label)) + piece)


def detected(report: Report) -> None:
    inst = report.installation
    info(f"Detected {inst.label} at {inst.site_packages} (python {inst.python})")
    identity = report.identity
    if identity is not None and identity.evidence:  # only builds that are not stock vllm need evidence
        if identity.release:
            info(identity.evidence)
        else:
            warn(f"{identity.evidence}; apply writes to it only with --allow-unknown-version")
    elif identity is not None and identity.unverified:  # stock vllm, but newer than (or between) the checked releases
        warn(f"{identity.unverified}: these verdicts come from the shape of its code alone (unchecked); "
             "apply writes to it only with --allow-unknown-version")
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


def tally(results: Sequence[PatchResult], *, verb: str = "changed") -> str:
    """`7 patched, 1 opt-in, 2 out-of-range, 1 not-needed`: what the command changed under its verb (patched,
    reverted), then every other patch by its state, in the order of State: apply and revert count alike."""
    order = [verb, *(state.value for state in State)]
    counts = dict.fromkeys(order, 0)
    for r in results:
        counts[verb if r.changed else r.state.value] += 1
    return ", ".join(f"{n} {key}" for key, n in counts.items() if n) or "no patches selected"


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
    rows = [(p.id, label[p.passed], escape(p.evidence + (f"\nfix: {p.fix}" if p.fix else ""))) for p in probes]
    table("behaviour", ("patch", "result", "evidence"), rows, keys=("patch", "result"))
    if verbose:
        for p in probes:
            if p.detail:
                out.print(f"[bold]{p.id}[/]")
                out.print(escape(p.detail), markup=True)


# -- bench -------------------------------------------------------------------------------------------


def bench_table(report: BenchReport, notes: Sequence[str] = ()) -> None:
    """Per concurrency and server: medians over the rounds (min-max), the ratio, generation per GPU when the servers
    use different GPU counts, figures --stream-interval distorts marked *; then the notes, the KV-cache sizes, each
    server's start and log."""
    from gptoss_patch.bench import COMPARISONS
    from gptoss_patch.bench.recipe import stream_interval
    from gptoss_patch.bench.stats import gpu_counts, kv_cache_note, per_gpu

    names = [s["name"] for s in report.servers]
    baseline = next((name for name in names if name in COMPARISONS), None)
    variants = [name for name in names if name != "profile" and name not in COMPARISONS]
    ratio_header = (
        f"ratio (profile/{baseline}; variant/profile)" if baseline and variants
        else f"profile/{baseline}" if baseline
        else "variant/profile" if variants
        else ""
    )  # fmt: skip

    def stat(value: Stat, digits: int = 1) -> str:
        if value.low == value.high:
            return f"{value.median:.{digits}f}"
        return f"{value.median:.{digits}f} ({value.low:.{digits}f}-{value.high:.{digits}f})"

    counts = gpu_counts(report.servers)
    distorted = {s["name"] for s in report.servers if stream_interval(s.get("command") or ()) > 1}
    columns = ["C", "server", "prefill tok/s", "generation tok/s", "peak tok/s", "TPOT ms"] + (
        [ratio_header] if ratio_header else []
    ) + (["generation tok/s per GPU"] if counts else [])
    rows = []
    for row in report.rows:
        ratio = row.ratio_text()
        rows.append(
            [
                str(row.concurrency),
                row.server,
                stat(row.prefill, 0),
                stat(row.generation),
                stat(row.peak, 0) + (" *" if row.server in distorted else ""),
                stat(row.tpot_ms, 2),
            ]
            + ([ratio] if ratio_header else [])
            + ([f"{per_gpu(row, counts):.1f} ({counts[row.server]} GPU)"] if counts else [])
        )
    workload = report.workload
    title = (
        f"medians over {workload['repeat']} rounds (min-max); {workload['input_len']} in / {workload['output_len']} out tokens, "
        f"{workload['waves']} prompts per stream"
    )
    table(title, columns, rows)
    for row in report.rows:
        for round_ in row.ttft_outliers:
            median = row.ttft_ms.median if row.ttft_ms else 0.0
            against = "its other round(s)" if row.rounds > 1 else "the other servers at this concurrency"
            warn(f"{row.server} at C={row.concurrency}, round {round_ + 1}: time to first token stalled (more than "
                 f"3x {against}; median {median:.0f} ms): that round's generation tok/s is low from prefill "
                 "queueing; compare TPOT")
    for note in notes:
        info(note)
    differ, kv_text = kv_cache_note(report.servers)
    if kv_text:
        (warn if differ else info)(kv_text)
    for server in report.servers:
        ready = server["ready_seconds"]
        info(
            f"{server['name']}: ready after {ready:.0f} s; log {server['log']}"
            if ready is not None
            else f"{server['name']}: log {server['log']}"
        )


def bench_bound(limit: Bound, fractions: dict[str, float], gpus: dict[str, int] | None = None) -> None:
    """--bound: the bytes a decode step reads, the per-GPU bandwidth, and each server's share of the bound of all the
    GPUs it uses."""
    parts = limit.bytes
    info(
        f"bound at concurrency 1: {parts.total / 1e9:.3f} GB a token (experts {parts.experts / 1e9:.3f}, attention "
        f"{parts.attention / 1e9:.3f}, lm_head {parts.lm_head / 1e9:.3f}, KV at {parts.context} tokens "
        f"{parts.kv_cache / 1e9:.3f}, other {parts.other / 1e9:.3f}) at {limit.bandwidth.gb_per_s:.0f} GB/s per GPU "
        f"({limit.bandwidth.device}): {limit.ms_per_token:.2f} ms a token on one GPU"
    )
    for server, fraction in fractions.items():
        count = (gpus or {}).get(server, 1)
        over = (f" of its {count} GPUs ({count} x {limit.bandwidth.gb_per_s:.0f} GB/s: {limit.ms_per_token / count:.2f} ms a token)"
                if count > 1 else "")
        info(f"{server}: decode at concurrency 1 runs at {fraction:.0%} of the bound{over}")
