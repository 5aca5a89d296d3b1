"""The status / apply / verify / revert state machine on a fake install built from hand-written snippets."""

from __future__ import annotations

import re
import stat
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from gptoss_patch import engine
from gptoss_patch.engine.ledger import Store
from gptoss_patch.engine.record import read_hashes
from gptoss_patch.errors import Conflict, PatchFailed, TargetError, WriteFailed
from gptoss_patch.fsutil import sha256
from gptoss_patch.spec import Selection, State
from tests.support import fakesite
from tests.support.cli import run, states
from tests.support.fakesite import MARLIN_REL, SERVING_REL
from tests.support.injected import injected


@pytest.fixture
def inst(tmp_path: Path):
    return fakesite.build(tmp_path / "venv")


def pristine(inst) -> bool:
    hashes = read_hashes(inst.record)
    return all(sha256((inst.site_packages / rel).read_bytes()) == h for rel, h in hashes.items())


def test_stock_shapes_are_pending_and_the_missing_import_is_not_needed(inst):
    assert states(engine.status(inst)) == fakesite.STOCK_STATES


def test_apply_then_status_reports_applied_from_the_ledger(inst):
    report = engine.apply(inst)
    assert sorted(r.id for r in report.results if r.changed) == fakesite.PENDING
    after = engine.status(inst)
    assert states(after)["harmony_instructions"] == "applied"
    assert "ledger" in after.results[0].reason


def test_second_apply_writes_nothing(inst):
    engine.apply(inst)
    target = inst.site_packages / SERVING_REL
    before = (target.stat().st_mtime_ns, target.stat().st_ino, inst.record.read_bytes())
    report = engine.apply(inst)
    assert not any(r.changed for r in report.results)
    assert (target.stat().st_mtime_ns, target.stat().st_ino, inst.record.read_bytes()) == before


def test_status_does_not_import_libcst_when_hashes_prove_the_state(inst):
    engine.apply(inst)
    code = (
        "import sys; from pathlib import Path; from packaging.version import Version;"
        "from gptoss_patch import engine; from gptoss_patch.target import Installation;"
        f"i = Installation({inst.python!r}, Version('0.17.1'), Path({str(inst.site_packages)!r}), Path({str(inst.dist_info)!r}));"
        "r = engine.status(i); print(sorted(x.state.value for x in r.results), 'libcst' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    after = sorted("applied" if state == "pending" else state for state in fakesite.STOCK_STATES.values())
    assert out.strip() == f"{after} False"


def test_revert_restores_the_recorded_bytes_and_leaves_no_trace(inst):
    record_before = inst.record.read_bytes()
    engine.apply(inst)
    report = engine.revert(inst)
    assert sorted(r.id for r in report.results if r.changed) == fakesite.PENDING
    assert pristine(inst)
    assert inst.record.read_bytes() == record_before
    assert not (inst.dist_info / "gptoss_patch").exists()


def test_dry_run_shows_the_diff_and_writes_nothing(inst):
    report = engine.apply(inst, dry_run=True)
    harmony = next(r for r in report.results if r.id == "harmony_instructions")
    assert harmony.diff.startswith(f"--- a/{SERVING_REL}\n+++ b/{SERVING_REL}\n")
    assert "+def _gptoss_patch_harmony_messages(" in harmony.diff
    assert pristine(inst) and not (inst.dist_info / "gptoss_patch").exists()


def test_diff_applies_with_git_apply_from_site_packages(inst):
    diff = "".join(dict.fromkeys(r.diff for r in engine.apply(inst, dry_run=True).results if r.diff))
    subprocess.run(["git", "apply", "-p1", "-"], input=diff.encode(), cwd=inst.site_packages, check=True)
    assert states(engine.status(inst))["harmony_instructions"] == "applied"


def test_outside_edit_after_apply_is_modified_and_revert_refuses_without_force(inst):
    engine.apply(inst)
    target = inst.site_packages / MARLIN_REL
    target.write_bytes(target.read_bytes() + b"# local tweak\n")
    assert states(engine.status(inst))["marlin_atomic_add_sm121"] == "modified"
    with pytest.raises(Conflict, match="changed after gptoss-patch wrote it"):
        engine.revert(inst)
    assert target.read_bytes().endswith(b"# local tweak\n")
    engine.revert(inst, force=True)
    assert pristine(inst)


def test_missing_anchor_is_drift_and_apply_writes_nothing(tmp_path):
    inst = fakesite.build(tmp_path / "venv", files={MARLIN_REL: "def should_use_atomic_add_reduce(m, n, k, device, dtype):\n    return False\n"})
    assert states(engine.status(inst))["marlin_atomic_add_sm121"] == "drifted"
    with pytest.raises(PatchFailed, match="marlin_atomic_add_sm121 is drifted"):
        engine.apply(inst)
    assert pristine(inst) and not (inst.dist_info / "gptoss_patch").exists()


def test_skip_leaves_a_drifted_patch_out(tmp_path):
    inst = fakesite.build(tmp_path / "venv", files={MARLIN_REL: "def should_use_atomic_add_reduce():\n    return False\n"})
    engine.apply(inst, Selection(skip=("marlin_atomic_add_sm121",)))
    assert states(engine.status(inst, Selection(only=("harmony_instructions",)))) == {"harmony_instructions": "applied"}


def test_a_truncated_target_says_reinstall_whatever_is_skipped_and_the_reinstall_fixes_it(inst):
    """The file is not what RECORD says (truncated): every patch of it drifts, so --skip only moves the error to
    the next one and, with all skipped, would leave it damaged. The advice is the reinstall (issue #36, item 4)."""
    rel = fakesite.HARMONY_UTILS_REL
    target = inst.site_packages / rel
    pristine_bytes = target.read_bytes()
    lines = pristine_bytes.splitlines(True)
    target.write_bytes(b"".join(lines[: len(lines) // 2]))
    before = {p: p.read_bytes() for p in inst.site_packages.rglob("*") if p.is_file()}
    drifting = sorted(r.id for r in engine.status(inst).results if r.file == rel and r.state is State.DRIFTED)
    assert drifting  # the fake 0.17.1 has more than one patch there
    for skipped in ((), tuple(drifting[:1]), tuple(drifting)):
        with pytest.raises(PatchFailed) as caught:
            engine.apply(inst, Selection(skip=skipped))
        assert str(caught.value).startswith(f"{rel} is not the file vllm 0.17.1 installed"), caught.value
        assert inst.reinstall_command in (caught.value.hint or "") and "--skip" not in (caught.value.hint or "")
        assert {p: p.read_bytes() for p in inst.site_packages.rglob("*") if p.is_file()} == before
    target.write_bytes(pristine_bytes)  # what the printed reinstall puts back (no download on the fake site)
    assert any(r.changed for r in engine.apply(inst).results) and not engine.status(inst, Selection(only=tuple(drifting[:1]))).results[0].state.needs_action


def test_a_patched_file_damaged_later_gets_a_fix_that_works_for_all_its_patches(inst):
    """Patched, then truncated: every patch of the file is modified, so --skip would only move the refusal to the
    next one. The printed fix (revert --force of the first) works when run as printed (issue #36, item 4)."""
    import shlex

    engine.apply(inst)
    target = inst.site_packages / SERVING_REL
    data = target.read_bytes()
    target.write_bytes(data[: len(data) // 2])
    modified = [r.id for r in engine.status(inst).results if r.state is State.MODIFIED]
    assert len(modified) > 1 and all(r.file == SERVING_REL for r in engine.status(inst, Selection(only=tuple(modified))).results)
    with pytest.raises(Conflict) as caught:
        engine.apply(inst)
    hint = caught.value.hint or ""
    assert "--skip" not in hint
    fix = shlex.split(hint.split("`")[1])
    assert fix[:3] == ["gptoss-patch", "revert", "--force"]
    result = run(*fix[1:])
    assert result.exit_code == 0, result.stderr
    engine.apply(inst)
    assert not any(r.state.needs_action for r in engine.status(inst).results)
    assert target.read_bytes() == data


def test_syntax_error_in_target_fails_cleanly(tmp_path):
    broken = fakesite.SERVING + "\ndef broken(:\n"
    inst = fakesite.build(tmp_path / "venv", files={SERVING_REL: broken})
    with pytest.raises(PatchFailed, match="does not parse"):
        engine.apply(inst)
    assert pristine(inst)


def test_non_utf8_target_is_refused(tmp_path):
    inst = fakesite.build(tmp_path / "venv")
    target = inst.site_packages / SERVING_REL
    target.write_bytes(target.read_bytes() + b"# \xff\xfe\n")
    assert "not valid UTF-8" in next(r.reason for r in engine.status(inst).results if r.id == "harmony_instructions")
    with pytest.raises(PatchFailed):
        engine.apply(inst)


@pytest.mark.parametrize("prefix, newline", [pytest.param(b"", b"\r\n", id="crlf"), pytest.param(b"\xef\xbb\xbf", b"\n", id="bom")])
def test_line_endings_bom_and_mode_survive_apply_and_revert(tmp_path, prefix, newline):
    inst = fakesite.build(tmp_path / "venv")
    target = inst.site_packages / MARLIN_REL
    original = prefix + target.read_bytes().replace(b"\n", newline)
    target.write_bytes(original)
    target.chmod(0o640)
    engine.apply(inst, Selection(only=("marlin_atomic_add_sm121",)))
    patched = target.read_bytes()
    assert patched.startswith(prefix) and patched.count(b"\n") == patched.count(newline)
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    engine.revert(inst)
    assert target.read_bytes() == original and stat.S_IMODE(target.stat().st_mode) == 0o640


def test_stale_bytecode_of_a_patched_module_is_removed(inst):
    cache = inst.site_packages / MARLIN_REL
    pyc = cache.parent / "__pycache__" / "marlin_utils.cpython-311.pyc"
    pyc.parent.mkdir()
    pyc.write_bytes(b"stale")
    engine.apply(inst)
    assert not pyc.exists()


def test_unwritable_target_directory_is_refused_untouched(inst, monkeypatch):
    def deny(step: str, path: Path | None) -> None:
        if step == "before-rename":
            raise PermissionError(13, "Permission denied")

    with injected(deny), pytest.raises(WriteFailed, match="permission denied"):
        engine.apply(inst)


def test_interrupted_apply_is_completed_by_the_next_status(inst):
    def crash(step: str, path: Path | None) -> None:
        if step == "after-file":
            raise KeyboardInterrupt  # stands in for a kill; tests/engine/test_faults.py uses SIGKILL

    with injected(crash), pytest.raises(KeyboardInterrupt):
        engine.apply(inst)
    report = engine.status(inst)
    assert report.notices and "completed an interrupted apply" in report.notices[0]
    assert states(report)["harmony_instructions"] == states(report)["marlin_atomic_add_sm121"] == "applied"


def test_ledger_pointing_outside_the_package_is_refused(inst):
    engine.apply(inst)
    ledger = inst.dist_info / "gptoss_patch" / "ledger.json"
    ledger.write_text(ledger.read_text().replace(SERVING_REL, "vllm/../../../evil.py"))
    with pytest.raises(Conflict, match="outside the vllm package"):
        engine.revert(inst)


def test_ledger_with_wrong_hashes_is_refused(inst):
    engine.apply(inst)
    ledger = inst.dist_info / "gptoss_patch" / "ledger.json"
    ledger.write_text(ledger.read_text().replace('"original": "', '"original": "zz', 1))
    with pytest.raises(Conflict, match="bad hash"):
        engine.status(inst)


@pytest.mark.parametrize(
    "version, expected",
    [
        pytest.param("0.14.1", "out-of-range", id="below-every-band"),
        pytest.param("0.17.2rc1", "pending", id="release-candidate"),
        pytest.param("0.17.1+cu128", "pending", id="local-label"),
    ],
)
def test_version_gate(tmp_path, version, expected):
    inst = fakesite.build(tmp_path / "venv", version=version)
    assert states(engine.status(inst))["harmony_instructions"] == expected


def test_upstream_fix_is_detected_by_shape(tmp_path):
    fixed = fakesite.HARMONY_UTILS + "\ndef build_harmony_preamble(*, instructions=None):\n    return []\n"
    inst = fakesite.build(tmp_path / "venv", version="0.23.0", files={"vllm/entrypoints/openai/parser/harmony_utils.py": fixed})
    result = next(r for r in engine.status(inst).results if r.id == "harmony_instructions")
    assert result.state is State.FIXED_UPSTREAM and "vllm#44330" in result.reason


def test_upstream_version_without_the_fix_shape_is_drift(tmp_path):
    inst = fakesite.build(tmp_path / "venv", version="0.23.0")
    assert states(engine.status(inst))["harmony_instructions"] == "drifted"


@pytest.mark.parametrize(
    "version, why",
    [
        pytest.param("0.17.2rc1", "is a pre-release", id="release-candidate"),
        pytest.param("0.17.1+cu128", "is a local build (+cu128)", id="local-build"),
        pytest.param("0.17.1.post1", "is not a release gptoss-patch was checked against", id="post-release"),
        pytest.param("0.40.0", "is newer than every release", id="unknown-newer"),
    ],
)
def test_unverified_builds_need_explicit_permission_to_write(tmp_path, version, why):
    inst = fakesite.build(tmp_path / "venv", version=version)
    marlin = Selection(only=("marlin_atomic_add_sm121",))  # the patch whose band covers every one of these
    assert states(engine.status(inst))["marlin_atomic_add_sm121"] == "pending"  # status still gives verdicts
    with pytest.raises(TargetError, match=re.escape(why)):
        engine.apply(inst, marlin)
    assert pristine(inst) and not (inst.dist_info / "gptoss_patch").exists()
    engine.apply(inst, marlin, allow_unknown_version=True)
    assert states(engine.status(inst))["marlin_atomic_add_sm121"] == "applied"


def test_verify_compiles_with_the_target_interpreter(inst):
    engine.apply(inst)
    report = engine.verify(inst)
    assert all(r.error is None for r in report.results)
    assert "compiles with the target interpreter" in report.results[0].reason


def test_verify_reports_a_patched_file_that_lost_its_shape(inst):
    engine.apply(inst)
    store = Store(inst)
    ledger = store.load()
    target = inst.site_packages / SERVING_REL
    target.write_bytes(target.read_bytes().replace(b"_gptoss_patch_harmony_messages(\n", b"other(\n"))
    entry = ledger.files[SERVING_REL]
    with store.locked():
        store.save(replace(ledger, files={**ledger.files, SERVING_REL: replace(entry, patched=sha256(target.read_bytes()))}))
    harmony = next(r for r in engine.verify(inst).results if r.id == "harmony_instructions")
    assert harmony.error == "the patched shape is not in the file"

