"""Compatibility matrix: every vLLM release from 0.15.1 to the newest on PyPI x every patch.

For each release: download the wheel (cached), install it --no-deps into a scratch venv, then run the
round trip of tests/support/roundtrip.py (state before apply, apply, verify, second apply, revert checked
against RECORD). Behavioural checks run in the test suite (tests/test_coverage.py) on the CPU harness.
Writes docs/compatibility.md. Rows are cached by (release, hash of the tool's source): re-running
when nothing changed reuses them. A release that cannot be handled is a row that says why.

    python scripts/compat_matrix.py [--only 0.17.1,0.23.0] [--refresh]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from packaging.version import InvalidVersion, Version  # noqa: E402

from gptoss_patch import target  # noqa: E402
from gptoss_patch.registry import all_specs  # noqa: E402
from tests.support.roundtrip import Outcome, roundtrip  # noqa: E402
from tests.support.upstream import CACHE, WHEELS  # noqa: E402

FIRST = Version("0.15.1")
OUTPUT = ROOT / "docs" / "compatibility.md"
ROWS = CACHE / "matrix"


def releases() -> list[str]:
    """Final releases on PyPI from 0.15.1 on (pip's view, so yanked ones are left out)."""
    proc = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "vllm"], capture_output=True, text=True)
    match = re.search(r"Available versions: (.*)", proc.stdout)
    if not match:
        raise SystemExit(f"cannot list vllm releases from PyPI: {proc.stderr.strip()[-200:]}")
    found = []
    for text in match.group(1).split(", "):
        try:
            version = Version(text)
        except InvalidVersion:
            continue
        if version >= FIRST and not version.is_prerelease and not version.local:
            found.append(version)
    return [str(v) for v in sorted(found)]


def source_hash() -> str:
    digest = hashlib.sha256()
    for path in sorted((ROOT / "src").rglob("*.py")) + [ROOT / "tests" / "support" / "roundtrip.py"]:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def fetch_wheel(version: str) -> Path | str:
    found = sorted(WHEELS.glob(f"vllm-{version}-*.whl"))
    if found:
        return found[-1]
    # --no-cache-dir: the wheel cache is the cache (pip's own would hold every wheel a second time)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir", "--only-binary=:all:", f"vllm=={version}",
           "-d", str(WHEELS)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(WHEELS.glob(f"vllm-{version}-*.whl"))
    if proc.returncode or not found:
        return "no wheel for this platform or download failed: " + (proc.stderr.strip().splitlines() or ["?"])[-1]
    return found[-1]


def run_release(version: str) -> dict:
    cached = bool(sorted(WHEELS.glob(f"vllm-{version}-*.whl")))
    wheel = fetch_wheel(version)
    if isinstance(wheel, str):
        return {"version": version, "error": wheel}
    try:  # the clock starts once the wheel is here: the footer's total is "from a warm wheel cache"
        return _install_and_roundtrip(version, wheel, time.perf_counter())
    finally:
        if not cached:  # fetched for this row only: 27 wheels are 9 GB, and the tests keep the ones they install
            wheel.unlink(missing_ok=True)


def _install_and_roundtrip(version: str, wheel: Path, started: float) -> dict:
    scratch = Path(tempfile.mkdtemp(prefix=f"matrix-{version}-"))
    try:
        venv = scratch / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", "--no-deps", "--no-compile"]
        t0 = time.perf_counter()
        proc = subprocess.run([*pip, str(wheel)], capture_output=True, text=True)
        if proc.returncode:
            return {"version": version, "error": "install failed: " + proc.stderr.strip()[-200:]}
        install_seconds = round(time.perf_counter() - t0, 1)
        outcome: Outcome = roundtrip(target.discover(str(venv / "bin" / "python")))
        row = outcome.to_json()
        row["seconds"] = {"install": install_seconds, **row["seconds"]}
        row["elapsed"] = round(time.perf_counter() - started, 1)  # wheel from cache, install, round trip
        print(f"vllm {version}: done in {row['elapsed']}s", file=sys.stderr)
        return row
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def cached_row(version: str, key: str, refresh: bool) -> dict:
    path = ROWS / f"{version}.json"
    if not refresh and path.exists():
        row = json.loads(path.read_text())
        if row.get("key") == key:
            return row
    row = {**run_release(version), "key": key}
    ROWS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(row, indent=1))
    return row


def verdict(row: dict, patch_id: str) -> str:
    before, after = row["before"].get(patch_id, "?"), row["after"].get(patch_id, "?")
    cell = before if before == after else f"{before} → {after}"
    if before in ("pending", "opt-in"):  # the round trip names the opt-in patches (--with): the same checks
        checks = [row["steps"].get(s, "?") for s in ("verify", "apply-again", "revert")]
        cell += " ✓" if all(c == "ok" for c in checks) else " ✗"
    return cell


def provenance(rows: list[dict], every_release: bool) -> str:
    """When and for which revision the table was made, so that a reader can tell whether it is current."""
    git = ["git", "-C", str(ROOT)]
    rev = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip() or "?"
    # the rows depend only on what source_hash reads: uncommitted changes elsewhere do not make them stale
    dirty = subprocess.run([*git, "status", "--porcelain", "--", "src", "tests/support/roundtrip.py"],
                           capture_output=True, text=True).stdout.strip()
    made = f"Generated on {time.strftime('%Y-%m-%d', time.gmtime())} for gptoss-patch `{rev}`"
    made += " (with uncommitted changes to its source)" if dirty else ""
    span = f"{rows[0]['version']} to {rows[-1]['version']}" if rows else "no release"
    scope = f"every final release on PyPI from {span} (the newest that day)" if every_release else f"the releases asked for ({span})"
    return f"{made}: {scope}, and every patch of the registry."


def render(rows: list[dict], every_release: bool = True) -> str:
    total_seconds = sum(r.get("elapsed", 0) for r in rows)
    ids = [s.id for s in all_specs()]
    opt_in = ", ".join(f"`{s.id}`" for s in all_specs() if s.opt_in) or "none today"
    lines = [
        "# Compatibility matrix",
        "",
        "Generated by `scripts/compat_matrix.py` from the real wheels (`make matrix`). A cell reads",
        "`state before apply → state after`; ✓ means verify, a second apply (no write) and revert",
        f"(byte-identical to RECORD) all passed. The opt-in patches ({opt_in}: `opt-in` before apply) are",
        "named with `--with` in the round trip. Times are wall seconds on the 2-core reference machine.",
        "",
        provenance(rows, every_release),
        "",
        "| vLLM | " + " | ".join(ids) + " | install | status | apply | verify | apply again | revert | notes |",
        "|---|" + "---|" * (len(ids) + 7),
    ]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['version']} | " + " | ".join("—" for _ in ids) + " |  |  |  |  |  |  | " + row["error"] + " |")
            continue
        secs = row["seconds"]
        timing = " | ".join(str(secs.get(s, "")) for s in ("install", "status", "apply", "verify", "apply-again", "revert"))
        notes = "; ".join(f"{k}: {v}" for k, v in row["steps"].items() if v != "ok" and not v.startswith("n/a"))
        lines.append(f"| {row['version']} | " + " | ".join(verdict(row, i) for i in ids) + f" | {timing} | {notes} |")
    lines += ["", f"Matrix wall time from a warm wheel cache: {total_seconds / 60:.1f} min for {len(rows)} releases.", ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated releases (default: all from 0.15.1 on)")
    parser.add_argument("--refresh", action="store_true", help="ignore cached rows")
    args = parser.parse_args()
    versions = args.only.split(",") if args.only else releases()
    key = source_hash()
    rows = [cached_row(v, key, args.refresh) for v in versions]
    OUTPUT.parent.mkdir(exist_ok=True)
    OUTPUT.write_text(render(rows, every_release=not args.only))
    print(f"wrote {OUTPUT.relative_to(ROOT)} ({len(rows)} releases)", file=sys.stderr)
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
