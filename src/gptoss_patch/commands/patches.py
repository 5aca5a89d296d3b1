"""`gptoss-patch list`: every patch with its id, versions, target, upstream references and summary."""

import re
from collections.abc import Sequence

from packaging.version import Version

from gptoss_patch import clikit, registry, render
from gptoss_patch.options import (
    JsonOption,
    OnlyOption,
    SkipOption,
    VerboseOption,
    WideOption,
    handles_errors,
    selection,
)
from gptoss_patch.spec import Band, PatchSpec


@handles_errors
def list_patches(
    only: OnlyOption = None, skip: SkipOption = None, json: JsonOption = False, wide: WideOption = False,
    verbose: VerboseOption = 0,
) -> None:
    """List every patch (or those --only/--skip select): id, version range, target file, upstream references, summary.

    Opt-in patches (left out of the default set: apply them with --with ID) say so in their summary. --wide
    (or -v) never leaves a column out: where they cannot all fit, each patch becomes a few lines.
    """
    specs = registry.selected(selection(only, skip), opt_in=True)
    if json:
        render.json_out([_as_json(s) for s in specs])
        return
    rows = [
        (s.id, _versions(s) + (f" (fixed upstream in {s.fixed_in})" if s.fixed_in else ""),
         _targets(s), "\n".join(s.upstream),
         f"{s.summary}\n{s.note}".strip() + (f"\nopt-in: {s.opt_in}" if s.opt_in else ""), registry.origin(s.id))
        for s in specs
    ]
    columns = ("id", "vllm versions", "target", "upstream", "summary", "origin")
    render.table(None, columns, rows, keys=("id", "target", "upstream"), optional=("target", "upstream"), wide=wide or bool(verbose))


_BAND = re.compile(r">=\s*([0-9][0-9.]*)\s*(?:,\s*<\s*([0-9][0-9.]*))?")


def _spans(bands: Sequence[Band]) -> list[tuple[str, str | None, list[Band]]] | None:
    """Contiguous bands joined: (first version, end or None, the bands); None when a band is not `>=A[,<B]`."""
    spans: list[tuple[str, str | None, list[Band]]] = []
    for band in bands:
        match = _BAND.fullmatch(band.versions.strip())
        if match is None:
            return None
        low, high = match.groups()
        if spans and spans[-1][1] is not None and Version(spans[-1][1]) == Version(low):  # <0.22 then >=0.22
            spans[-1] = (spans[-1][0], high, [*spans[-1][2], band])
        else:
            spans.append((low, high, [band]))
    return spans


def _label(low: str, high: str | None) -> str:
    """`0.15.1–0.23.x` for >=0.15.1,<0.24; `0.15.1+` with no end; `0.15.1–<0.25.1` where the end is not a minor's start."""
    if high is None:
        return f"{low}+"
    end = Version(high).release + (0,) * 3
    if end[2:] == (0,) * len(end[2:]) and end[1] > 0:
        return f"{low}–{end[0]}.{end[1] - 1}.x"
    return f"{low}–<{high}"


def _versions(spec: PatchSpec) -> str:
    spans = _spans(spec.bands)
    return spec.versions if spans is None else ", ".join(_label(low, high) for low, high, _ in spans)


def _targets(spec: PatchSpec) -> str:
    """One line per target file; where bands target different files, each says which versions it is for."""
    if len({b.target for b in spec.bands}) == 1:
        return f"vllm/{spec.bands[0].target}"
    runs: list[tuple[str, str, str | None]] = []  # (target, first version, end) over contiguous bands of one file
    for band in spec.bands:
        match = _BAND.fullmatch(band.versions.strip())
        if match is None:
            return "\n".join(f"vllm/{b.target} ({b.versions})" for b in spec.bands)
        low, high = match.groups()
        if runs and runs[-1][0] == band.target and runs[-1][2] is not None and Version(runs[-1][2]) == Version(low):
            runs[-1] = (band.target, runs[-1][1], high)
        else:
            runs.append((band.target, low, high))
    return "\n".join(f"vllm/{target} ({_label(low, high)})" for target, low, high in runs)


def _as_json(spec: PatchSpec) -> dict:
    return {
        "id": spec.id, "origin": registry.origin(spec.id), "summary": spec.summary, "note": spec.note,
        "upstream": list(spec.upstream), "fixed_in": spec.fixed_in, "opt_in": spec.opt_in,
        "bands": [{"versions": b.versions, "target": f"vllm/{b.target}"} for b in spec.bands],
    }


def register(app: clikit.App) -> None:
    app.command("list")(list_patches)
