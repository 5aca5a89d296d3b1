"""Which installer builds the suite's venvs, and pip's configuration handed to uv: one place for both builders.

The serving venvs (tests/support/serve_venv.py) and the CPU harness venvs (tests/support/harness.py) install
with uv when it is found (the `uv` package in this interpreter, or `uv` on PATH), else with pip.
GPTOSS_PATCH_TEST_INSTALLER=pip (or uv) chooses. uv is given pip's own configuration (index, extra indexes,
find-links, constraints, certificate) and pip's "best version across all indexes" strategy, so both
installers resolve the same versions.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
from pathlib import Path

INSTALLER_ENV = "GPTOSS_PATCH_TEST_INSTALLER"  # "uv" or "pip"; unset: uv when found, else pip

# pip option -> the uv option that means the same (each value of a list option passed once)
UV_OPTIONS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
              "constraint": "--constraint", "trusted-host": "--allow-insecure-host"}


class InstallerError(RuntimeError):
    """GPTOSS_PATCH_TEST_INSTALLER names an installer that is not there, or no installer at all."""


def installer() -> str | None:
    """The uv binary to install with, or None for pip (GPTOSS_PATCH_TEST_INSTALLER decides)."""
    choice = os.environ.get(INSTALLER_ENV, "").strip().lower()
    if choice not in ("", "uv", "pip"):
        raise InstallerError(f"{INSTALLER_ENV}={choice!r}: expected uv or pip")
    if choice == "pip":
        return None
    found = _find_uv()
    if found is None and choice == "uv":
        raise InstallerError(f"{INSTALLER_ENV}=uv, but uv is neither importable here (pip install uv) nor on PATH")
    return found


def _find_uv() -> str | None:
    try:
        import uv  # the `uv` wheel from PyPI: the binary and its finder

        return str(uv.find_uv_bin())
    except (ImportError, FileNotFoundError):
        return shutil.which("uv")


def uv_options(python: Path) -> tuple[list[str], dict[str, str]]:
    """pip's configuration of `python` (files and PIP_* variables) as uv options, and the variables uv needs.

    `--index-strategy unsafe-best-match` is pip's behaviour: the best version from any index, where uv by
    default takes a package from the first index that has it. `--no-config` keeps uv's own configuration
    files out: pip's is the one both installers follow.
    """
    proc = subprocess.run([str(python), "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=120, check=False)
    config: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            try:
                config[key.strip()] = str(ast.literal_eval(value.strip()))
            except (ValueError, SyntaxError):
                config[key.strip()] = value.strip()

    def option(name: str) -> str | None:  # pip's precedence: PIP_* variables, then [install], then [global]
        for section in (":env:", "install", "global"):
            if f"{section}.{name}" in config:
                return config[f"{section}.{name}"]
        return None

    args = ["--no-config", "--index-strategy", "unsafe-best-match"]
    for name, flag in UV_OPTIONS.items():
        for value in (option(name) or "").split():
            args += [flag, value]
    if (option("no-index") or "").lower() in ("1", "true", "yes", "on"):
        args.append("--no-index")
    env = {}
    if option("cert"):
        env["SSL_CERT_FILE"] = str(option("cert"))
    return args, env
