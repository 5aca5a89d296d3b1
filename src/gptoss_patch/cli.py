"""The root command: commands live in commands/<name>.py (each exposes `register(app)`), loaded when used."""

from __future__ import annotations

import os
import sys

import click

from gptoss_patch import __version__, commands, interrupts
from gptoss_patch.clikit import LazyGroup, common_options

# A module whose command has another name (`list` is a builtin's name, so its module is patches.py).
_COMMAND_NAMES = {"patches": "list"}


def _modules() -> dict[str, str]:
    """Command name -> module name, from the file names alone (nothing imported)."""
    names = (entry.name.removesuffix(".py") for entry in os.scandir(commands.__path__[0]) if entry.name.endswith(".py"))
    return {_COMMAND_NAMES.get(name, name): name for name in names if not name.startswith("_")}


def _version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(f"gptoss-patch {__version__}")
        ctx.exit()


app = LazyGroup(
    commands.__name__,
    _modules(),
    name="gptoss-patch",
    help="""Make gpt-oss serve correctly on stock vLLM: version-keyed, verifiable, reversible patches.

Typical use: gptoss-patch apply --vllm 0.17.1, gptoss-patch status, gptoss-patch serve openai/gpt-oss-120b. The target is the active virtualenv unless --venv or --python say otherwise; gptoss-patch never imports vLLM itself.""",  # noqa: E501 - click re-wraps each paragraph to the terminal
    epilog="Exit codes: 0 ok, 1 action needed, 2 usage error, 3 a patch failed, 4 target problem (interpreter, vLLM, version), "
    "5 conflict (a file changed behind our back, an untrusted ledger), 6 locked, 7 the filesystem refused a write; "
    "each command's --help lists its own.",
    params=[
        click.Option(
            ["--version", "-V"], is_flag=True, expose_value=False, is_eager=True, callback=_version,
            help="Show the version and exit.",
        ),
        *common_options(verbose=True),
    ],
    callback=lambda **_: None,  # the options are read by each command (clikit._apply_common)
)


def main() -> None:
    """The console script: a signal at any moment ends with one line and 128+N (interrupts.py)."""
    interrupts.install()
    try:
        try:
            app(prog_name="gptoss-patch")
        finally:
            interrupts.closing()
    except SystemExit:
        if interrupts.received() is None:
            raise
    if interrupts.received() is not None:  # one that came while parsing, or after the command's own end
        from gptoss_patch import render

        sys.exit(render.interrupted())
