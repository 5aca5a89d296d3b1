"""paths.py: the one root for everything gptoss-patch writes for the user, and `gptoss-patch cache`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gptoss_patch import paths, vocab, wheels
from gptoss_patch.errors import UsageError, WriteFailed
from gptoss_patch.launcher import runner, static
from tests.support.cli import run


def test_the_root_is_gptoss_patch_cache_then_xdg_then_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("GPTOSS_PATCH_CACHE", str(tmp_path / "mine"))
    assert paths.cache_root() == tmp_path / "mine"
    monkeypatch.delenv("GPTOSS_PATCH_CACHE")
    assert paths.cache_root() == tmp_path / "xdg" / "gptoss-patch"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")  # invalid per the XDG spec: ignored
    assert paths.cache_root() == Path.home() / ".cache" / "gptoss-patch"


def test_every_place_the_tool_writes_is_under_the_one_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bug of the first-run issue: GPTOSS_PATCH_CACHE set, and memos still went to ~/.cache."""
    root = tmp_path / "root"
    monkeypatch.setenv("GPTOSS_PATCH_CACHE", str(root))
    monkeypatch.delenv("GPTOSS_PATCH_WHEEL_CACHE", raising=False)
    places = [wheels.cache_dir(), vocab.default_dir(), static.default_cache_dir(), runner.default_log_file(),
              *(paths.entry_dir(e.name) for e in paths.ENTRIES)]
    assert all(root in place.parents for place in places), places


def test_the_wheel_cache_alone_can_live_elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPTOSS_PATCH_CACHE", str(tmp_path / "root"))
    monkeypatch.setenv("GPTOSS_PATCH_WHEEL_CACHE", str(tmp_path / "shared-wheels"))
    assert wheels.cache_dir() == tmp_path / "shared-wheels" and vocab.default_dir() == tmp_path / "root" / "tiktoken"


def test_a_root_that_is_a_file_is_a_usage_error_for_every_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("keep")
    monkeypatch.setenv("GPTOSS_PATCH_CACHE", str(blocker))
    with pytest.raises(UsageError, match="is not a directory"):
        paths.cache_root()
    for command in (("cache", "dir"), ("cache", "info"), ("status",)):
        result = run(*command)
        first = result.stderr.splitlines()[0]
        assert (result.exit_code, first) == (2, f"error: GPTOSS_PATCH_CACHE={blocker} is not a directory"), command
    assert blocker.read_text() == "keep"


def test_writable_dir_refuses_with_exit_7_naming_the_path(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(WriteFailed, match=f"cannot create the wheel cache {blocker / 'x'}: Not a directory") as caught:
        paths.writable_dir(blocker / "x", what="the wheel cache")
    assert caught.value.exit_code == 7


def test_cache_info_and_clean_measure_and_remove_all_but_the_logs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "root"
    monkeypatch.setenv("GPTOSS_PATCH_CACHE", str(root))
    monkeypatch.delenv("GPTOSS_PATCH_WHEEL_CACHE", raising=False)
    for name, size in (("wheels", 3000), ("targets", 10), ("logs", 500)):
        (root / name).mkdir(parents=True)
        (root / name / "f").write_bytes(b"x" * size)
    (root / "wheels" / "link").hardlink_to(root / "wheels" / "f")  # counted once
    result = run("cache", "dir")
    assert (result.exit_code, result.stdout) == (0, f"{root}\n")
    result = run("cache", "info", "--json")
    sizes = {e["name"]: e["bytes"] for e in json.loads(result.stdout)["entries"]}
    assert result.exit_code == 0
    assert (sizes["wheels"], sizes["targets"], sizes["logs"], sizes["venvs"]) == (3000, 10, 500, 0)
    result = run("cache", "clean")
    assert result.exit_code == 0 and result.stdout.endswith("Freed 2.9 KiB\n")
    assert sorted(p.name for p in root.iterdir()) == ["logs"]
    result = run("cache", "clean", "--all", "--json")
    assert result.exit_code == 0
    assert [u["name"] for u in json.loads(result.stdout)["removed"]] == ["logs"] and not any(root.iterdir())


def test_cache_clean_keeps_the_exported_vocabulary_unless_asked_and_then_warns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`vocab install` printed exports naming the root's tiktoken/: a default clean must leave `vocab status` OK."""
    root = tmp_path / "root"
    monkeypatch.setenv("GPTOSS_PATCH_CACHE", str(root))
    monkeypatch.delenv("TIKTOKEN_RS_CACHE_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    vocabulary = root / "tiktoken"
    vocabulary.mkdir(parents=True)
    (vocabulary / vocab.O200K.file_name).write_bytes(b"stand-in")
    monkeypatch.setattr(vocab, "O200K", vocab.Encoding("o200k_base", vocab.sha256(b"stand-in")))  # no download
    (root / "targets").mkdir()
    monkeypatch.setenv("TIKTOKEN_ENCODINGS_BASE", str(vocabulary))  # what `vocab install` told the user to export
    result = run("cache", "clean")
    assert result.exit_code == 0 and not (root / "targets").exists() and (vocabulary / vocab.O200K.file_name).is_file()
    kept = f"Kept the harmony vocabulary {vocabulary} (your exports point there); `cache clean tiktoken` removes it"
    assert kept in result.stderr
    assert run("vocab", "status").exit_code == 0
    result = run("cache", "clean", "--json")
    assert json.loads(result.stdout)["kept_vocabulary"] == str(vocabulary)
    result = run("cache", "clean", "--all")
    assert result.exit_code == 0 and not vocabulary.exists()
    assert "warning: removed the harmony vocabulary `vocab install` exported: `vocab status` now fails" in result.stderr
    result = run("vocab", "status")
    assert result.exit_code == 1 and "NOT OK" in result.stdout  # what the warning said


def test_cache_clean_of_an_unknown_entry_removes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPTOSS_PATCH_CACHE", str(tmp_path))
    (tmp_path / "targets").mkdir()
    result = run("cache", "clean", "targets", "nonsense")
    assert result.exit_code == 2 and result.stderr.startswith("error: no cache entry named nonsense")
    assert (tmp_path / "targets").is_dir()


def test_the_cache_table_holds_at_80_columns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPTOSS_PATCH_CACHE", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "80")
    result = run("cache", "info")
    assert result.exit_code == 0 and max(len(line) for line in result.stdout.splitlines()) <= 80
    assert all(entry.name in result.stdout for entry in paths.ENTRIES)


def test_the_docs_table_lists_every_entry() -> None:
    """docs/caches.md is what users read: it may not lag behind paths.ENTRIES."""
    table = (Path(__file__).resolve().parent.parent / "docs" / "caches.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip().strip("`") for line in table.splitlines() if line.startswith("| `")}
    assert rows == {entry.name for entry in paths.ENTRIES}
