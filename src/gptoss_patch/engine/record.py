"""vLLM's own RECORD: the pristine hashes, the rows pip writes, and the registration of our ledger files.

Our ledger lives inside vLLM's .dist-info and every file of it is listed in RECORD (with no hash),
so `pip uninstall`, `pip install --force-reinstall` and `uv sync` delete it together with the
installation it describes. Removing our lines restores RECORD byte for byte.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
from pathlib import Path

from gptoss_patch.engine import faults
from gptoss_patch.fsutil import atomic_write


def row(relpath: str, data: bytes) -> str:
    """One RECORD row as pip writes it (no newline): `path,sha256=<urlsafe base64, unpadded>,size`."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{relpath},sha256={digest},{len(data)}"


def hex_digest(record_digest: str) -> str:
    """RECORD's urlsafe-base64 sha256 (after `sha256=`) as the hex digest everything else uses."""
    return base64.urlsafe_b64decode(record_digest + "=" * (-len(record_digest) % 4)).hex()


def parse_hashes(text: str, wanted: set[str] | None = None) -> dict[str, str]:
    """relpath -> hex sha256 for the rows of a RECORD's text (only `wanted` ones when given)."""
    hashes: dict[str, str] = {}
    for fields in csv.reader(io.StringIO(text)):
        if len(fields) < 2 or not fields[1].startswith("sha256="):
            continue
        if wanted is not None and fields[0] not in wanted:
            continue
        hashes[fields[0]] = hex_digest(fields[1][len("sha256=") :])
    return hashes


def read_hashes(record: Path, wanted: set[str] | None = None) -> dict[str, str]:
    """relpath -> hex sha256 for the rows of RECORD (only `wanted` ones when given)."""
    return parse_hashes(record.read_text(encoding="utf-8"), wanted)


def registered(record: Path) -> set[str]:
    return {fields[0] for fields in csv.reader(io.StringIO(record.read_text(encoding="utf-8"))) if fields}


def register(record: Path, relpaths: list[str]) -> None:
    """Append `relpath,,` rows for files we are about to create (before creating them)."""
    known = registered(record)
    missing = [p for p in relpaths if p not in known]
    if not missing:
        return
    data = record.read_bytes()
    if data and not data.endswith(b"\n"):
        data += b"\n"
    atomic_write(record, data + "".join(f"{p},,\n" for p in missing).encode())
    faults.reached("record-registered", record)


def unregister(record: Path, prefix: str) -> None:
    """Drop every row under `prefix` (our ledger directory), leaving the rest byte-identical."""
    lines = record.read_bytes().splitlines(keepends=True)
    kept = [line for line in lines if not line.decode("utf-8", "replace").startswith(prefix)]
    if len(kept) != len(lines):
        atomic_write(record, b"".join(kept))
        faults.reached("record-unregistered", record)


def add_rows(record: Path, files: dict[str, bytes]) -> None:
    """List package files a user patch creates, with their hash and size, as pip lists its own
    (before creating them): `pip uninstall` removes them with vLLM and `audit` checks them."""
    known = registered(record)
    missing = {rel: data for rel, data in files.items() if rel not in known}
    if not missing:
        return
    data = record.read_bytes()
    if data and not data.endswith(b"\n"):
        data += b"\n"
    atomic_write(record, data + "".join(row(rel, body) + "\n" for rel, body in missing.items()).encode())
    faults.reached("record-registered", record)


def drop_rows(record: Path, rels: set[str]) -> None:
    """Drop the rows of exactly these paths (created files taken out again), the rest byte-identical."""
    lines = record.read_bytes().splitlines(keepends=True)
    kept = [line for line in lines if (next(csv.reader([line.decode("utf-8", "replace")]), None) or [""])[0] not in rels]
    if len(kept) != len(lines):
        atomic_write(record, b"".join(kept))
        faults.reached("record-unregistered", record)
