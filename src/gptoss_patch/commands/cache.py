"""`gptoss-patch cache dir|info|clean`: the one root where gptoss-patch keeps what it writes for you (paths.py)."""

from __future__ import annotations

from typing import Annotated

from gptoss_patch import clikit
from gptoss_patch.options import JsonOption, handles_errors

cache_app = clikit.App()

EntriesArgument = Annotated[
    list[str] | None,
    clikit.Argument(metavar="[ENTRY]...", help="Entries to remove (see `cache info`). Default: all but logs.", show_default=False),
]
AllOption = Annotated[bool, clikit.Option("--all", help="Remove the logs too: the whole root.")]


@cache_app.command("dir")
@handles_errors
def directory() -> None:
    """Print the root: $GPTOSS_PATCH_CACHE, else $XDG_CACHE_HOME/gptoss-patch, else ~/.cache/gptoss-patch."""
    from gptoss_patch import paths

    clikit.echo(str(paths.cache_root()))


@cache_app.command("info")
@handles_errors
def info(json: JsonOption = False) -> None:
    """What lives under the root, its size, and what deleting each entry costs."""
    from gptoss_patch import paths, render

    found = paths.usage()
    if json:
        render.json_out({"root": str(paths.cache_root()), "entries": [u.to_json() for u in found]})
        return
    render.info(f"gptoss-patch cache: {paths.cache_root()}")
    rows = [(u.entry.name, _size(u.size) if u.files else "-", u.entry.holds, u.entry.if_deleted) for u in found]
    render.table(None, ("entry", "size", "holds", "if deleted"), rows, keys=("entry", "size"))


@cache_app.command("clean")
@handles_errors
def clean(entries: EntriesArgument = None, everything: AllOption = False, json: JsonOption = False) -> None:
    """Remove cache entries: everything but the logs, or the ENTRYs named. Always safe: each is rebuilt or downloaded again when needed."""
    from gptoss_patch import paths, render

    removed = paths.clean(list(entries or ()), everything=everything)
    if json:
        render.json_out({"root": str(paths.cache_root()), "removed": [u.to_json() for u in removed]})
        return
    for usage in removed:
        render.info(f"Removed {usage.path} ({_size(usage.size)})")
    freed = sum(u.size for u in removed)
    clikit.echo(f"Freed {_size(freed)}" if removed else "Nothing to remove")


def _size(size: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024  # type: ignore[assignment]
    return f"{size} B"


def register(app: clikit.App) -> None:
    app.add_app(cache_app, name="cache", help="Where gptoss-patch keeps its downloads, vocabulary, memos and logs; clean it.")
