"""The command-line layer: plain click commands built from annotated functions.

A command is a function whose parameters are `Annotated[type, Option(...)]` or `Annotated[type, Argument(...)]`;
`App.command()` turns it into a `click.Command` (the docstring is the help). This is the small part of Typer the
CLI used, without Typer itself: Typer's releases that vLLM's own dependencies need (fastapi-cli wants 0.26+)
validate every parameter through pydantic at start-up, which cost `status` about 0.1 s on every run; click alone
has no such cost and puts no constraint on vLLM's environment. The root group loads a command's module only when
that command runs (`LazyGroup`), so `status` imports what `status` needs and nothing else.
"""

from __future__ import annotations

import importlib
import inspect
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, Union

import click
from click.exceptions import Exit

__all__ = ["Abort", "App", "Argument", "BadParameter", "Exit", "Group", "LazyGroup", "Option", "echo"]

Abort = click.Abort
BadParameter = click.BadParameter
echo = click.echo
F = TypeVar("F", bound=Callable[..., Any])
CONTEXT = {"help_option_names": ["-h", "--help"]}
_MARKUP = re.compile(r"\[/?(?:bold|dim|red|green|yellow|cyan|italic)?\]")


@dataclass(frozen=True)
class Option:
    """An option's names and help: `Annotated[str | None, Option("--venv", metavar="DIR", help=...)]`."""

    decls: tuple[str, ...]
    help: str | None = None
    metavar: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __init__(self, *decls: str, help: str | None = None, metavar: str | None = None, **extra: Any) -> None:  # noqa: A002 - click's name
        object.__setattr__(self, "decls", decls)
        object.__setattr__(self, "help", help)
        object.__setattr__(self, "metavar", metavar)
        object.__setattr__(self, "extra", extra)


@dataclass(frozen=True)
class Argument:
    """A positional argument; a `list[str]` one takes every remaining word (those after `--` included)."""

    help: str | None = None
    metavar: str | None = None

    def __init__(self, *, help: str | None = None, metavar: str | None = None, show_default: bool = False) -> None:  # noqa: A002, ARG002
        object.__setattr__(self, "help", help)
        object.__setattr__(self, "metavar", metavar)


@dataclass(frozen=True)
class Group:
    """Options declared once that reach a command as one value (pip's option groups):
    `run: Annotated[ServerRun, Group(ServerRun, {"json": (JsonOption, False), ...})]` lists the members, in this
    order, where the parameter stands, and passes `make(**their values)` in its place."""

    make: Callable[..., Any]
    members: Mapping[str, tuple[Any, Any]]  # name -> (the annotated hint, the default)


class _Formatter(click.HelpFormatter):
    """click's help, re-flowed per paragraph, but never broken at a hyphen (`gptoss-` / `patch`, `out-` / `of-range`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from click import _textwrap

        if not getattr(_textwrap.TextWrapper, "whole_words", False):  # click's wrap_text imports it at each call

            class WholeWords(_textwrap.TextWrapper):
                whole_words = True

                def __init__(self, *args: Any, **kwargs: Any) -> None:
                    super().__init__(*args, **{**kwargs, "break_on_hyphens": False, "break_long_words": False})

            _textwrap.TextWrapper = WholeWords  # type: ignore[misc]
        super().__init__(*args, **kwargs)


class _Context(click.Context):
    formatter_class = _Formatter


class _Command(click.Command):
    """A missing argument or required option is one line (click would print the usage and a help hint around it)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.MissingParameter as exc:
            usage = " ".join([ctx.command_path, *self.collect_usage_pieces(ctx)])
            raise click.UsageError(f"{exc.format_message()} Usage: {usage}") from None


def plain(text: str | None) -> str | None:
    """Help text without rich markup (`[bold]x[/]` -> `x`)."""
    return None if text is None else _MARKUP.sub("", text)


def _unwrap(hint: Any) -> tuple[Any, bool]:
    """(base type, is-a-list) of `X | None`, `list[X] | None`, `Optional[list[X]]`."""
    if typing.get_origin(hint) in (Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        hint = args[0] if len(args) == 1 else str
    if typing.get_origin(hint) in (list, tuple, Sequence):
        return (typing.get_args(hint) or (str,))[0], True
    return hint, False


def _click_type(base: Any) -> click.ParamType:
    if base is int:
        return click.INT
    if base is float:
        return click.FLOAT
    if base is Path:
        return click.Path(path_type=Path)
    return click.STRING


def _parameter(name: str, hint: Any, default: Any) -> click.Parameter:
    marker = next((m for m in getattr(hint, "__metadata__", ()) if isinstance(m, Option | Argument)), None)
    base, many = _unwrap(typing.get_args(hint)[0] if marker is not None else hint)
    required = default is inspect.Parameter.empty
    if isinstance(marker, Argument):
        # a required one gets no default at all: click (8.2+) takes an explicit `default=None` as a value given
        defaults = {} if required or many else {"default": default}
        return click.Argument(
            [name], type=_click_type(base), nargs=-1 if many else 1, required=required and not many,
            metavar=marker.metavar, **defaults,
        )  # fmt: skip
    decls = [*(marker.decls if marker else (f"--{name.replace('_', '-')}",)), name]
    extra = dict(marker.extra) if marker else {}
    if extra.pop("count", False):  # -v, -vv: additive
        extra.pop("show_default", None)
        return click.Option(decls, count=True, default=int(default or 0), help=plain(marker.help if marker else None), **extra)
    if base is bool:  # a flag; `--x/--no-x` keeps a None default (neither given)
        paired = any("/" in d for d in decls)
        flag_default = default if paired else bool(default) if not required else False
        extra.pop("show_default", None)
        return click.Option(decls, is_flag=True, default=flag_default, help=plain(marker.help if marker else None), **extra)
    extra.setdefault("show_default", not required and default is not None)  # as Typer did: `[default: 8000]`
    if not required:
        extra["default"] = default
    return click.Option(
        decls, type=_click_type(base), multiple=many, required=required,
        help=plain(marker.help if marker else None), metavar=marker.metavar if marker else None, **extra,
    )  # fmt: skip


def _arguments_help(params: list[click.Parameter], hints: Mapping[str, Any]) -> str:
    """click prints no help for arguments: say them in the command's help, one line each."""
    lines = []
    for param in params:
        marker = next((m for m in getattr(hints.get(param.name or ""), "__metadata__", ()) if isinstance(m, Argument)), None)
        if isinstance(param, click.Argument) and marker is not None and marker.help:
            lines.append(f"{marker.metavar or (param.name or '').upper()}: {plain(marker.help)}")
    return "\b\n" + "\n".join(lines) if lines else ""


def _exits_help(func: Callable[..., Any], name: str, signature: Mapping[str, Any]) -> str:
    """The command's own exit codes (errors.exit_codes_help): 4 derived from --python/--venv, the rest from the table
    errors.py keeps by command (`hook install` is the command `install` of commands/hook.py)."""
    from gptoss_patch.errors import exit_codes_help

    group = func.__module__.rpartition(".")[2]
    command = name if group in (name, name.replace("-", "_"), "patches") else f"{group} {name}"
    return exit_codes_help(command, targets="python" in signature or "venv" in signature)


COLORS = ("auto", "always", "never")


def common_options(*, verbose: bool = False) -> list[click.Parameter]:
    """The output options every command takes (and the root, where `-v` is there too): the last word wins."""
    params: list[click.Parameter] = [
        click.Option(["-q", "--quiet", "quiet"], is_flag=True, default=False, help="Print only errors, warnings and the result (tables, JSON, diffs)."),
        click.Option(
            ["--color", "color"], type=click.Choice(COLORS), default=None, metavar="auto|always|never",
            help="Colour the output: auto (a terminal, unless NO_COLOR is set; FORCE_COLOR forces it), always or never.",
        ),
    ]  # fmt: skip
    if verbose:
        params.append(click.Option(["-v", "--verbose", "verbose"], count=True, default=0, help="More detail; repeat for more (-vv)."))
    return params


def _apply_common(kwargs: dict[str, Any], takes_verbose: bool) -> None:
    """Merge the root's -q/-v/--color into the command's, and hand the result to render (only when set)."""
    ctx = click.get_current_context(silent=True)
    root = ctx.find_root().params if ctx is not None else {}
    quiet = bool(kwargs.pop("quiet", False) or root.get("quiet"))
    color = kwargs.pop("color", None) or root.get("color")
    if takes_verbose and root.get("verbose"):
        kwargs["verbose"] = int(kwargs.get("verbose") or 0) + int(root["verbose"])
    if quiet or color:
        from gptoss_patch import render

        render.configure(quiet=quiet, color=color)


def _options_of(func: Callable[..., Any]) -> tuple[dict[str, tuple[Any, Any]], dict[str, Group]]:
    """{name: (hint, default)} of every option in signature order, each Group's members where it stands; the groups."""
    hints = typing.get_type_hints(func, include_extras=True)
    options: dict[str, tuple[Any, Any]] = {}
    groups: dict[str, Group] = {}
    for p in inspect.signature(func).parameters.values():
        hint = hints.get(p.name, str)
        group = next((m for m in getattr(hint, "__metadata__", ()) if isinstance(m, Group)), None)
        if group is None:
            options[p.name] = (hint, p.default)
        else:
            groups[p.name] = group
            options.update(group.members)
    return options, groups


def build(func: Callable[..., Any], name: str, **attrs: Any) -> click.Command:
    """The click command for `func`: its parameters in signature order, its docstring as the help."""
    options, groups = _options_of(func)
    params = [_parameter(option, hint, default) for option, (hint, default) in options.items()]
    takes_verbose = "verbose" in options
    params += common_options()
    doc = inspect.cleandoc(func.__doc__ or "")
    args_help = _arguments_help(params, {option: hint for option, (hint, _) in options.items()})
    exits = _exits_help(func, name, options)
    help_text = plain("\n\n".join(part for part in (doc, args_help) if part))
    short = plain(doc.split("\n\n", 1)[0].replace("\n", " ")) if doc else None

    def callback(**kwargs: Any) -> Any:
        _apply_common(kwargs, takes_verbose)
        for key, value in kwargs.items():
            if isinstance(value, tuple):  # click's `multiple`/nargs=-1 give tuples; the functions take lists or None
                kwargs[key] = list(value) or None
        for key, group in groups.items():
            kwargs[key] = group.make(**{member: kwargs.pop(member) for member in group.members})
        return func(**kwargs)

    attrs.setdefault("epilog", exits)  # after the options: every --help ends with the command's exit codes
    command = _Command(name, callback=callback, params=params, help=help_text, short_help=short, context_settings=CONTEXT, **attrs)
    command.context_class = _Context
    return command


class App(click.Group):
    """A click group whose `command()` builds from annotations; `add_app` nests a sub-group."""

    context_class = _Context

    def __init__(self, name: str | None = None, **attrs: Any) -> None:
        attrs.setdefault("context_settings", CONTEXT)
        attrs.setdefault("no_args_is_help", True)
        super().__init__(name, **attrs)

    def command(self, name: str | None = None, **attrs: Any) -> Callable[[F], F]:  # type: ignore[override]
        def register(func: F) -> F:
            command_name = name or func.__name__.replace("_", "-")
            self.add_command(build(func, command_name, **attrs))
            return func

        return register

    def add_app(self, sub: App, name: str, help: str) -> None:  # noqa: A002 - click's name
        sub.name = name
        sub.help = help
        sub.short_help = help
        sub.epilog = f"Exit codes: 2 usage error; each command's own in its --help (gptoss-patch {name} COMMAND --help)."
        self.add_command(sub, name)


class LazyGroup(App):
    """The root: `commands/<module>.py` is imported (and its `register(app)` run) only when its command is used."""

    def __init__(self, package: str, modules: dict[str, str], **attrs: Any) -> None:
        super().__init__(**attrs)
        self._package = package
        self._modules = modules  # command name -> module name
        self._loaded: set[str] = set()

    def _load(self, module: str) -> None:
        if module not in self._loaded:
            self._loaded.add(module)
            importlib.import_module(f"{self._package}.{module}").register(self)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(self._modules) | set(self.commands))

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command with signals armed (interrupts.py): an interrupt is one line and 128+N, never click's Abort."""
        from gptoss_patch import interrupts, render

        try:
            with interrupts.armed():
                return super().invoke(ctx)
        except interrupts.Interrupted:
            raise Exit(render.interrupted()) from None

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self._modules:
            self._load(self._modules[cmd_name])
        return self.commands.get(cmd_name)
