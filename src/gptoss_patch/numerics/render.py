"""The tables of `gptoss-patch numerics` (through gptoss_patch.render.table: they fit 80 columns)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gptoss_patch.numerics.kernels import KernelReport
    from gptoss_patch.numerics.served import ServedReport


def _g(value: float | None) -> str:
    if value is None:
        return "-"
    if value == 0:
        return "0"
    return f"{value:.2e}"


def _step(value: float | None) -> str:
    """A floor's bf16 step, a power of two, as the bound it sets: `≤2^-3` (0.125)."""
    import math

    if not value:
        return "-"
    exponent = math.log2(value)
    return f"≤2^{exponent:.0f}" if exponent == int(exponent) else f"≤{value:.2g}"


def kernel_rows(report: KernelReport) -> list[list[str]]:
    """A row per result, each layer's floor (exact bf16, "floor") before its kernels' rows of the same token counts."""
    from gptoss_patch.numerics.kernels import floor_ratio

    rows = []
    shown: set[str] = set()
    for result in report.results:
        layer = result["layer"]
        if layer not in shown:
            shown.add(layer)
            for floor in (f for f in report.floors if f["layer"] == layer):
                rows.append(
                    [layer, "floor", str(floor["tokens"]), _g(floor["rel_error"]), _g(floor["max_abs_error"]), "1",
                     _step(floor["step"]), _step(floor["step_first"]) if floor["tokens"] > 1 else "-"]
                )  # fmt: skip
        run_diff = result["max_run_diff"]
        runs = f"same x{result['runs']}" if run_diff == 0 else _g(run_diff)
        ratio = floor_ratio(result, report.floors)
        rows.append(
            [layer, result["backend"], str(result["tokens"]), _g(result["rel_error"]),
             _g(result["max_abs_error"]), "-" if ratio is None else f"{ratio:.2f}", runs, _g(result.get("batch_diff"))]
        )  # fmt: skip
    return rows


def kernel_table(report: KernelReport) -> None:
    from gptoss_patch import render
    from gptoss_patch.numerics.kernels import FLOOR_MULTIPLE, gate

    title = (
        f"kernels on {report.device} (vLLM {report.vllm}), {report.shape.name} layer ({report.shape.experts} experts) "
        f"against float64; {report.seconds:.0f} s"
    )
    columns = ["layer", "backend", "N", "rel err", "max err", "x floor", "reruns", "batch Δ"]
    render.table(title, columns, kernel_rows(report), keys=tuple(columns))  # short values: none wraps
    for verdict in gate(report.results, report.floors):
        worst = "" if verdict.worst_ratio is None else f"; worst {verdict.worst_ratio:.2f}x the floor"
        steps = "" if verdict.worst_step is None else f", differences at most {verdict.worst_step:.2f} of a bf16 step"
        if verdict.passed:
            render.info(f"gate: {verdict.layer} {verdict.backend} passes{worst}{steps}")
        else:
            render.info(f"gate: {verdict.layer} {verdict.backend} FAILS: {'; '.join(verdict.failures)}")
    if report.libraries:
        from gptoss_patch.distinfo import kernel_versions_line

        render.info(kernel_versions_line(report.libraries))
        from gptoss_patch.launcher.knowledge import kernel_library_notes

        for note in kernel_library_notes(report.libraries, report.vllm):  # G50
            render.info(note)
    for item in report.not_run:
        render.info(f"not run: {item['layer']} {item['backend']}: {item['reason']}")
    for line in report.skipped:
        render.info(f"skipped: {line}")
    if report.phases:
        spent = ", ".join(f"{name} {seconds:g} s" for name, seconds in report.phases.items())
        render.info(f"time: {report.seconds:.0f} s in all (the interpreter's start and vLLM's import included); {spent}")
    render.info(
        "N: tokens in the batch; rel err: ||out - ref|| / ||ref||; max err: max |out - ref|; floor: the same layer "
        "computed exactly with bf16 intermediates (bf16 GEMM outputs, activation and expert outputs, fp32 top-k sum); "
        "its reruns and batch Δ columns hold its step, one bf16 unit in the last place at its largest output (the "
        "batch's; the first token's); x floor: rel err over the floor's; reruns: the same input again, bitwise the same or the largest difference; batch Δ: "
        "max |difference| of the first token computed alone and inside the batch (0: batch-invariant). Gate: "
        f"rel err <= {FLOOR_MULTIPLE:g}x the floor at every N, reruns and batch Δ <= the floor's step"
    )


def served_rows(report: ServedReport) -> list[list[str]]:
    return [
        [f"{a.first} ~ {a.second}", f"{a.median_abs:.3g}", f"{a.max_abs:.3g}", f"{100 * a.top1_same:.0f} %",
         f"{a.greedy_same}/{a.prompts}"]
        for a in report.agreements
    ]  # fmt: skip


def served_table(report: ServedReport) -> None:
    from gptoss_patch import render

    positions = report.agreements[0].positions if report.agreements else 0
    title = (
        f"servers: {report.prompts} prompts ({positions} positions), each server twice, {report.parallel} at a time; "
        f"greedy {report.max_tokens} tokens"
    )
    columns = ["pair", "median |Δ|", "max |Δ|", "top-1", "greedy"]
    render.table(title, columns, served_rows(report), keys=tuple(columns))  # short values: none wraps
    render.info(
        "|Δ|: the prompt tokens' logprob differences over every position; top-1: positions whose most likely "
        "token agrees; greedy: prompts whose greedy continuation is the same text"
    )
    for server in report.servers:
        ready = server.get("ready_seconds")
        render.info(f"{server['name']}: ready after {ready:.0f} s; log {server['log']}" if ready else f"{server['name']}: log {server['log']}")
