"""Reusable option aliases and the glue every command shares: target resolution and error rendering."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import click

from gptoss_patch import clikit
from gptoss_patch.errors import GptossPatchError

if TYPE_CHECKING:  # imported when a command runs
    from gptoss_patch import userpatches
    from gptoss_patch.spec import Selection
    from gptoss_patch.target import Installation

PythonOption = Annotated[
    str | None, clikit.Option("--python", metavar="PATH", help="Target this interpreter's environment.", show_default=False)
]
VenvOption = Annotated[
    str | None, clikit.Option("--venv", metavar="DIR", help="Target this virtualenv.", show_default=False)
]
VllmOption = Annotated[
    str | None,
    clikit.Option("--vllm", metavar="VERSION", help="Fail unless the installed vLLM is exactly this version.", show_default=False),
]


def _patch_ids(_ctx: object, _param: object, incomplete: str) -> list[str]:
    """Shell completion for --only/--skip: the patch ids."""
    from gptoss_patch import registry

    return [spec.id for spec in registry.all_specs() if spec.id.startswith(incomplete)]


OnlyOption = Annotated[
    list[str] | None,
    clikit.Option("--only", metavar="ID", help="Act on this patch only (repeatable).", shell_complete=_patch_ids),
]
SkipOption = Annotated[
    list[str] | None,
    clikit.Option("--skip", metavar="ID", help="Leave this patch out (repeatable).", shell_complete=_patch_ids),
]
WithOption = Annotated[
    list[str] | None,
    clikit.Option("--with", metavar="ID", help="Also act on this opt-in patch (repeatable; `list` marks them).",
                  shell_complete=_patch_ids),
]
HookModeOption = Annotated[  # hook install, venv create
    str | None,
    clikit.Option(
        "--mode", metavar="fail|apply|warn",
        help="What a vLLM process does when patches are missing: refuse to start (fail, the default), "
        "re-apply them first (apply), or log and go on (warn). Default: keep the installed mode.",
        show_default=False,
    ),
]
PatchDirOption = Annotated[
    list[str] | None,
    clikit.Option(
        "--patch-dir", metavar="DIR",
        help="A directory of your own patches (NAME.diff, from `gptoss-patch capture`); repeatable. "
        "Default: GPTOSS_PATCH_DIRS, else [tool.gptoss-patch] patch-dirs in the nearest pyproject.toml.",
    ),
]
VocabOption = Annotated[
    Path | None,
    clikit.Option(
        "--vocab", metavar="DIR|FILE",
        help="The harmony vocabulary: a directory holding o200k_base.tiktoken, or the file. Default: TIKTOKEN_ENCODINGS_BASE "
        "or TIKTOKEN_RS_CACHE_DIR, else `vocab install`'s copy in gptoss-patch's cache, else the target environment's own.",
        show_default=False,
    ),
]
JsonOption = Annotated[bool, clikit.Option("--json", help="Print machine-readable JSON on stdout.")]
VerboseOption = Annotated[
    int, clikit.Option("--verbose", "-v", count=True, help="More detail (repeatable, -vv); tracebacks for unexpected errors.")
]
WideOption = Annotated[
    bool,
    clikit.Option("--wide", help="Never leave a column out to fit the terminal: a table that cannot fit becomes a few "
                  "lines per row (-v does too)."),
]

F = TypeVar("F", bound=Callable[..., Any])


def handles_errors(func: F) -> F:
    """Every error a command ends with goes to the one error path (render.failure): one red line (plus hint) on
    stderr, the error's last lines, the JSON error under --json, and its exit code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (clikit.Exit, clikit.Abort, click.ClickException):
            raise
        except KeyboardInterrupt:  # interrupts.Interrupted: SIGINT, SIGTERM, SIGHUP
            raise clikit.Exit(_interrupted(kwargs)) from None
        except GptossPatchError as exc:
            from gptoss_patch import interrupts, render

            if interrupts.received() is not None:  # a child the signal reached too failed: the signal is the cause
                raise clikit.Exit(_interrupted(kwargs)) from None
            raise clikit.Exit(render.failure(exc, verbose=kwargs.get("verbose") or 0, as_json=bool(kwargs.get("json")))) from None
        except Exception as exc:  # noqa: BLE001 - last line of defence, never a bare traceback
            from gptoss_patch import interrupts

            if interrupts.received() is not None:
                raise clikit.Exit(_interrupted(kwargs)) from None
            if kwargs.get("verbose"):
                raise
            from gptoss_patch import render

            unexpected = GptossPatchError(f"unexpected error: {_unexpected(exc)}", hint="re-run with --verbose for the traceback")
            raise clikit.Exit(render.failure(unexpected, as_json=bool(kwargs.get("json")))) from None

    return wrapper  # type: ignore[return-value]


def _unexpected(exc: Exception) -> str:
    """An unexpected error's line: the cause an OSError gives in words (and its file), else the class and text
    (a bare KeyError's text is only the key); -v shows the traceback."""
    from gptoss_patch.errors import cause, detail_of

    if isinstance(exc, OSError) and exc.strerror:
        return cause(exc) + (f": {exc.filename}" if exc.filename else "")
    return detail_of(exc).splitlines()[0]


def _interrupted(kwargs: dict[str, Any]) -> int:
    """One line (and the JSON error under --json) for a signal; the exit code 128+N."""
    from gptoss_patch import render

    return render.interrupted(as_json=bool(kwargs.get("json")))


def stderr_is_tty() -> bool:
    return sys.stderr.isatty()


def installation(python: str | None, venv: str | None, vllm: str | None = None) -> Installation:
    """Resolve the target interpreter and its vLLM (the --python/--venv/--vllm trio)."""
    from gptoss_patch import target
    from gptoss_patch.versions import parse_version

    if vllm is not None:
        parse_version(vllm)  # an invalid version is a usage error before anything runs
    inst = target.discover(target.interpreter_for(python, venv), vllm, defaulted=python is None and venv is None)
    _say_when_waiting_for_the_lock()
    return inst


def _say_when_waiting_for_the_lock() -> None:
    """A command that has to wait for another run's lock says so once, instead of silence for up to 120 s."""
    from gptoss_patch import render
    from gptoss_patch.engine import ledger

    ledger.on_wait = render.info


def selection(
    only: list[str] | None, skip: list[str] | None, with_: list[str] | None = None, *, user: Any = ()
) -> Selection:
    """--only/--skip/--with, checked against the built-in ids and the names of `user` (user patches, or names)."""
    from gptoss_patch import registry, render

    chosen = registry.selection(only, skip, with_, tuple(getattr(u, "name", u) for u in user))
    for problem in registry.plugin_problems():  # a broken plugin is said once, the other patches go on
        render.warn(problem)
    return chosen


def user_patches(patch_dir: list[str] | None) -> tuple[userpatches.UserPatch, ...]:
    """The user patches of --patch-dir (else GPTOSS_PATCH_DIRS, else pyproject.toml), each checked."""
    from pathlib import Path

    from gptoss_patch import registry, userpatches

    dirs = userpatches.patch_dirs(patch_dir, Path.cwd())
    pyproject_problems()
    return userpatches.load_dirs(dirs, registry.ids())


def pyproject_problems() -> None:
    """A broken pyproject.toml that has no [tool.gptoss-patch] table: one warning, and the command goes on."""
    from gptoss_patch import render, userpatches

    for problem in userpatches.problems():
        render.warn(problem)
