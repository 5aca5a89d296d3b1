"""A release's source files read straight out of its wheel on the index, by HTTP range requests: no whole download.

A vLLM wheel is 250-510 MB, nearly all of it compiled CUDA extensions; a test that only reads sources needs about
6 MB of it. `write_slim(name, version, slim)` finds the wheel pip would pick on this machine in the index's simple
API (PEP 691), reads its zip central directory from the end of the file, then fetches only the byte spans of the
members it keeps (neighbouring spans merged: a few dozen requests), and writes them into `slim`.

What it checks, since it never sees the whole file (so the index's sha256 of the wheel cannot be checked):
- every member it keeps passes zipfile's CRC-32 check as it is read;
- every kept member listed in the wheel's RECORD with a hash matches that sha256 (RECORD itself is read the same
  way), so a wrong byte anywhere in the sources fails the build of the slim archive;
- the server must answer each range with 206 and exactly the bytes asked for.
Any failure raises RangeUnavailable; the caller then downloads the whole wheel (and pip checks its hash).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import re
import urllib.request
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path

SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
TIMEOUT = 120
TAIL = 4 << 20  # the end of the file read first: the central directory of a vLLM wheel is about 0.5 MB
MERGE_GAP = 1 << 20  # spans closer than this are fetched in one request (fewer round trips, a little more data)


class RangeUnavailable(OSError):
    """The sources could not be read by ranges (no such wheel, no range support, a check failed)."""


def wheel_entry(index: str, name: str, version: str) -> dict[str, object]:
    """The index's entry (filename, url, size) for the x86-64 manylinux wheel of name==version, highest build tag."""
    request = urllib.request.Request(f"{index}/{name}/", headers={"Accept": SIMPLE_JSON})
    with urllib.request.build_opener().open(request, timeout=TIMEOUT) as answer:
        files = json.load(answer)["files"]
    stem = re.sub(r"[-_.]+", "_", name).lower()
    wheels = [f for f in files if f["filename"].lower().startswith(f"{stem}-{version}-") and f["filename"].endswith(".whl")
              and "x86_64" in f["filename"] and "linux" in f["filename"]]
    if not wheels:
        raise RangeUnavailable(f"{index}/{name}/ lists no x86-64 Linux wheel of {version}")
    return max(wheels, key=lambda f: _build_tag(str(f["filename"])))


def _build_tag(filename: str) -> tuple[int, str]:
    parts = filename[: -len(".whl")].split("-")
    tag = parts[2] if len(parts) == 6 else ""  # name-version[-build]-python-abi-platform
    digits = re.match(r"\d*", tag).group(0)  # type: ignore[union-attr]
    return (int(digits) if digits else -1, tag)


class RangedFile(io.RawIOBase):
    """A read-only, seekable view of a remote file: reads are served from spans fetched by range requests."""

    def __init__(self, url: str, size: int, fetch: Callable[[str, int, int], bytes] | None = None) -> None:
        super().__init__()
        self.url, self.size, self.position = url, size, 0
        self.spans: list[tuple[int, bytes]] = []
        self.requests = 0
        self._fetch = fetch or _fetch_range

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self.position, os.SEEK_END: self.size}[whence]
        self.position = max(0, base + offset)
        return self.position

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        wanted = min(len(buffer), self.size - self.position)
        if wanted <= 0:
            return 0
        data = self._covered(self.position, wanted)
        if data is None:  # not prefetched: fetch what is asked (zipfile's own small reads land here rarely)
            self.load([(self.position, self.position + wanted)])
            data = self._covered(self.position, wanted)
            assert data is not None
        buffer[:wanted] = data
        self.position += wanted
        return wanted

    def _covered(self, start: int, length: int) -> bytes | None:
        for begin, data in self.spans:
            if begin <= start and start + length <= begin + len(data):
                return data[start - begin : start - begin + length]
        return None

    def load(self, spans: Iterable[tuple[int, int]]) -> None:
        """Fetch the [start, end) spans, merging those closer than MERGE_GAP, skipping what is already held."""
        merged: list[list[int]] = []
        for start, end in sorted(spans):
            if merged and start - merged[-1][1] <= MERGE_GAP:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        for start, end in merged:
            if self._covered(start, end - start) is None:
                self.spans.append((start, self._fetch(self.url, start, end)))
                self.requests += 1


def _fetch_range(url: str, start: int, end: int) -> bytes:
    request = urllib.request.Request(url, headers={"Range": f"bytes={start}-{end - 1}"})
    with urllib.request.build_opener().open(request, timeout=TIMEOUT) as answer:
        if answer.status != 206:
            raise RangeUnavailable(f"{url}: answered {answer.status} to a range request")
        data: bytes = answer.read()
    if len(data) != end - start:
        raise RangeUnavailable(f"{url}: asked for {end - start} bytes at {start}, got {len(data)}")
    return data


def copy_members(remote: RangedFile, slim: Path, keep: Callable[[str], bool]) -> int:
    """Write the members `keep` accepts into the zip `slim`, each checked (CRC-32, RECORD's sha256); returns their count."""
    remote.load([(max(0, remote.size - TAIL), remote.size)])
    with zipfile.ZipFile(remote) as full:
        infos = sorted(full.infolist(), key=lambda info: info.header_offset)
        ends = [info.header_offset for info in infos[1:]] + [full.start_dir]  # type: ignore[attr-defined]
        kept = [(info, end) for info, end in zip(infos, ends) if keep(info.filename)]
        remote.load((info.header_offset, end) for info, end in kept)
        record_name = next((info.filename for info, _ in kept if info.filename.endswith(".dist-info/RECORD")), None)
        if record_name is None:
            raise RangeUnavailable(f"{remote.url}: no RECORD among the members")
        hashes = _record_hashes(full.read(record_name))
        with zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as out:
            for info, _ in kept:
                data = full.read(info)  # zipfile raises BadZipFile on a CRC mismatch
                expected = hashes.get(info.filename)
                if expected and _record_digest(data) != expected:
                    raise RangeUnavailable(f"{remote.url}: {info.filename} does not match its RECORD hash")
                out.writestr(info, data, compress_type=zipfile.ZIP_STORED)  # checked, not recompressed: CPU
    return len(kept)


def _record_hashes(record: bytes) -> dict[str, str]:
    rows = csv.reader(io.StringIO(record.decode("utf-8")))
    return {row[0]: row[1] for row in rows if len(row) >= 2 and row[1].startswith("sha256=")}


def _record_digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def write_slim(index: str, name: str, version: str, slim: Path, keep: Callable[[str], bool]) -> str:
    """`slim` from the index's wheel of name==version by ranges (complete or absent); a line saying what it fetched."""
    try:
        entry = wheel_entry(index, name, version)
    except (OSError, ValueError, KeyError) as exc:  # no index, no answer, not PEP 691
        raise RangeUnavailable(f"{index}/{name}/: {exc}") from exc
    size = entry.get("size")
    if not isinstance(size, int):
        raise RangeUnavailable(f"{index}/{name}/ gives no size for {entry['filename']}")
    remote = RangedFile(str(entry["url"]), size)
    temp = slim.with_name(f".{slim.name}.partial")
    try:
        count = copy_members(remote, temp, keep)
        os.replace(temp, slim)
    except (OSError, zipfile.BadZipFile, ValueError, KeyError) as exc:
        temp.unlink(missing_ok=True)
        raise RangeUnavailable(f"{entry['filename']}: {exc}") from exc
    fetched = sum(len(data) for _, data in remote.spans)
    return (f"{entry['filename']}: {count} members in {remote.requests} range requests, "
            f"{fetched / 1e6:.1f} MB of {size / 1e6:.0f} MB")
