"""Find the target interpreter and its vLLM installation, without ever importing vllm.

The lookup runs `importlib.metadata` inside the target interpreter as a subprocess:
the tool may run from another environment (pipx, a system Python) than the vLLM it patches.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from gptoss_patch import paths
from gptoss_patch.errors import TargetError
from gptoss_patch.versions import parse_version

DISTRIBUTION = "vllm"

# Runs in the target interpreter; prints one JSON object. Keep it import-light. `stamps` are the
# modification times of the directories on sys.path, taken before the lookup: see _cached_probe.
_PROBE = r"""
import json, os, sys
stamps = {}
for entry in sys.path:
    try:
        stamps[os.path.abspath(entry or ".")] = os.stat(entry or ".").st_mtime_ns
    except OSError:
        pass
from importlib import metadata
found = []
for dist in metadata.distributions(name=%r):
    path = getattr(dist, "_path", None)
    found.append({"version": dist.version, "dist_info": str(path) if path else None,
                  "site": str(dist.locate_file(""))})
print(json.dumps({"python": sys.executable, "prefix": sys.prefix, "found": found, "stamps": stamps}))
"""
# Variables that change what the target interpreter puts on sys.path.
_PATH_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE", "PYTHONNOUSERSITE", "PYTHONSAFEPATH")


@dataclass(frozen=True)
class Installation:
    """One installed vLLM distribution, as seen by one interpreter."""

    python: str
    version: Version
    site_packages: Path
    dist_info: Path
    shadowed: tuple[str, ...] = ()  # other vllm installations later on sys.path

    @property
    def package_root(self) -> Path:
        return self.site_packages / "vllm"

    @property
    def record(self) -> Path:
        return self.dist_info / "RECORD"

    def to_json(self) -> dict[str, str]:
        return {"version": str(self.version), "location": str(self.site_packages), "python": self.python}


def default_interpreter() -> str:
    """The active virtualenv's interpreter, else the one running gptoss-patch."""
    venv = os.environ.get("VIRTUAL_ENV")
    if venv:
        return str(_venv_python(Path(venv)))
    return sys.executable


def interpreter_for(python: str | None, venv: str | None) -> str:
    if python and venv:
        raise TargetError("--python and --venv name the target twice; give one of them")
    if venv:
        root = Path(venv)
        if not (root / "pyvenv.cfg").is_file():
            raise TargetError(f"{venv} is not a virtualenv (no pyvenv.cfg)", hint="pass the venv's directory, or --python PATH")
        return str(_venv_python(root))
    if python:
        resolved = shutil.which(python) or python
        if not Path(resolved).is_file() or not os.access(resolved, os.X_OK):
            raise TargetError(f"--python {python}: no such executable")
        return resolved
    return default_interpreter()


def _venv_python(root: Path) -> Path:
    for candidate in (root / "bin" / "python", root / "Scripts" / "python.exe"):
        if candidate.exists():
            return candidate
    raise TargetError(f"{root} has no bin/python", hint="is it a virtualenv?")


def discover(python: str, expected: str | None = None) -> Installation:
    """Locate vLLM for `python`; check it against `expected` (the --vllm assertion) if given."""
    wanted = parse_version(expected) if expected else None
    probe = _cached_probe(python)
    found = probe["found"]
    if not found:
        raise TargetError(
            f"vLLM is not installed for {probe['python']}",
            hint="install it (pip install vllm==VERSION) or point --python/--venv at the environment that has it",
        )
    first = found[0]
    if not first["dist_info"]:
        raise TargetError(f"vLLM at {first['site']} is not a wheel install (no .dist-info); gptoss-patch needs RECORD")
    inst = Installation(
        python=probe["python"],
        version=parse_version(first["version"]),
        site_packages=Path(first["site"]),
        dist_info=Path(first["dist_info"]),
        shadowed=tuple(f"{f['version']} at {f['site']}" for f in found[1:]),
    )
    if wanted is not None and inst.version != wanted:
        raise TargetError(f"--vllm {expected} was asserted, but {inst.python} has vllm {inst.version}")
    return inst


def _cached_probe(python: str) -> dict:
    """The probe's answer, reused while nothing it depends on has changed.

    An install, upgrade or uninstall changes the entries of a directory on sys.path, hence its
    mtime; the interpreter, the working directory and the sys.path variables are part of the key.
    A cached answer is used only if every stamp still matches and every dist-info still exists, so
    it can be stale only if something rewrote a dist-info in place without touching its directory.
    """
    key = _probe_key(python)
    if key is None:
        return _run_probe(python)
    path = paths.cache_home() / "targets" / f"{key}.json"
    cached = paths.read_json(path)
    if isinstance(cached, dict) and _still_valid(cached):
        return cached
    probe = _run_probe(python)
    paths.write_json(path, probe)
    return probe


def _probe_key(python: str) -> str | None:
    try:
        binary = os.stat(python)
    except OSError:
        return None
    facts = [os.path.realpath(python), python, binary.st_mtime_ns, os.getcwd(), [os.environ.get(v) for v in _PATH_ENV]]
    return hashlib.sha256(json.dumps(facts).encode()).hexdigest()[:32]


def _still_valid(probe: dict) -> bool:
    try:
        stamps_match = all(os.stat(d).st_mtime_ns == t for d, t in probe["stamps"].items())
        return stamps_match and all(os.path.isdir(f["dist_info"] or "") for f in probe["found"])
    except (OSError, KeyError, TypeError, AttributeError):
        return False


def _run_probe(python: str) -> dict:
    try:
        proc = subprocess.run(
            [python, "-c", _PROBE % DISTRIBUTION], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TargetError(f"{python} is not a usable Python interpreter ({exc.__class__.__name__})") from None
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        detail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise TargetError(f"{python} is not a usable Python interpreter: {detail}") from None
