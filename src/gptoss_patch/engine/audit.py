"""`audit`: every file of the vLLM distribution against its RECORD, and against what gptoss-patch wrote.

A file is fine when it holds what RECORD says the wheel installed, or exactly what the ledger says
gptoss-patch wrote (a built-in patch, a user patch, a --with-diff). Anything else is a finding:
changed (a hand edit nobody captured), missing, or added (a file in the package RECORD does not list;
bytecode aside). A file a user patch created is in RECORD while it is applied (transaction.py).

Hashing every file of a release (about 1.2 GB, most of it compiled extensions) takes seconds, so, as
git's index does, a small cache beside gptoss-patch's other caches remembers each file's hash with its
size, inode, modification and change times; a file whose stat is unchanged is not read again. Any
write to a file changes its ctime, which no user-level call can set back.
"""

from __future__ import annotations

import csv
import hashlib
import io
import os
import shlex
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gptoss_patch import paths
from gptoss_patch.engine.ledger import Ledger, Store
from gptoss_patch.engine.record import hex_digest
from gptoss_patch.engine.transaction import recover
from gptoss_patch.fsutil import file_sha256
from gptoss_patch.target import Installation

CACHE_FORMAT = 1


@dataclass(frozen=True)
class Finding:
    path: str  # as RECORD names it (relative to site-packages)
    kind: str  # changed | missing | added | orphaned
    detail: str
    hint: str

    def to_json(self) -> dict[str, str]:
        return {"path": self.path, "kind": self.kind, "detail": self.detail, "hint": self.hint}


@dataclass(frozen=True)
class Audit:
    installation: Installation
    checked: int  # files RECORD lists with a hash
    patched: dict[str, tuple[str, ...]] = field(default_factory=dict)  # file -> patches the ledger proves
    findings: tuple[Finding, ...] = ()
    notices: tuple[str, ...] = ()

    @property
    def clean(self) -> bool:
        return not self.findings

    def to_json(self) -> dict[str, Any]:
        return {
            "vllm": self.installation.to_json(), "clean": self.clean, "checked": self.checked,
            "patched": {rel: list(ids) for rel, ids in sorted(self.patched.items())},
            "findings": [f.to_json() for f in self.findings],
        }


def audit(inst: Installation) -> Audit:
    notices = recover(inst)
    ledger = Store(inst).load()
    rows = record_rows(inst)
    hashes = current_hashes(inst, rows)
    patched: dict[str, tuple[str, ...]] = {}
    findings: list[Finding] = []
    for rel, (expected, _size) in rows.items():
        digest = hashes.get(rel)
        entry = ledger.files.get(rel)
        if digest == expected and entry is None:
            continue
        if entry is not None and digest == entry.patched:
            patched[rel] = entry.patches
        elif digest is None:
            findings.append(Finding(rel, "missing", "listed in RECORD but not on disk", f"reinstall: {inst.reinstall_command}"))
        elif digest != expected or entry is not None:
            findings.append(_changed(inst, rel, digest, ledger))
    findings.extend(added_files(inst, set(rows)))
    findings.extend(_orphaned(inst, ledger, patched))
    return Audit(inst, len(rows), patched, tuple(sorted(findings, key=lambda f: f.path)), notices)


def _changed(inst: Installation, rel: str, digest: str, ledger: Ledger) -> Finding:
    entry = ledger.files.get(rel)
    by = f" (after gptoss-patch wrote it for {', '.join(entry.patches)})" if entry else ""
    hint = (
        f"keep it as your own patch: gptoss-patch capture NAME --files {rel}; or drop it: reinstall ({inst.reinstall_command})"
        if rel.startswith("vllm/")
        else f"reinstall: {inst.reinstall_command}"
    )
    return Finding(rel, "changed", f"differs from RECORD{by} (sha256 {digest[:12]})", hint)


def _orphaned(inst: Installation, ledger: Ledger, patched: dict[str, tuple[str, ...]]) -> list[Finding]:
    """Files that hold what a patch wrote whose patch set is no longer installed (a plugin removed): nothing
    re-applies or checks that patch any more, and only `revert` takes it out (a file changed since is `changed`)."""
    from gptoss_patch.engine.status import orphan_fix
    from gptoss_patch.registry import by_id

    found = []
    for patch_id, rels in ledger.orphans(by_id()).items():
        for rel in rels:
            if rel in patched:
                found.append(Finding(rel, "orphaned", f"holds what patch {patch_id} wrote, which no installed patch set "
                                     "provides any more (a plugin removed?)", f"take it out: {orphan_fix(inst, patch_id)}"))
    return found


def added_files(inst: Installation, listed: set[str]) -> list[Finding]:
    found = []
    site = inst.site_packages
    for folder, dirs, files in os.walk(inst.package_root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith((".pyc", ".gptoss-tmp")):
                continue
            rel = Path(folder, name).relative_to(site).as_posix()
            if rel not in listed:  # a reinstall leaves a file RECORD does not list where it is: removing it is the fix
                found.append(Finding(rel, "added", "in the vllm package but not in RECORD",
                                     f"keep it as your own patch: gptoss-patch capture NAME --files {rel}; "
                                     f"or remove it: rm {shlex.quote(str(Path(folder, name)))}"))
    return found


def record_rows(inst: Installation) -> dict[str, tuple[str, int]]:
    """RECORD's rows with a hash inside site-packages: path -> (hex sha256, size).

    Rows outside it (`../../../bin/vllm`) are left out: they are console scripts whose first line names
    the interpreter, which a moved or cloned environment rewrites; vLLM's code is all in site-packages."""
    rows = {}
    for fields in csv.reader(io.StringIO(inst.record.read_text(encoding="utf-8"))):
        if len(fields) >= 3 and fields[1].startswith("sha256=") and not fields[0].startswith("../"):
            rows[fields[0]] = (hex_digest(fields[1][len("sha256="):]), int(fields[2] or -1))
    return rows


def current_hashes(inst: Installation, rows: dict[str, tuple[str, int]]) -> dict[str, str | None]:
    """path -> sha256 of the file now (None: missing); files whose stat is unchanged come from the cache."""
    cache_path = _cache_path(inst)
    cached = _load_cache(cache_path)
    stats: dict[str, tuple[int, int, int, int] | None] = {}
    result: dict[str, str | None] = {}
    todo: list[str] = []
    for rel in rows:
        try:
            st = os.stat(inst.site_packages / rel)
        except OSError:
            stats[rel] = None
            result[rel] = None
            continue
        key = (st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
        stats[rel] = key
        hit = cached.get(rel)
        if hit is not None and tuple(hit[:4]) == key:
            result[rel] = hit[4]
        else:
            todo.append(rel)
    if todo:
        with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:  # hashlib releases the GIL
            for rel, digest in zip(todo, pool.map(lambda r: _hash(inst.site_packages / r), todo)):
                result[rel] = digest
        fresh = {rel: [*key, result[rel]] for rel, key in stats.items() if key is not None and result.get(rel)}
        _forget_gone(cache_path.parent)
        paths.write_json(cache_path, {"format": CACHE_FORMAT, "dist_info": str(inst.dist_info), "files": fresh})
    return result


def _forget_gone(folder: Path) -> None:
    """Drop the caches of installations that no longer exist (best effort; only on a cold audit)."""
    try:
        entries = list(folder.glob("*.json"))
    except OSError:
        return
    for entry in entries:
        raw = paths.read_json(entry)
        where = raw.get("dist_info") if isinstance(raw, dict) else None
        if not (isinstance(where, str) and where and Path(where).is_dir()):
            entry.unlink(missing_ok=True)


def _hash(path: Path) -> str | None:
    try:
        return file_sha256(path)
    except OSError:
        return None


def _cache_path(inst: Installation) -> Path:
    key = hashlib.sha256(str(inst.dist_info.resolve()).encode()).hexdigest()[:20]
    return paths.entry_dir("audit") / f"{key}.json"


def _load_cache(path: Path) -> dict[str, list[Any]]:
    raw = paths.read_json(path)
    if not isinstance(raw, dict) or raw.get("format") != CACHE_FORMAT or not isinstance(raw.get("files"), dict):
        return {}
    return {k: v for k, v in raw["files"].items() if isinstance(v, list) and len(v) == 5}
