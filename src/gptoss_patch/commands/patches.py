"""`gptoss-patch list`: every patch with its id, versions, target, upstream references and summary."""

import typer

from gptoss_patch import registry, render
from gptoss_patch.options import JsonOption, OnlyOption, SkipOption, handles_errors, selection


@handles_errors
def list_patches(only: OnlyOption = None, skip: SkipOption = None, json: JsonOption = False) -> None:
    """List every patch (or those --only/--skip select): id, version range, target file, upstream references, summary."""
    specs = registry.selected(selection(only, skip))
    if json:
        render.json_out([_as_json(s) for s in specs])
        return
    rows = [
        (s.id, s.versions + (f" (fixed upstream in {s.fixed_in})" if s.fixed_in else ""),
         "\n".join(f"vllm/{b.target}" for b in s.bands), "\n".join(s.upstream), f"{s.summary}\n{s.note}".strip(),
         registry.origin(s.id))
        for s in specs
    ]
    render.table(None, ("id", "vllm versions", "target", "upstream", "summary", "origin"), rows)


def _as_json(spec) -> dict:
    return {
        "id": spec.id, "origin": registry.origin(spec.id), "summary": spec.summary, "note": spec.note,
        "upstream": list(spec.upstream),
        "fixed_in": spec.fixed_in, "bands": [{"versions": b.versions, "target": f"vllm/{b.target}"} for b in spec.bands],
    }


def register(app: typer.Typer) -> None:
    app.command("list")(list_patches)
