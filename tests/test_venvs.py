"""Bytecode a harness venv takes from a built one (tests/support/venvs.py): Python must accept it as its own."""

from __future__ import annotations

import os
import py_compile
import subprocess
import sys
from pathlib import Path

from tests.support import venvs

SITE = f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
SAME = "def where():\n    return where.__code__.co_filename\n"


def site(venv: Path, files: dict[str, str], *, mtime: int) -> Path:
    packages = venv / SITE
    for name, text in files.items():
        (packages / name).parent.mkdir(parents=True, exist_ok=True)
        (packages / name).write_text(text)
        os.utime(packages / name, (mtime, mtime))
    return packages


def test_a_module_with_the_same_bytes_as_a_built_venvs_gets_its_code_under_its_own_header(tmp_path: Path) -> None:
    donor = site(tmp_path / "donor", {"pkg/__init__.py": "", "pkg/same.py": SAME, "pkg/changed.py": "x = 1\n"}, mtime=1_000_000)
    for source in donor.rglob("*.py"):
        py_compile.compile(str(source), doraise=True)  # a timestamp pyc, as compileall writes
    target = site(tmp_path / "new", {"pkg/__init__.py": "", "pkg/same.py": SAME, "pkg/changed.py": "x = 2\n"}, mtime=2_000_000)

    rest = venvs.borrow_bytecode_by_content(tmp_path / "new", [tmp_path / "donor"])

    assert rest == [target / "pkg/changed.py"]  # other bytes: compiled, never taken
    taken = target / "pkg/__pycache__" / f"same.{sys.implementation.cache_tag}.pyc"
    before = taken.stat().st_ino
    # Python writes a new pyc (by rename: a new inode) for a source whose pyc it rejects; it must keep this one, and the
    # code must name the file it was loaded from, not the donor's.
    probe = "import sys; sys.dont_write_bytecode = False; import pkg.same; print(pkg.same.where())"
    proc = subprocess.run([sys.executable, "-c", probe], env={**os.environ, "PYTHONPATH": str(target)},
                          capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == str(target / "pkg/same.py")
    assert taken.stat().st_ino == before
    assert (target / "pkg/__pycache__").is_dir() and not (target / "pkg/__pycache__" / taken.name).samefile(
        donor / "pkg/__pycache__" / taken.name)


def test_a_stale_donor_pyc_is_never_taken(tmp_path: Path) -> None:
    donor = site(tmp_path / "donor", {"pkg/same.py": SAME}, mtime=1_000_000)
    py_compile.compile(str(donor / "pkg/same.py"), doraise=True)
    os.utime(donor / "pkg/same.py", (1_000_500, 1_000_500))  # the donor's own pyc no longer matches its source
    target = site(tmp_path / "new", {"pkg/same.py": SAME}, mtime=2_000_000)

    assert venvs.borrow_bytecode_by_content(tmp_path / "new", [tmp_path / "donor"]) == [target / "pkg/same.py"]
    assert venvs.missing_bytecode(tmp_path / "new") == [target / "pkg/same.py"]
