"""`gptoss-patch completion bash|zsh|fish`: the shell completion script, for `eval` or a completions directory."""

from __future__ import annotations

from typing import Annotated

from gptoss_patch import clikit
from gptoss_patch.options import handles_errors

SHELLS = ("bash", "zsh", "fish")


@handles_errors
def completion(shell: Annotated[str, clikit.Argument(metavar="bash|zsh|fish", help="The shell to complete in.")]) -> None:
    """Print the shell completion script for gptoss-patch: commands, options and patch ids.

    bash: eval "$(gptoss-patch completion bash)" in ~/.bashrc. zsh: the same with zsh, in ~/.zshrc.
    fish: gptoss-patch completion fish > ~/.config/fish/completions/gptoss-patch.fish.
    """
    import click
    from click.shell_completion import get_completion_class

    from gptoss_patch.cli import app

    if shell not in SHELLS:
        raise click.BadParameter(f"{shell!r} is not one of {', '.join(SHELLS)}", param_hint="SHELL")
    complete = get_completion_class(shell)
    assert complete is not None  # click ships all three
    clikit.echo(complete(app, {}, "gptoss-patch", "_GPTOSS_PATCH_COMPLETE").source())


def register(app: clikit.App) -> None:
    app.command("completion")(completion)
