"""`pip check` and `uv pip check` of a target environment, as one set of complaint lines (empty: healthy)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from tests.support import artefacts

UV = "uv==0.13.9"


def uv_binary(directory: Path) -> Path:
    """The uv binary out of its wheel (artefacts: cached, else downloaded with pip; about 17 MB)."""
    target = directory / "uv"
    with zipfile.ZipFile(artefacts.wheel(UV)) as zf:
        member = next(n for n in zf.namelist() if n.endswith(".data/scripts/uv"))
        target.write_bytes(zf.read(member))
    target.chmod(0o755)
    return target


def complaints(python: Path, uv: Path) -> set[str]:
    """Every line `pip check` and `uv pip check` report about the environment of `python`."""
    pip = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "check"], capture_output=True, text=True, check=False)
    assert pip.returncode in (0, 1), pip.stderr
    found = {f"pip: {line}" for line in pip.stdout.splitlines() if line and not line.startswith("No broken requirements")}
    checked = subprocess.run([str(uv), "pip", "check", "--python", str(python)], capture_output=True, text=True, check=False)
    assert checked.returncode in (0, 1), checked.stderr
    lines = (line.strip() for line in (checked.stdout + checked.stderr).splitlines())
    return found | {f"uv: {line}" for line in lines if line.startswith(("The package", "warning", "error", "The environment"))}
