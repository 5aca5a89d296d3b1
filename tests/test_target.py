"""Target discovery: the probe runs in the target interpreter; its cached answer is never stale."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from gptoss_patch import target
from tests.support import fakesite


@pytest.fixture
def venv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return fakesite.build(tmp_path / "venv")


def probes_run(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    real = target._run_probe
    monkeypatch.setattr(target, "_run_probe", lambda python: calls.append(python) or real(python))
    return calls


def test_a_second_lookup_reuses_the_probe(venv, monkeypatch):
    calls = probes_run(monkeypatch)
    first, second = target.discover(venv.python), target.discover(venv.python)
    assert first == second and len(calls) == 1


def test_a_reinstall_changes_the_directory_and_the_answer(venv, monkeypatch):
    calls = probes_run(monkeypatch)
    target.discover(venv.python)
    renamed = venv.dist_info.with_name("vllm-0.18.0.dist-info")
    venv.dist_info.rename(renamed)  # what an upgrade does to site-packages
    (renamed / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.18.0\n")
    assert str(target.discover(venv.python).version) == "0.18.0"
    assert len(calls) == 2


def test_a_missing_dist_info_is_never_served_from_the_cache(venv, monkeypatch):
    calls = probes_run(monkeypatch)
    target.discover(venv.python)
    stamp = venv.site_packages.stat().st_mtime_ns
    shutil.rmtree(venv.dist_info)
    os.utime(venv.site_packages, ns=(stamp, stamp))  # the directory stamp alone would not tell
    with pytest.raises(target.TargetError, match="no .dist-info there provides the vllm package"):
        target.discover(venv.python)  # the package files are still there, but nothing installed them
    assert len(calls) == 2


def test_pythonpath_is_part_of_the_key(venv, monkeypatch):
    calls = probes_run(monkeypatch)
    target.discover(venv.python)
    monkeypatch.setenv("PYTHONPATH", str(venv.site_packages.parent))
    target.discover(venv.python)
    assert len(calls) == 2
