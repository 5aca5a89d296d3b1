"""Shared by the reliability tests (faults, concurrency, hostile inputs) on the real vllm 0.17.1 wheel.

- `gptoss(venv, command, ...)` runs the real CLI in a subprocess: `python -m gptoss_patch`, or
  tests/support/crash_runner.py when fault points (`at=`) or a step trace are asked for; with `forks=`, the
  same command line in a child of a fork server (tests/support/forkserver.py), without the interpreter's start-up.
- `Reference` holds what an installation may contain: the pristine bytes (RECORD's), the patched
  bytes of an uninterrupted apply, RECORD itself and the list of files of the fresh install.
- `assert_pristine` / `assert_patched` / `contents` check a venv against it, byte for byte.

Venvs come from `upstream.fresh_install` (hardlink clones): nothing here writes a file in place.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import Version

from gptoss_patch.engine.ledger import DIRNAME, Store
from gptoss_patch.engine.record import read_hashes
from gptoss_patch.fsutil import sha256
from gptoss_patch.target import Installation
from tests.support.cli import states
from tests.support.forkserver import ForkServer
from tests.support.upstream import fresh_install, site_packages

VERSION = "0.17.1"
SERVING = "vllm/entrypoints/openai/chat_completion/serving.py"
MARLIN = "vllm/model_executor/layers/quantization/utils/marlin_utils.py"
RUNNER = Path(__file__).with_name("crash_runner.py")
KILLED = -9  # subprocess returncode of a SIGKILLed child


def command_line(venv: Path, command: str, *args: str, at: Iterable[str] = (), trace: Path | None = None) -> list[str]:
    """What gptoss() runs after the interpreter: `-m gptoss_patch ...`, or crash_runner.py for faults or a trace."""
    points = [f"--at={p}" for p in at]
    wrapper = ["-m", "gptoss_patch"]
    if points or trace:
        wrapper = [str(RUNNER), *points, *(["--trace", str(trace)] if trace else []), "--"]
    return [*wrapper, command, "--venv", str(venv), *args]


def gptoss(
    venv: Path,
    command: str,
    *args: str,
    at: Iterable[str] = (),
    trace: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 120,
    forks: ForkServer | None = None,
) -> subprocess.CompletedProcess[str]:
    """The real CLI on `venv`, in its own process: a fresh interpreter, or a child of `forks` (forkserver.py)."""
    argv = command_line(venv, command, *args, at=at, trace=trace)
    environ = {**os.environ, **(env or {})}
    if forks is not None:
        return forks.run(argv, env=environ, timeout=timeout)
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=timeout, env=environ,
                          check=False)


def spawn(venv: Path, command: str, *args: str, at: Iterable[str] = (), trace: Path | None = None,
          env: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
    """Like gptoss(), started in the background."""
    cmd = [sys.executable, *command_line(venv, command, *args, at=at, trace=trace)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})


def dist_info(venv: Path) -> Path:
    return site_packages(venv) / f"vllm-{VERSION}.dist-info"


def ledger_dir(venv: Path) -> Path:
    return dist_info(venv) / DIRNAME


def installation(venv: Path) -> Installation:
    """The Installation discovery would find (built directly: in-process checks need no probe)."""
    return Installation(str(venv / "bin" / "python"), Version(VERSION), site_packages(venv), dist_info(venv))


def changed(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [p["id"] for p in json.loads(proc.stdout)["patches"] if p.get("changed")]


def listing(venv: Path) -> frozenset[str]:
    """Every file under site-packages (relative), bytecode caches left out."""
    root = site_packages(venv)
    found = set()
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        found.update(os.path.relpath(os.path.join(folder, f), root) for f in files)
    return frozenset(found)


@dataclass(frozen=True)
class Reference:
    """What one uninterrupted apply does to a fresh install (the patch set is whatever is registered)."""

    record: bytes
    original: dict[str, bytes]  # target file -> RECORD's bytes
    patched: dict[str, bytes]  # target file -> bytes after the uninterrupted apply
    listing: frozenset[str]
    pending: dict[str, str]  # patch id -> state on the fresh install (`status --json`)
    applied: dict[str, str]  # patch id -> state after the apply

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(self.original)

    @classmethod
    def build(cls, venv: Path) -> Reference:
        """From an uninterrupted apply on a fresh install at `venv` (left applied: a template)."""
        fresh_install(VERSION, venv)
        site = site_packages(venv)
        record = (dist_info(venv) / "RECORD").read_bytes()
        files = listing(venv)
        before = gptoss(venv, "status", "--json")
        done = gptoss(venv, "apply", "--vllm", VERSION, "--json")
        assert done.returncode == 0, done.stderr
        # in the order apply writes them (the order of the results)
        targets = list(dict.fromkeys(p["file"] for p in json.loads(done.stdout)["patches"] if p.get("changed")))
        assert len(targets) >= 2, f"the reliability tests need two patched files on {VERSION}: {done.stdout}"
        hashes = read_hashes(dist_info(venv) / "RECORD", set(targets))
        assert set(hashes) == set(targets), "a target file is not in RECORD"
        original = {rel: Path(_pristine_copy(rel)).read_bytes() for rel in targets}
        assert {rel: sha256(b) for rel, b in original.items()} == hashes, "the fresh install does not match RECORD"
        patched = {rel: (site / rel).read_bytes() for rel in targets}
        after = gptoss(venv, "status", "--json")
        return cls(record, original, patched, files, states(before), states(after))

    def states_for(self, found: str) -> dict[str, str]:
        return self.applied if found == "patched" else self.pending


def _pristine_copy(rel: str) -> Path:
    """The file in the cached base venv the clones link to (upstream checks it against RECORD)."""
    from tests.support.upstream import nodeps_venv

    return site_packages(nodeps_venv(VERSION)) / rel


def contents(venv: Path, ref: Reference) -> str:
    """'original' or 'patched' when every target holds exactly those bytes; fails on anything else."""
    site = site_packages(venv)
    found = {}
    for rel in ref.targets:
        data = (site / rel).read_bytes()
        found[rel] = "original" if data == ref.original[rel] else "patched" if data == ref.patched[rel] else None
        assert found[rel], f"{rel} is neither the RECORD original nor the patched bytes (sha256 {sha256(data)[:12]})"
    assert len(set(found.values())) == 1, f"half-done: {found}"
    return next(iter(found.values()))


def assert_pristine(venv: Path, ref: Reference) -> None:
    """As pip installed it: RECORD's bytes, RECORD itself byte-identical, not one file more or less."""
    assert contents(venv, ref) == "original"
    assert (dist_info(venv) / "RECORD").read_bytes() == ref.record, "RECORD is not byte-identical to pip's"
    extra, missing = listing(venv) - ref.listing, ref.listing - listing(venv)
    assert not extra and not missing, f"left behind {sorted(extra)}, lost {sorted(missing)}"


def assert_patched(venv: Path, ref: Reference) -> None:
    """The patched bytes, and a ledger that can still restore RECORD's originals (checked in-process)."""
    assert contents(venv, ref) == "patched"
    store = Store(installation(venv))
    ledger = store.load()
    assert set(ledger.files) == set(ref.targets) and not store.has_journal()
    for rel, entry in ledger.files.items():
        assert store.blob(entry.original) == ref.original[rel], f"the original of {rel} is lost"
        assert entry.patched == sha256(ref.patched[rel])
    ours = f"vllm-{VERSION}.dist-info/{DIRNAME}/"
    record = (dist_info(venv) / "RECORD").read_bytes().splitlines(keepends=True)
    assert b"".join(r for r in record if not r.startswith(ours.encode())) == ref.record
    registered = {r.decode().split(",")[0] for r in record if r.startswith(ours.encode())}
    extra = listing(venv) - ref.listing
    assert extra <= registered and extra >= {ours + "ledger.json"}, f"unregistered or missing ledger files: {sorted(extra - registered)}"
    assert ref.listing <= listing(venv)


def notices(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("warning: ") and "interrupted" in line]


def describe(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    return {"rc": proc.returncode, "stderr": proc.stderr.strip()[-600:], "stdout": proc.stdout.strip()[-300:]}


def print_line(request: Any, line: str) -> None:
    """Straight to the terminal, past output capturing (for the summary lines of the safety tests)."""
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if capture is None or reporter is None:
        print(line)
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line("")
        reporter.write_line(line)
