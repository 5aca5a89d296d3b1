"""Real vLLM wheels for the tests: fetched with pip, cached outside the repository, never committed.

- `wheel_path(version)`: the cached wheel (downloaded with `pip download --no-deps` when missing).
- `read_from_wheel(version, relpath)`: one file out of the wheel, checked against the wheel's RECORD.
- `fresh_install(version, dest)`: a venv holding `vllm==version` installed `--no-deps`, as a hardlink
  clone of a cached base venv (about a second instead of ~20 s). Safe because gptoss-patch and pip
  only ever replace files by rename or unlink; a test must never write into a target file in place
  (use `replace_file`). The base's files are re-checked against RECORD before every clone.

A wheel that can be neither found nor downloaded fails the test with a message saying so.
"""

from __future__ import annotations

import base64
import csv
import fcntl
import hashlib
import io
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

CACHE = Path(os.environ.get("GPTOSS_PATCH_CACHE", Path.home() / ".cache" / "gptoss-patch"))
WHEELS = Path(os.environ.get("GPTOSS_PATCH_WHEEL_CACHE", CACHE / "wheels"))
TARGETS = (  # files whose pristine state every clone must start from
    "vllm/entrypoints/openai/chat_completion/serving.py",
    "vllm/model_executor/layers/quantization/mxfp4.py",
    "vllm/model_executor/layers/quantization/utils/marlin_utils.py",
    "vllm/entrypoints/openai/parser/harmony_utils.py",
    "vllm/entrypoints/serve/render/serving.py",
    "vllm/parser/harmony.py",
)


def wheel_path(version: str) -> Path:
    found = sorted(WHEELS.glob(f"vllm-{version}-*.whl"))
    if found:
        return found[-1]
    WHEELS.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", f"vllm=={version}", "-d", str(WHEELS)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    found = sorted(WHEELS.glob(f"vllm-{version}-*.whl"))
    if proc.returncode != 0 or not found:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.fail(f"the vllm=={version} wheel is not in {WHEELS} and `pip download` failed: {last}", pytrace=False)
    return found[-1]


def record_hashes(wheel: Path) -> dict[str, str]:
    with zipfile.ZipFile(wheel) as zf:
        record = next(n for n in zf.namelist() if n.endswith(".dist-info/RECORD"))
        rows = csv.reader(io.StringIO(zf.read(record).decode()))
    return {r[0]: _b64_to_hex(r[1][7:]) for r in rows if len(r) > 1 and r[1].startswith("sha256=")}


def _b64_to_hex(digest: str) -> str:
    return base64.urlsafe_b64decode(digest + "=" * (-len(digest) % 4)).hex()


def read_from_wheel(version: str, relpath: str) -> bytes:
    wheel = wheel_path(version)
    with zipfile.ZipFile(wheel) as zf:
        data = zf.read(relpath)
    assert hashlib.sha256(data).hexdigest() == record_hashes(wheel)[relpath], f"{relpath} does not match RECORD"
    return data


def site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def _base_venv(version: str) -> Path:
    base = CACHE / "venvs" / f"nodeps-vllm-{version}"
    (CACHE / "venvs").mkdir(parents=True, exist_ok=True)
    with open(CACHE / "venvs" / f".nodeps-{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if base.exists() and not _pristine(base, version):
            shutil.rmtree(base)
        if not base.exists():
            _build_base(base, version)
    return base


def _build_base(base: Path, version: str) -> None:
    wheel = wheel_path(version)
    scratch = base.with_name(base.name + ".building")
    shutil.rmtree(scratch, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(scratch)], check=True)
    pip = [sys.executable, "-m", "pip", "--python", str(scratch / "bin" / "python")]
    proc = subprocess.run([*pip, "install", "--no-deps", "--no-compile", "-q", str(wheel)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.fail(f"installing {wheel.name} --no-deps failed: {proc.stderr.strip()[-300:]}", pytrace=False)
    scratch.rename(base)


def _pristine(base: Path, version: str) -> bool:
    """The cached base still holds the wheel's bytes (a test that wrote in place would break this)."""
    site = site_packages(base)
    expected = record_hashes(wheel_path(version))
    for rel in TARGETS:
        path = site / rel
        if rel in expected and (not path.exists() or hashlib.sha256(path.read_bytes()).hexdigest() != expected[rel]):
            return False
    return not any(site.glob("vllm-*.dist-info/gptoss_patch"))


def fresh_install(version: str, dest: Path) -> Path:
    """A private venv with vllm==version (--no-deps); returns its python. Use `python -m pip` in it."""
    base = _base_venv(version)
    subprocess.run(["cp", "-al", str(base), str(dest)], check=True)
    return dest / "bin" / "python"


def replace_file(path: Path, data: bytes) -> None:
    """Change a file in a cloned venv without touching the shared inode (never write in place)."""
    tmp = path.with_name(path.name + ".test-tmp")
    tmp.write_bytes(data)
    shutil.copymode(path, tmp)
    os.replace(tmp, path)
