"""The user's own patches: unified diffs in patch directories, each keyed to a range of vLLM versions.

A user patch is a file `NAME.diff` in a patch directory: a short header of `#` lines, then a unified
diff whose paths are relative to site-packages (`a/vllm/...`, as `git apply -p1` takes it there):

    # gptoss-patch user patch: NAME
    # vllm: >=0.17,<0.19
    --- a/vllm/envs.py
    +++ b/vllm/envs.py
    @@ ...

A patch may create files inside the package (`--- /dev/null` / `+++ b/vllm/...`, as git writes a new
file); one that deletes a file (`+++ /dev/null`) is refused.

The directories come from `--patch-dir` (repeatable), else `GPTOSS_PATCH_DIRS` (os.pathsep-separated),
else `[tool.gptoss-patch] patch-dirs` in the nearest pyproject.toml. Everything is checked when it is
loaded, so a bad patch file stops a command before anything is read from the installation. The engine
applies them (engine/userdiffs.py); this module only reads and checks files, and imports no engine code.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from packaging.version import Version

from gptoss_patch.errors import UsageError, cause, detail_of
from gptoss_patch.versions import in_range, specifier

SUFFIX = ".diff"
ENV = "GPTOSS_PATCH_DIRS"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,79}")
_HEADER = re.compile(r"^#\s*(gptoss-patch user patch|vllm)\s*:\s*(.*?)\s*$")
_FILE = re.compile(r"^(---|\+\+\+) (\S+)")
_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")


@dataclass(frozen=True)
class UserPatch:
    """One patch file: its name (the file's stem), where it is, the vLLM versions it is for, its text."""

    name: str
    path: Path
    versions: str  # PEP 440 specifiers
    text: str
    files: tuple[str, ...]  # site-packages-relative files it changes, in the diff's order
    created: tuple[str, ...] = ()  # those of `files` it creates (`--- /dev/null`)

    def fits(self, version: Version) -> bool:
        return in_range(Version(version.public), self.versions)

    @property
    def blob(self) -> bytes:
        return self.text.encode("utf-8")


def header(name: str, versions: str) -> str:
    """The lines `capture` writes before the diff (git apply skips them)."""
    return f"# gptoss-patch user patch: {name}\n# vllm: {versions}\n"


def check_name(name: str, taken: Iterable[str] = ()) -> None:
    if not NAME.fullmatch(name) or name.endswith(SUFFIX):
        raise UsageError(f"patch name {name!r}: use letters, digits, '.', '_' and '-' (at most 80), without {SUFFIX}")
    if name in set(taken):
        raise UsageError(f"patch name {name!r} is the id of a built-in patch; choose another name")


def check_versions(versions: str) -> str:
    try:
        specifier(versions)
    except ValueError:
        raise UsageError(f"invalid vLLM version range {versions!r}: expected PEP 440 specifiers such as >=0.17,<0.19") from None
    if not versions.strip():
        raise UsageError("the vLLM version range is empty: give specifiers such as ==0.17.1 or >=0.17,<0.19")
    return versions.strip()


def touched_files(text: str, where: str) -> tuple[str, ...]:
    """The files a diff changes or creates; each must be inside the vllm package."""
    return _files(text, where)[0]


def _files(text: str, where: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(every file the diff names, those it creates): `--- /dev/null` creates; `+++ /dev/null` (a deletion) is refused."""
    files: list[str] = []
    created: list[str] = []
    old: str | None = None
    left = [0, 0]  # lines of the current hunk still to come (old side, new side): its body is never a header
    start = 0  # the line number of the current hunk's header
    for number, line in enumerate(text.splitlines(), 1):
        if left[0] > 0 or left[1] > 0:
            if not _count(line, left):
                raise _malformed(where, f"line {number} ({line[:40]!r}) breaks the hunk that starts at line {start}")
            continue
        if hunk := _HUNK.match(line):
            if not files and old is None:
                raise UsageError(f"{where} cannot be read as a patch: the hunk at line {number} has no `--- a/vllm/...` / "
                                 "`+++ b/vllm/...` header before it; capture the patch again, or add the headers")
            left = [int(hunk.group(1) or 1), int(hunk.group(2) or 1)]
            start = number
            continue
        found = _FILE.match(line)
        if not found:
            continue
        raw = found.group(2)
        if found.group(1) == "---":
            old = raw
            if raw == "/dev/null":
                continue
        elif raw == "/dev/null":
            raise UsageError(
                f"{where} deletes {old}; user patches cannot delete vllm files: change the file instead "
                "(e.g. empty it), or leave that file out of the patch"
            )
        rel = _inside(raw, where)
        if found.group(1) == "+++" and old == "/dev/null" and rel not in created:
            created.append(rel)
        if rel not in files:
            files.append(rel)
    if left[0] > 0 or left[1] > 0:
        raise _malformed(where, f"the file ends inside the hunk that starts at line {start}")
    if not files:
        raise UsageError(f"{where} names no files (expected `--- a/vllm/...` / `+++ b/vllm/...` headers)")
    return tuple(files), tuple(created)


def _malformed(where: str, what: str) -> UsageError:
    """A hunk whose header's line counts do not match its body (a hand edit, a truncated copy): git calls it corrupt."""
    return UsageError(
        f"{where} cannot be read as a patch: {what} (its `@@` line promises more lines); the file itself is malformed, "
        "whatever vLLM holds",
        hint="fix the counts in the `@@ -a,b +c,d @@` line (b: context and - lines, d: context and + lines), "
        "or capture the patch again (gptoss-patch capture)",
    )


def _count(line: str, left: list[int]) -> bool:
    """One body line of a hunk: context counts on both sides, `-` on the old, `+` on the new; False: not a hunk line."""
    tag = line[:1]
    if tag in (" ", ""):  # context (an empty line: context of an empty line, as some tools write it)
        left[0], left[1] = left[0] - 1, left[1] - 1
    elif tag == "-":
        left[0] -= 1
    elif tag == "+":
        left[1] -= 1
    elif tag != "\\":  # not a hunk line at all: the counts were wrong
        return False
    return True


def _inside(raw: str, where: str) -> str:
    rel = raw[2:] if raw.startswith(("a/", "b/")) else raw
    pure = PurePosixPath(rel)
    if raw.startswith("/") or pure.is_absolute() or ".." in pure.parts or pure.parts[:1] != ("vllm",) or "\\" in rel:
        raise UsageError(f"{where} touches {raw!r}, which is not a file of the vllm package (paths must be a/vllm/...)")
    if len(pure.parts) < 2:
        raise UsageError(f"{where} touches {raw!r}, which is not a file of the vllm package (paths must be a/vllm/...)")
    return rel


def load(path: Path) -> UserPatch:
    """One patch file, checked: UTF-8, a header with a valid range, paths inside the vllm package."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"user patch {path} is not UTF-8 text") from None
    except OSError as exc:
        raise UsageError(f"cannot read user patch {path}: {cause(exc)}", detail=detail_of(exc)) from None
    facts: dict[str, str] = {}
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        if m := _HEADER.match(line):
            facts[m.group(1)] = m.group(2)
    if "vllm" not in facts:
        raise UsageError(f"user patch {path} has no `# vllm: <versions>` header line (capture writes one)")
    try:
        versions = check_versions(facts["vllm"])
    except UsageError as exc:
        raise UsageError(f"user patch {path}: {exc}") from None
    files, created = _files(text, f"user patch {path}")
    return UserPatch(path.name[: -len(SUFFIX)], path, versions, text, files, created)


def load_dirs(dirs: Iterable[Path], builtin_ids: Iterable[str] = ()) -> tuple[UserPatch, ...]:
    """Every `*.diff` of each directory, in the order given and then by file name."""
    found: dict[str, UserPatch] = {}
    builtins = set(builtin_ids)
    for directory in dirs:
        if not directory.is_dir():
            raise UsageError(f"patch directory {directory} does not exist or is not a directory")
        for path in sorted(directory.glob(f"*{SUFFIX}")):
            patch = load(path)
            if patch.name in found:
                raise UsageError(f"two patch directories hold a patch named {patch.name!r}: {found[patch.name].path} and {path}")
            if not NAME.fullmatch(patch.name) or patch.name in builtins:
                raise UsageError(f"user patch {path}: its name must be new (not a built-in patch id) and made of letters, digits, '.', '_', '-'")
            found[patch.name] = patch
    return tuple(found.values())


def patch_dirs(given: Iterable[str] | None, cwd: Path, environ: Mapping[str, str] = os.environ) -> tuple[Path, ...]:
    """The patch directories: --patch-dir, else GPTOSS_PATCH_DIRS, else the nearest pyproject.toml's list."""
    chosen = [d for d in (given or ()) if d]
    if chosen:
        return tuple(_absolute(Path(d), cwd) for d in chosen)
    if environ.get(ENV):
        return tuple(_absolute(Path(d), cwd) for d in environ[ENV].split(os.pathsep) if d)
    return _from_pyproject(cwd)


def _absolute(path: Path, base: Path) -> Path:
    return Path(os.path.normpath(base / path.expanduser()))


def _from_pyproject(cwd: Path) -> tuple[Path, ...]:
    """[tool.gptoss-patch] patch-dirs of the nearest pyproject.toml. A file we cannot read or parse matters only when
    it has that table (a UsageError: the patch directories it names are unknown); otherwise it is someone else's
    problem: one warning (`problems()`, the CLI prints it) and no patch directories."""
    _problems.clear()
    for folder in (cwd, *cwd.parents):
        pyproject = folder / "pyproject.toml"
        if not pyproject.is_file():
            continue
        try:
            text = pyproject.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            _problems.append(f"ignoring {pyproject}: cannot read it ({cause(exc)}), so no [tool.gptoss-patch] patch-dirs from it")
            return ()
        if "gptoss-patch" not in text:
            return ()
        try:
            data = _toml(pyproject, text)
        except BrokenToml as exc:
            if not OUR_TABLE.search(text):  # a broken file that names us only elsewhere (a dependency, a comment)
                _problems.append(f"ignoring {pyproject}: {exc}; it has no [tool.gptoss-patch] table")
                return ()
            raise UsageError(f"{exc}, which has the [tool.gptoss-patch] table that names your patch directories",
                             hint=f"fix the file, or pass --patch-dir DIR (or set {ENV}) to use other ones") from None
        dirs = data.get("tool", {}).get("gptoss-patch", {}).get("patch-dirs", [])
        if not isinstance(dirs, list) or not all(isinstance(d, str) for d in dirs):
            raise UsageError(f"{pyproject}: [tool.gptoss-patch] patch-dirs must be a list of directory names")
        return tuple(_absolute(Path(d), folder) for d in dirs)
    return ()


# A `[tool.gptoss-patch]` (or `[tool."gptoss-patch"]`) table header, or a sub-table of it, found without parsing.
OUR_TABLE = re.compile(r"""^\s*\[\s*tool\s*\.\s*(?:gptoss-patch|"gptoss-patch"|'gptoss-patch')\s*[\].]""", re.M)
_problems: list[str] = []


def problems() -> tuple[str, ...]:
    """What the last look for a pyproject.toml ignored, one line each (a broken file without our table)."""
    return tuple(_problems)


def _toml(pyproject: Path, text: str) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]
        except ImportError:
            raise UsageError(
                f"reading [tool.gptoss-patch] in {pyproject} needs Python 3.11 or tomli; use --patch-dir or {ENV}"
            ) from None
    try:
        data: dict[str, Any] = tomllib.loads(text)
        return data
    except tomllib.TOMLDecodeError as exc:
        raise BrokenToml(f"cannot read {pyproject}: {exc}") from None


class BrokenToml(UsageError):
    """A pyproject.toml that is not valid TOML."""
