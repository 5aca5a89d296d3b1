"""`gptoss-patch cache dir|info|clean`: the one root where gptoss-patch keeps what it writes for you (paths.py)."""

from __future__ import annotations

from typing import Annotated

from gptoss_patch import clikit
from gptoss_patch.options import JsonOption, handles_errors

cache_app = clikit.App()

EntriesArgument = Annotated[
    list[str] | None,
    clikit.Argument(metavar="[ENTRY]...", help="Entries to remove (see `cache info`). Default: all but logs, tiktoken and tune.",
                    show_default=False),
]
AllOption = Annotated[bool, clikit.Option("--all", help="Remove the logs, the exported harmony vocabulary and the tuned profiles too: the whole root.")]


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
    """Remove cache entries: everything but the logs, the harmony vocabulary and the tuned profiles, or the ENTRYs named.

    The default is always safe: each entry it removes is rebuilt or downloaded again when needed. The
    vocabulary (tiktoken) is what `vocab install` told you to export; --all, or naming tiktoken, removes it
    too, and vLLM < 0.31 then downloads it at start-up until `vocab install` runs again."""
    from gptoss_patch import paths, render

    removed = paths.clean(list(entries or ()), everything=everything)
    vocabulary = paths.entry_dir("tiktoken")
    kept = not entries and not everything and vocabulary.is_dir()
    if json:
        render.json_out({"root": str(paths.cache_root()), "removed": [u.to_json() for u in removed],
                         "kept_vocabulary": str(vocabulary) if kept else None})
        return
    for usage in removed:
        render.info(f"Removed {usage.path} ({_size(usage.size)})")
    if any(u.entry.name == "tiktoken" for u in removed):
        render.warn("removed the harmony vocabulary `vocab install` exported: `vocab status` now fails and vLLM < 0.31 "
                    "downloads it at start-up again; `gptoss-patch vocab install` puts it back")
    elif kept:
        render.info(f"Kept the harmony vocabulary {vocabulary} (your exports point there); `cache clean tiktoken` removes it")
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
