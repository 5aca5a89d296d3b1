"""`gptoss-patch model random OUT --shape tiny|20b|120b [--dtype bf16|mxfp4] [--no-weights]`: a random-weight gpt-oss
checkpoint, or its directory without the weights for vLLM's `--load-format dummy`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from gptoss_patch import clikit
from gptoss_patch.options import JsonOption, PythonOption, VenvOption, VocabOption, handles_errors

model_app = clikit.App()

ShapeOption = Annotated[
    str,
    clikit.Option(
        "--shape",
        metavar="tiny|20b|120b",
        help="Model shape: tiny (about 210 MB), or gpt-oss-20b's / -120b's published shape.",
    ),
]
DtypeOption = Annotated[
    str | None,
    clikit.Option(
        "--dtype",
        metavar="bf16|mxfp4",
        help="Expert weights: bf16, or MXFP4 blocks and scales as released. Default: bf16 for tiny, mxfp4 otherwise.",
        show_default=False,
    ),
]
ForceOption = Annotated[
    bool,
    clikit.Option("--force", help="Go ahead where a safety check refuses. Here: replace OUT if it exists and is not empty "
                  "(only once the new model is complete)."),
]
NoWeightsOption = Annotated[
    bool,
    clikit.Option(
        "--no-weights",
        help="Write config.json, generation_config.json and the tokenizer, no safetensors: a directory for vLLM's "
        "--load-format dummy (pass it after -- to serve, bench, tune), which makes random weights of the shape at load. "
        "Seconds whatever the shape; --dtype still picks the quantization_config, so vLLM takes the same MoE path; "
        "--python/--venv still pick the interpreter, whose transformers writes the tokenizer.",
    ),
]


@model_app.command("random")
@handles_errors
def random(
    out: Annotated[Path, clikit.Argument(help="Directory to write the checkpoint to.", show_default=False)],
    shape: ShapeOption = "tiny",
    dtype: DtypeOption = None,
    force: ForceOption = False,
    no_weights: NoWeightsOption = False,
    vocab_file: VocabOption = None,
    python: PythonOption = None,
    venv: VenvOption = None,
    json: JsonOption = False,
) -> None:
    """Write a gpt-oss checkpoint with random weights, offline: the released layout and tokenizer, noise for weights.

    Config keys, tensor names and shapes, MXFP4 experts (uint8 *_blocks and e8m0 *_scales) and the o200k_harmony tokenizer are those of the published checkpoints, so a stack (kernels, backends, the launcher, patches, throughput) can be checked before downloading 13-65 GB. The weights are made by the target interpreter (torch, transformers and safetensors; on its GPU when it sees one) in a directory beside OUT, renamed into place when complete.

    With --no-weights only config.json, generation_config.json and the tokenizer are written (no safetensors, no index): vLLM then needs --load-format dummy, and serve and doctor warn on the model row without it.
    """  # noqa: E501 - rich keeps a docstring's line breaks, so each paragraph is one line
    from gptoss_patch import model, render, target, vocab

    recipe = model.recipe_for(shape, dtype)
    interpreter = target.interpreter_for(python, venv)
    import os

    chosen = vocab.choose(os.environ, explicit=vocab_file, prefix=Path(interpreter).parent.parent)
    if chosen.file is None:
        from gptoss_patch.errors import UsageError

        raise UsageError(f"cannot use a harmony vocabulary: {chosen.status.reason}", hint=vocab.FIX)
    vocabulary = chosen.file
    model.check_destination(out, force=force)
    size = model.checkpoint_bytes(recipe) / 2**30
    if not json:
        what = "config and tokenizer, no weights" if no_weights else f"{size:.2f} GiB"
        render.info(f"Building {recipe.name} ({recipe.experts} experts, {what}) with {interpreter} ...")
    built = model.build(interpreter, out, recipe, vocabulary, force=force, weights=not no_weights)
    stamp = model.read_stamp(built) or {}
    if json:
        render.json_out({"out": str(built), "shape": shape, "experts": recipe.experts, **stamp})
        return
    seconds = stamp.get("build_seconds")
    took = f" in {seconds} s" if seconds is not None else ""
    if no_weights:
        render.info(f"Wrote {built}: config.json, generation_config.json and the tokenizer, no weights{took}; "
                    f"serve it with --load-format dummy (vLLM makes {size:.2f} GiB of random weights at load)")
        return
    render.info(
        f"Wrote {built}: {stamp.get('parameters')} parameters, {int(stamp.get('bytes') or 0) / 2**30:.2f} GiB on {stamp.get('device')}"
        + took
    )


def register(app: clikit.App) -> None:
    app.add_app(model_app, name="model", help="Random-weight gpt-oss checkpoints in the released layout (offline).")
