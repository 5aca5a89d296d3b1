"""The installers `venv create` drives: pip (the new venv's own, or ours pointed at it) or uv; their output
streamed to a callback and read for the one-line reason of a failure (no network, no such version, other)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from gptoss_patch.errors import TargetError
from gptoss_patch.provision.plan import Plan

# pip / uv output that means the index could not be reached at all (not "no such version").
_OFFLINE = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Connection refused|Network is unreachable|"
    r"Temporary failure in name resolution|Name or service not known|nodename nor servname|ConnectTimeout|"
    r"Max retries exceeded|error sending request|dns error|Failed to fetch|tcp connect error",
    re.IGNORECASE,
)
_NOT_FOUND = re.compile(r"No matching distribution found for|Could not find a version that satisfies|no version of"
                        r"|not found in the package registry", re.IGNORECASE)


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
        name = what.split("==")[0] if "==" in what else "vllm"
        return TargetError(f"{what} is not available from the package index; nothing was left installed",
                           hint=f"check the version (pip index versions {name})")
    return TargetError(f"installing {what} failed: {_last_error(output)}; nothing was left installed", detail=output)


def _last_error(output: str) -> str:
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.lower().startswith("error")]
    return (errors or lines or ["no output"])[-1]


def last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


def _checked(command: list[str], what: str) -> None:
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise TargetError(f"{what} failed: {last_line(proc.stderr)}", detail=proc.stderr)


def run_streamed(command: list[str], echo: Callable[[str], None] | None) -> subprocess.CompletedProcess[str]:
    """Run an installer, passing its lines to `echo` as they come (progress), keeping them for errors."""
    kept: list[str] = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1) as proc:
        for line in proc.stdout:  # type: ignore[union-attr]
            kept.append(line)
            if echo is not None:
                echo(line.rstrip("\n"))
    return subprocess.CompletedProcess(command, proc.returncode, "".join(kept[-400:]), "")
