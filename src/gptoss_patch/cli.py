"""The Typer app: assembled here, commands live in commands/<name>.py (each exposes `register(app)`)."""

from __future__ import annotations

import importlib
import pkgutil

import typer

from gptoss_patch import __version__, commands

app = typer.Typer(
    name="gptoss-patch",
    rich_markup_mode="rich",
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gptoss-patch {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", "-V", callback=_version, is_eager=True, help="Show the version and exit."),
) -> None:
    """Make gpt-oss serve correctly on stock vLLM: version-keyed, verifiable, reversible patches.

    Typical use: [bold]gptoss-patch apply --vllm 0.17.1[/], [bold]gptoss-patch status[/], [bold]gptoss-patch serve openai/gpt-oss-120b[/]. The target is the active virtualenv unless --venv/--python say otherwise; vllm is never imported by gptoss-patch itself.

    Exit codes: 0 ok · 1 action needed · 2 usage · 3 patch failed · 4 target (interpreter, vLLM, version) · 5 conflict (file changed behind our back, untrusted ledger) · 6 locked · 7 the filesystem refused a write.
    """  # noqa: E501 - rich keeps a docstring's line breaks, so each paragraph is one line


def _register_commands() -> None:
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda i: i.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"{commands.__name__}.{info.name}").register(app)


_register_commands()


def main() -> None:
    app()
