"""`gptoss-patch capture NAME`: your hand edits to the installed vLLM, as a version-keyed patch file."""

from pathlib import Path
from typing import Annotated

from gptoss_patch import clikit, render
from gptoss_patch.errors import ExitCode
from gptoss_patch.options import (
    JsonOption,
    PythonOption,
    VenvOption,
    VerboseOption,
    VllmOption,
    handles_errors,
    installation,
)

DirOption = Annotated[Path, clikit.Option("--dir", metavar="DIR", help="The directory to write to. Here: DIR/NAME.diff (a patch directory).")]
FilesOption = Annotated[
    list[str] | None,
    clikit.Option("--files", metavar="PATH", help="Capture only these files of the vllm package (repeatable).", show_default=False),
]
RangeOption = Annotated[
    str | None,
    clikit.Option(
        "--vllm-range", metavar="SPECIFIERS", show_default=False,
        help="The vLLM versions the patch is for (PEP 440, e.g. '>=0.17,<0.19'). Default: the installed release.",
    ),
]
FromOption = Annotated[
    Path | None,
    clikit.Option(
        "--from", metavar="WHEEL", show_default=False,
        help="A local file to use instead of a download. Here: the installed release's wheel, for the pristine text of "
        "the files (checked against RECORD). "
        "Default: the wheel cache, where `pip download --no-deps DIST==VERSION` fetches it when a file needs it.",
    ),
]
NoDownloadOption = Annotated[
    bool,
    clikit.Option("--no-download", help="Never download the release's wheel: without --from, capture needs it cached."),
]


@handles_errors
def capture(
    name: Annotated[str, clikit.Argument(help="The patch's name: the file is DIR/NAME.diff.")],
    directory: DirOption = Path("."),
    files: FilesOption = None, vllm_range: RangeOption = None, from_wheel: FromOption = None, no_download: NoDownloadOption = False,
    python: PythonOption = None, venv: VenvOption = None, vllm: VllmOption = None,
    json: JsonOption = False, verbose: VerboseOption = False,
) -> None:
    """Write your edits to the installed vLLM (files that differ from its RECORD and from what gptoss-patch
    wrote) as one unified diff DIR/NAME.diff, applied again by `apply --patch-dir DIR` after every reinstall.

    New text files inside the vllm package are captured as file creations; deleted files are reported, not captured.

    The pristine text of a file gptoss-patch never wrote comes from the installed release's wheel: --from
    WHEEL, else gptoss-patch's wheel cache, where it is downloaded on a miss (pip download --no-deps
    DIST==VERSION with the target's platform; pip's index settings apply). --no-download never downloads.

    Exit 1 when there is nothing to capture. The capture is recorded as applied, so `status --patch-dir DIR`
    shows it and `revert --only NAME` takes it out.
    """
    from gptoss_patch.engine.capture import capture as run

    inst = installation(python, venv, vllm)
    result = run(inst, name, directory, files=tuple(files or ()), versions=vllm_range, pristine=from_wheel,
                 download=not no_download, downloading=render.downloading)
    for rel, why in result.skipped:
        render.warn(f"{rel} {why}")
    if json:
        render.json_out({**result.to_json(), "captured": bool(result.files)})
    if not result.files:
        render.info(f"nothing to capture: every file of {inst.label} matches its RECORD or what gptoss-patch wrote")
        raise clikit.Exit(int(ExitCode.ACTION_NEEDED))
    listed = ", ".join(f"{rel} (new)" if rel in result.created else rel for rel in result.files)
    render.info(f"Wrote {result.path} ({len(result.files)} file(s): {listed}; for vllm {result.versions})")


def register(app: clikit.App) -> None:
    app.command()(capture)
