"""The launcher's recorded facts of each vLLM release, and installations that the pre-flight checks run on, no venv.

What the pre-flight and serving-trap checks read from an installed vLLM is a handful of static facts: the
capabilities launcher/static.py reads (env-var names, serve flags, the MXFP4 selector), the release's
--gpu-memory-utilization default, the harmony requirement in its METADATA, and, for the releases the tests lay out
(LAID_OUT), the patch states `engine.status` reports before and after `apply`. `record(version)` produces them with the real readers and the real engine on the
real files of the release's wheel (read through tests/support/artefacts.py, by HTTP range requests on a miss, each
file checked against the wheel's RECORD). scripts/record_launch_facts.py writes them to
tests/launcher/facts/VERSION.json with the sha256 of every input file and of the reader's source;
tests/launcher/test_recorded.py regenerates and compares them in the slow tier. Facts only (names, flags, versions,
states, hashes): never vLLM's source text.

`RecordedInstalls` lays out an installation from those facts in a temporary directory: an empty site-packages with a
`vllm-VERSION.dist-info/METADATA` that carries the recorded Name, Version and harmony requirement, and the fake
`bin/vllm` (tests/support/fakes). While it is active, `static.read_capabilities`, `static.read_default_utilization`
and `engine.status` answer for such an installation with the recorded facts, and for every other one as before.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from packaging.version import Version

from gptoss_patch import engine
from gptoss_patch.launcher import serving_traps, static
from gptoss_patch.spec import PatchResult, Report, State
from gptoss_patch.target import Installation

FORMAT = 1
FACTS = Path(__file__).resolve().parent / "facts"
ROOT = FACTS.parents[2]
READER = Path(static.__file__).resolve()  # the static readers whose output `capabilities` is
SCRIPT = "scripts/record_launch_facts.py"
# The releases the launcher tests lay out installations of: their patch states are recorded too (status, apply, status:
# about a CPU-second each, which the slow tier pays again to compare). The static facts are recorded for every release.
LAID_OUT = ("0.16.0", "0.17.1", "0.22.1", "0.33.0")
NOTE = ("What gptoss-patch's launcher reads from the stock vllm wheel of this release, produced by the real readers "
        "and the real engine on the wheel's files (inputs: their sha256, checked against the wheel's RECORD). "
        f"Written by {SCRIPT}; tests/launcher/test_recorded.py regenerates and compares it.")


def path_of(version: str) -> Path:
    return FACTS / f"{version}.json"


def reader_digest() -> str:
    return hashlib.sha256(READER.read_bytes()).hexdigest()


# -- producing them (the script and the slow-tier comparison) ---------------------------------------------------


def input_files(version: str, dist_info: str) -> list[str]:
    """The members of the wheel the facts are read from: its METADATA and every file the static readers read; for a
    release in LAID_OUT also its RECORD and every file a patch band targets or a patch detector reads (engine.status)."""
    from gptoss_patch.registry import all_specs

    files = {f"{dist_info}/METADATA", *(f"vllm/{rel}" for rel in static.READ_FILES)}
    if version in LAID_OUT:
        patch_files = {rel for spec in all_specs() for rel in (*(band.target for band in spec.bands), *spec.reads)}
        files |= {f"{dist_info}/RECORD", *(f"vllm/{rel}" for rel in patch_files)}
    return sorted(files)


def record(version: str) -> dict[str, Any]:
    """The facts of `vllm==version`, read from its wheel's files (the slim archive of tests/support/artefacts.py)."""
    from tests.support import upstream

    wheel = upstream.sources_path(version)
    hashes = upstream.record_hashes(wheel)
    with tempfile.TemporaryDirectory(prefix="launch-facts-") as scratch, zipfile.ZipFile(wheel) as archive:
        present = set(archive.namelist())
        dist_info = next(name.split("/")[0] for name in present if name.endswith(".dist-info/RECORD"))
        site = Path(scratch) / "site-packages"
        inputs: dict[str, str | None] = {}
        for name in input_files(version, dist_info):
            if name not in present:
                inputs[name] = None
                continue
            data = archive.read(name)
            digest = hashlib.sha256(data).hexdigest()
            if name in hashes and hashes[name] != digest:
                raise AssertionError(f"vllm {version}: {name} does not match the wheel's RECORD")
            inputs[name] = digest
            (site / name).parent.mkdir(parents=True, exist_ok=True)
            (site / name).write_bytes(data)
        package = site / "vllm"
        caps = static.Capabilities(Version(version), static.read_env_registry(package),
                                   static.read_flag_registry(package), static.read_moe_selector(package))
        patches = None
        if version in LAID_OUT:
            inst = Installation(sys.executable, Version(version), site, site / dist_info)
            stock = _states(engine.status(inst))
            engine.apply(inst)
            patches = {"stock": stock, "patched": _states(engine.status(inst))}
        return {
            "format": FORMAT,
            "note": NOTE,
            "release": version,
            "produced_by": {"script": SCRIPT, "reader": str(READER.relative_to(ROOT)),
                            "reader_sha256": reader_digest()},
            "inputs": inputs,
            "dist_info": dist_info,
            "capabilities": caps.to_json(),
            "frontend_file": static.frontend_file(package),
            "default_utilization": static.read_default_utilization(package),
            "serve_defaults": static.read_serve_defaults(package),
            "requires_harmony": serving_traps.required_harmony(site / dist_info),
            "patches": patches,
        }


def _states(report: Report) -> dict[str, str]:
    return {result.id: result.state.value for result in sorted(report.results, key=lambda r: r.id)}


def dumps(facts: dict[str, Any]) -> str:
    return json.dumps(facts, indent=1, sort_keys=True) + "\n"


# -- reading them (the tests) --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Facts:
    """One release's recorded facts (tests/launcher/facts/VERSION.json)."""

    release: str
    raw: dict[str, Any]

    @property
    def version(self) -> Version:
        return Version(self.release)

    @property
    def capabilities(self) -> static.Capabilities:
        return static.Capabilities.from_json(self.version, self.raw["capabilities"])

    @property
    def default_utilization(self) -> float | None:
        return self.raw["default_utilization"]

    @property
    def requires_harmony(self) -> str | None:
        return self.raw["requires_harmony"]

    @property
    def frontend_file(self) -> str | None:
        return self.raw["frontend_file"]

    def states(self, *, patched: bool) -> dict[str, str]:
        if self.raw["patches"] is None:
            raise LookupError(f"no patch states recorded for vllm {self.release}: add it to LAID_OUT in "
                              f"tests/launcher/recorded.py and run {SCRIPT} {self.release}")
        return dict(self.raw["patches"]["patched" if patched else "stock"])

    def report(self, inst: Installation, *, patched: bool) -> Report:
        reason = f"recorded in tests/launcher/facts/{self.release}.json"
        states = self.states(patched=patched)
        return Report(inst, tuple(PatchResult(pid, State(state), reason) for pid, state in states.items()))


@cache
def facts(version: str) -> Facts:
    path = path_of(version)
    if not path.exists():
        raise FileNotFoundError(f"no recorded facts for vllm {version}: run .venv/bin/python {SCRIPT} {version}")
    return Facts(version, json.loads(path.read_text(encoding="utf-8")))


def recorded_releases() -> list[str]:
    return sorted((p.stem for p in FACTS.glob("*.json")), key=Version)


def lay_out(root: Path, recorded: Facts) -> Installation:
    """An installation of `recorded` under `root` with no vLLM file in it: bin/python (this interpreter), the fake
    bin/vllm, and a site-packages holding only vLLM's dist-info METADATA, written from the recorded facts."""
    from tests.support.fakes import install_fake_vllm

    (root / "bin").mkdir(parents=True, exist_ok=True)
    python = root / "bin" / "python"
    if not python.exists():
        python.symlink_to(sys.executable)
    install_fake_vllm(root)
    site = root / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    dist_info = site / recorded.raw["dist_info"]
    dist_info.mkdir(parents=True, exist_ok=True)
    requires = f"Requires-Dist: {recorded.requires_harmony}\n" if recorded.requires_harmony else ""
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {recorded.release}\n{requires}")
    return Installation(str(python), recorded.version, site, dist_info)


class RecordedInstalls:
    """`installs[version]`: a patched installation laid out from the recorded facts (one per test, so a test may add
    files to its site-packages); `installs.stock(version)`: the same before `apply`."""

    def __init__(self, make_root: Callable[[str], Path]) -> None:
        self._make_root = make_root
        self._patched: dict[str, Installation] = {}
        self.known: dict[Path, tuple[Facts, bool]] = {}  # package_root -> (facts, patched)

    def __getitem__(self, version: str) -> Installation:
        if version not in self._patched:
            self._patched[version] = self.build(version, patched=True)
        return self._patched[version]

    def stock(self, version: str) -> Installation:
        return self.build(version, patched=False)

    def build(self, version: str, *, patched: bool) -> Installation:
        recorded = facts(version)
        inst = lay_out(self._make_root(f"recorded-{version}-{'patched' if patched else 'stock'}"), recorded)
        self.known[inst.package_root] = (recorded, patched)
        return inst

    @contextmanager
    def answering(self) -> Iterator[RecordedInstalls]:
        """The static readers and engine.status answer with the recorded facts for the installations laid out here."""
        real_capabilities, real_utilization = static.read_capabilities, static.read_default_utilization
        real_status = engine.status

        def read_capabilities(package_root: Path, version: Version, cache_dir: Path | None = None
                              ) -> static.Capabilities:
            found = self.known.get(Path(package_root))
            return found[0].capabilities if found else real_capabilities(package_root, version, cache_dir)

        def read_default_utilization(package_root: Path) -> float | None:
            found = self.known.get(Path(package_root))
            return found[0].default_utilization if found else real_utilization(package_root)

        def status(inst: Installation, *args: Any, **kwargs: Any) -> Report:
            found = self.known.get(Path(inst.package_root))
            if found is None:
                return real_status(inst, *args, **kwargs)
            assert not args and not kwargs, "the recorded patch states are those of the default selection"
            return found[0].report(inst, patched=found[1])

        replaced = {(static, "read_capabilities"): read_capabilities,
                    (static, "read_default_utilization"): read_default_utilization, (engine, "status"): status}
        saved = {key: getattr(*key) for key in replaced}
        for (module, name), function in replaced.items():
            setattr(module, name, function)
        try:
            yield self
        finally:
            for (module, name), function in saved.items():
                setattr(module, name, function)
