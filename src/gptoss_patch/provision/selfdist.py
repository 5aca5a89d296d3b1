"""gptoss-patch itself, for the new venv: the checkout this code runs from, else a wheel re-packed from this
install (offline: no build backend, no index)."""

from __future__ import annotations

import re
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path

import gptoss_patch
from gptoss_patch import __version__
from gptoss_patch.engine import record
from gptoss_patch.provision.plan import SELF


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
