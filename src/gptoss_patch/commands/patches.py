"""`gptoss-patch list`: every patch with its id, versions, target, upstream references and summary."""

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
from gptoss_patch.spec import PatchSpec


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
        (s.id, s.versions + (f" (fixed upstream in {s.fixed_in})" if s.fixed_in else ""),
         "\n".join(f"vllm/{b.target}" for b in s.bands), "\n".join(s.upstream),
         f"{s.summary}\n{s.note}".strip() + (f"\nopt-in: {s.opt_in}" if s.opt_in else ""), registry.origin(s.id))
        for s in specs
    ]
    columns = ("id", "vllm versions", "target", "upstream", "summary", "origin")
    render.table(None, columns, rows, keys=("id", "target", "upstream"), optional=("target", "upstream"), wide=wide or bool(verbose))


def _as_json(spec: PatchSpec) -> dict:
    return {
        "id": spec.id, "origin": registry.origin(spec.id), "summary": spec.summary, "note": spec.note,
        "upstream": list(spec.upstream), "fixed_in": spec.fixed_in, "opt_in": spec.opt_in,
        "bands": [{"versions": b.versions, "target": f"vllm/{b.target}"} for b in spec.bands],
    }


def register(app: clikit.App) -> None:
    app.command("list")(list_patches)
