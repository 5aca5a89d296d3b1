"""The installers `venv create` drives: pip (the new venv's own, or ours pointed at it) or uv; their output
streamed to a callback and read for the one-line reason of a failure (no network, no such version, other).

They run pip, uv and `python -m venv`, not code of ours that answers, so they run here rather than through
target.call; each has a timeout all the same, and errors.last_line names a failure.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from gptoss_patch import wheels
from gptoss_patch.errors import InterpreterFailed, TargetError, last_line, meaningful_lines
from gptoss_patch.provision.plan import Plan

# Seconds, per kind of installer work.
INSTALL_TIMEOUT = 3600  # one `pip install` / `uv pip install` (vLLM's CPU build with torch: about 8 GB to download)
SETUP_TIMEOUT = 600  # creating a virtualenv; uninstalling what a failed run installed

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
        """The venv's own pip; for a venv without one (uv, --without-pip), ours pointed at it; else the pip wheel
        its Python's ensurepip would install (Debian's /usr/share/python-wheels included), run by the venv's python
        from the wheel itself: nothing downloaded, nothing added to the venv."""
        if _has_module(python, "pip"):
            return [str(python), "-m", "pip"]
        if _has_module(Path(sys.executable), "pip"):
            return [sys.executable, "-m", "pip", "--python", str(python)]
        probe = wheels.probe_target(str(python))
        theirs = wheels.ensurepip_dirs(str(probe["stdlib"]), str(probe.get("wheel_pkg_dir") or "")) if probe.get("stdlib") else []
        bundled = wheels.bundled_pip([*theirs, *wheels.own_ensurepip_dirs()])
        if bundled is not None:
            return [str(python), str(bundled / "pip")]
        raise TargetError(f"{python} has no pip, neither has {sys.executable}, and Python's ensurepip has no pip wheel",
                          hint="use --uv, or install pip into the venv")

    def install_command(self, python: Path) -> list[str]:
        return [*self.pip(python), "install", "--disable-pip-version-check", "--no-input"]

    def install(self, python: Path, specs: list[str], plan: Plan, *, no_deps: bool, what: str) -> None:
        command = [*self.install_command(python), *(["--no-deps"] if no_deps else [])]
        command += [arg for link in plan.find_links for arg in ("--find-links", str(link))]
        proc = run_streamed([*command, *specs], self.echo)
        if proc.returncode != 0:
            raise _install_error(what, proc.stdout)

    def uninstall(self, python: Path, names: list[str]) -> None:
        subprocess.run([*self.pip(python), "uninstall", "-y", *names], capture_output=True, timeout=SETUP_TIMEOUT, check=False)


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
        subprocess.run([self.uv, "pip", "uninstall", "--python", str(python), *names], capture_output=True,
                       timeout=SETUP_TIMEOUT, check=False)


def _has_module(python: Path, name: str) -> bool:
    from gptoss_patch.target import answer_line, call

    source = f"import importlib.util\n{answer_line(f'importlib.util.find_spec({name!r}) is not None')}"
    try:
        return bool(call(python, source, what=f"asking {python} for {name}").answer)
    except InterpreterFailed:
        return False


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
    """An installer's reason: its last line that starts with "error" (pip and uv say it there), else its last line."""
    errors = [ln for ln in meaningful_lines(output) if ln.lower().startswith("error")]
    return errors[-1] if errors else last_line(output)


def _checked(command: list[str], what: str) -> None:
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=SETUP_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        raise TargetError(f"{what} failed: did not finish in {SETUP_TIMEOUT} s") from None
    if proc.returncode != 0:
        raise TargetError(f"{what} failed: {last_line(proc.stderr)}", detail=proc.stderr)


def run_streamed(
    command: list[str], echo: Callable[[str], None] | None, timeout: float = INSTALL_TIMEOUT
) -> subprocess.CompletedProcess[str]:
    """Run an installer, passing its lines to `echo` as they come (progress), keeping them for errors; killed after
    `timeout` seconds (its output then ends with an error line that says so)."""
    kept: list[str] = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1) as proc:
        timer = threading.Timer(timeout, proc.kill)
        timer.daemon = True  # never keeps the process alive (Ctrl-C ends it at once)
        try:
            timer.start()
            for line in proc.stdout:  # type: ignore[union-attr]
                kept.append(line)
                if echo is not None:
                    echo(line.rstrip("\n"))
            proc.wait()
        finally:
            timed_out = not timer.is_alive()
            timer.cancel()
    if timed_out and proc.returncode:
        kept.append(f"error: {command[0]} did not finish in {timeout:.0f} s\n")
    return subprocess.CompletedProcess(command, proc.returncode, "".join(kept[-400:]), "")
