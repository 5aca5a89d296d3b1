"""User patches that create files: capture writes a git-style creation, apply creates the file in the
same journalled transaction (RECORD lists it while applied), status/audit/the hook accept it, revert removes
it and RECORD is byte-identical again; an existing file is a conflict; failures and crashes leave no half
state; deletions are refused with one line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gptoss_patch import engine
from gptoss_patch.engine import faults
from gptoss_patch.engine.record import read_hashes
from gptoss_patch.errors import WriteFailed
from gptoss_patch.hook import plugin
from gptoss_patch.userpatches import load_dirs
from tests.support.cli import run, run_process, states
from tests.support.injected import injected
from tests.support.markers import needs
from tests.support.userpatches import (
    ENVS,
    ENVS_REL,
    EXAMPLE,
    assert_refused_at_load,
    build,
    edit,
    plugin_env,
    replace_text,
    snapshot,
    wheel_of,
)

NEW_REL = "vllm/local_helpers.py"
NEW = "def answer() -> int:\n    return 42\n"


@pytest.fixture
def site(tmp_path: Path):
    inst = build(tmp_path / "venv")
    patches = tmp_path / "patches"
    patches.mkdir()
    return inst, tmp_path / "venv", patches


def creation(rel: str = NEW_REL, text: str = NEW, versions: str = "==0.17.1") -> str:
    lines = text.splitlines(keepends=True)
    body = "".join(f"+{line}" for line in lines)
    return (f"# gptoss-patch user patch: helpers\n# vllm: {versions}\ndiff --git a/{rel} b/{rel}\nnew file mode 100644\n"
            f"--- /dev/null\n+++ b/{rel}\n@@ -0,0 +1,{len(lines)} @@\n{body}")


def pip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, check=False)


def test_capture_writes_a_new_file_as_a_creation_that_git_applies_and_revert_removes(site, tmp_path):
    inst, venv, patches = site
    pristine_record = inst.record.read_bytes()
    (inst.site_packages / NEW_REL).write_text(NEW)
    (inst.site_packages / "vllm" / "blob.bin").write_bytes(b"\xff\xfe\x00")
    result = run("capture", "helpers", "--dir", str(patches), "--venv", str(venv))  # no --from: nothing pristine needed
    assert result.exit_code == 0, result.stderr
    assert f"{NEW_REL} (new)" in result.stderr
    assert "vllm/blob.bin is a new file that is not UTF-8 text: not captured" in result.stderr
    text = (patches / "helpers.diff").read_text()
    assert f"diff --git a/{NEW_REL} b/{NEW_REL}\nnew file mode 100644\n--- /dev/null\n+++ b/{NEW_REL}\n@@ -0,0 +1,2 @@\n" in text

    other = build(tmp_path / "other")  # a pristine copy: real git apply -p1 from its site-packages creates the file
    subprocess.run(["git", "apply", "--check", "-p1", str(patches / "helpers.diff")], cwd=other.site_packages, check=True)
    subprocess.run(["git", "apply", "-p1", str(patches / "helpers.diff")], cwd=other.site_packages, check=True)
    assert (other.site_packages / NEW_REL).read_text() == NEW

    # recorded as applied: the ledger marks it created, RECORD lists it with its hash, audit and the hook accept it
    assert states(venv, "--patch-dir", str(patches))["helpers"] == "applied"
    assert NEW_REL in read_hashes(inst.record, {NEW_REL})
    (inst.site_packages / "vllm" / "blob.bin").unlink()
    assert run("audit", "--venv", str(venv)).exit_code == 0
    assert plugin.evaluate(inst.site_packages, None).problems == []

    result = run("revert", "--venv", str(venv), "--only", "helpers")
    assert result.exit_code == 0, result.stderr
    assert not (inst.site_packages / NEW_REL).exists()
    assert inst.record.read_bytes() == pristine_record
    assert states(venv, "--patch-dir", str(patches))["helpers"] == "pending"


def test_apply_creates_the_file_lists_it_in_record_and_pip_uninstall_removes_it(site, tmp_path):
    inst, venv, patches = site
    (patches / "helpers.diff").write_text(creation())
    pristine_record = inst.record.read_bytes()
    assert states(venv, "--patch-dir", str(patches))["helpers"] == "pending"
    result = run("apply", "--venv", str(venv), "--patch-dir", str(patches))
    assert result.exit_code == 0, result.stderr
    assert (inst.site_packages / NEW_REL).read_text() == NEW
    got = states(venv, "--patch-dir", str(patches))
    assert got["helpers"] == "applied" and got["marlin_atomic_add_sm121"] == "applied"
    assert run("audit", "--venv", str(venv)).exit_code == 0
    assert run("apply", "--venv", str(venv), "--patch-dir", str(patches)).exit_code == 0  # idempotent
    ledger = json.loads((inst.dist_info / "gptoss_patch" / "ledger.json").read_text())
    assert ledger["files"][NEW_REL]["created"] is True and ledger["files"][NEW_REL]["patches"] == ["helpers"]
    assert plugin.evaluate(inst.site_packages, None).problems == []

    # revert all: the file goes, RECORD is what pip wrote
    assert run("revert", "--venv", str(venv)).exit_code == 0
    assert not (inst.site_packages / NEW_REL).exists() and inst.record.read_bytes() == pristine_record

    # pip sees a consistent installation, and uninstalling vllm leaves the created file behind nowhere
    assert run("apply", "--venv", str(venv), "--patch-dir", str(patches)).exit_code == 0
    check = pip("--python", inst.python, "check")
    assert check.returncode == 0, check.stdout + check.stderr
    gone = pip("--python", inst.python, "uninstall", "-y", "vllm")
    assert gone.returncode == 0, gone.stdout + gone.stderr
    assert not (inst.site_packages / NEW_REL).exists() and not inst.dist_info.exists()


def test_creating_a_file_that_exists_is_a_conflict_naming_it_and_nothing_is_written(site):
    inst, venv, patches = site
    (patches / "helpers.diff").write_text(creation())
    path = inst.site_packages / NEW_REL
    for content, how in (("x = 1\n", "with other content"), (NEW, "did not create it")):
        path.write_text(content)
        before = snapshot(inst)
        status = json.loads(run("status", "--venv", str(venv), "--json", "--patch-dir", str(patches)).stdout)
        mine = next(p for p in status["patches"] if p["id"] == "helpers")
        assert mine["state"] == "conflict" and NEW_REL in mine["reason"] and how in mine["reason"], mine
        result = run("apply", "--venv", str(venv), "--patch-dir", str(patches))
        assert result.exit_code == 5 and NEW_REL in result.stderr.splitlines()[0]
        assert snapshot(inst) == before and not (inst.dist_info / "gptoss_patch").exists()


def test_a_file_under_a_file_or_removed_after_creation_is_reported(site):
    inst, venv, patches = site
    (patches / "helpers.diff").write_text(creation("vllm/envs.py/helpers.py"))
    status = json.loads(run("status", "--venv", str(venv), "--json", "--patch-dir", str(patches)).stdout)
    mine = next(p for p in status["patches"] if p["id"] == "helpers")
    assert mine["state"] == "conflict" and "but vllm/envs.py is a file in vllm 0.17.1, not a folder" in mine["reason"]
    (patches / "helpers.diff").write_text(creation())
    assert run("apply", "--venv", str(venv), "--patch-dir", str(patches)).exit_code == 0
    (inst.site_packages / NEW_REL).unlink()
    assert states(venv, "--patch-dir", str(patches))["helpers"] == "modified"
    result = run("capture", "again", "--dir", str(patches), "--venv", str(venv))
    assert result.exit_code == 1 and f"{NEW_REL} was removed after gptoss-patch created it" in result.stderr
    assert run("revert", "--venv", str(venv), "--only", "helpers").exit_code == 0
    assert NEW_REL not in read_hashes(inst.record)


def test_a_failed_write_rolls_the_creation_back_file_and_record_row_alike(site):
    inst, venv, patches = site
    (patches / "helpers.diff").write_text(creation())
    envs = inst.site_packages / ENVS_REL
    edit(inst, ENVS_REL, "VLLM_PORT = None", "VLLM_PORT = 1")  # a second patch, on a file written after the new one
    import difflib

    changed = envs.read_text()
    envs.write_text(ENVS)
    diff = "".join(difflib.unified_diff(ENVS.splitlines(True), changed.splitlines(True), f"a/{ENVS_REL}", f"b/{ENVS_REL}"))
    (patches / "port.diff").write_text("# vllm: ==0.17.1\n" + diff)
    before = snapshot(inst)
    user = load_dirs([patches])
    created: list[Path] = []

    def deny(step: str, path: Path | None) -> None:
        if step == "after-file" and path is not None and path.name == "local_helpers.py":
            created.append(path)
        if step == "before-rename" and created and path == envs:
            raise PermissionError(13, "Permission denied")

    with injected(deny), pytest.raises(WriteFailed, match="permission denied"):
        engine.apply(inst, user=user)
    assert created, "the new file was written before the failure"
    assert snapshot(inst) == before
    assert not (inst.site_packages / NEW_REL).exists() and NEW_REL not in read_hashes(inst.record)


@pytest.mark.parametrize("step", ["record-registered", "after-file"])
def test_a_crash_mid_creation_is_completed_by_the_next_command(site, step):
    inst, venv, patches = site
    (patches / "helpers.diff").write_text(creation())
    user = load_dirs([patches])

    def crash(at: str, path: Path | None) -> None:
        if at == step and (path is None or path.name in ("RECORD", "local_helpers.py")):
            if at == "record-registered" and NEW_REL not in read_hashes(inst.record):
                return  # the ledger's own rows: not yet the new file's
            raise KeyboardInterrupt  # stands in for a kill; tests/engine/test_faults.py uses SIGKILL

    with injected(crash), pytest.raises(KeyboardInterrupt):
        engine.apply(inst, user=user)
    report = engine.status(inst)
    assert report.notices and "completed an interrupted apply" in report.notices[0]
    assert (inst.site_packages / NEW_REL).read_text() == NEW and NEW_REL in read_hashes(inst.record)
    assert states(venv, "--patch-dir", str(patches))["helpers"] == "applied"


def test_a_crash_mid_revert_removes_the_file_and_its_row_on_the_next_command(site):
    inst, venv, patches = site
    (patches / "helpers.diff").write_text(creation())
    pristine_record = inst.record.read_bytes()
    assert run("apply", "--venv", str(venv), "--patch-dir", str(patches)).exit_code == 0

    def crash(at: str, path: Path | None) -> None:
        if at == "file-replaced" and path is not None and path.name == "local_helpers.py":
            raise KeyboardInterrupt

    with injected(crash), pytest.raises(KeyboardInterrupt):
        engine.revert(inst)
    assert not (inst.site_packages / NEW_REL).exists() and NEW_REL in read_hashes(inst.record)  # mid-way
    report = engine.status(inst)
    assert report.notices and "completed an interrupted revert" in report.notices[0]
    assert inst.record.read_bytes() == pristine_record


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (f"--- a/{ENVS_REL}\n+++ /dev/null\n@@ -1 +0,0 @@\n-a\n", f"deletes a/{ENVS_REL}; user patches cannot delete vllm files"),
        ("--- /dev/null\n+++ b/setup_extra.py\n@@ -0,0 +1 @@\n+b\n", "touches 'b/setup_extra.py', which is not a file of the vllm package"),
        ("--- /dev/null\n+++ b/vllm/../evil.py\n@@ -0,0 +1 @@\n+b\n", "touches 'b/vllm/../evil.py'"),
        ("--- /dev/null\n+++ /tmp/evil.py\n@@ -0,0 +1 @@\n+b\n", "touches '/tmp/evil.py'"),
    ],
)
def test_bad_creations_and_deletions_are_refused_at_load_with_one_line(site, body, why):
    inst, venv, patches = site
    assert_refused_at_load(inst, venv, patches, body, why)


def test_capture_says_when_it_sees_a_deleted_file(site, tmp_path):
    inst, venv, patches = site
    (inst.site_packages / ENVS_REL).unlink()
    result = run("capture", "gone", "--dir", str(patches), "--venv", str(venv))
    assert result.exit_code == 1
    assert f"{ENVS_REL} was deleted: not captured (user patches cannot delete files" in result.stderr
    assert not list(patches.iterdir())


def test_a_creation_then_an_edit_of_another_file_in_one_capture_apply_on_a_fresh_install(site, tmp_path):
    inst, venv, patches = site
    (inst.site_packages / NEW_REL).write_text(NEW)
    edit(inst, ENVS_REL, "VLLM_PORT = None", "VLLM_PORT = 8123")
    wheel = tmp_path / "pristine.whl"
    wheel_of(build(tmp_path / "pristine"), wheel)
    result = run("capture", "both", "--dir", str(patches), "--venv", str(venv), "--from", str(wheel))
    assert result.exit_code == 0, result.stderr
    fresh = build(tmp_path / "fresh")
    assert run("apply", "--venv", str(tmp_path / "fresh"), "--patch-dir", str(patches)).exit_code == 0
    for rel in (NEW_REL, ENVS_REL):
        assert (fresh.site_packages / rel).read_bytes() == (inst.site_packages / rel).read_bytes()
    shutil.rmtree(tmp_path / "pristine")


def _points(trace: Path) -> list[str]:
    """`--at` specs for every step of a traced run that touches the new file or RECORD, or has no path (journal, ledger)."""
    from collections import Counter

    seen: Counter[str] = Counter()
    specs = []
    for line in trace.read_text().splitlines():
        step, path, *_ = line.split("\t")
        if step not in faults.STEPS:
            continue
        seen[step] += 1
        if not path or path.endswith(("RECORD", "local_helpers.py")):
            specs.append(f"{step}:{seen[step]}")
    return specs


def test_sigkill_at_every_step_of_a_creation_and_its_revert_leaves_all_or_nothing(site, tmp_path):
    """The real CLI killed (SIGKILL, tests/support/crash_runner.py) at each step that touches the new file,
    RECORD, the journal or the ledger: the next `status` finds the file and its RECORD row either both there
    (the patch applied) or both absent, and `revert` then leaves RECORD as pip wrote it. The traced runs are fresh
    interpreters; the killed runs and the two after each are children of a fork server (tests/support/forkserver.py,
    checked against fresh interpreters by tests/engine/test_faults.py::test_a_forked_run_is_a_real_run)."""
    from tests.support.forkserver import ForkServer
    from tests.support.safety import KILLED, gptoss

    inst, venv, patches = site
    (patches / "helpers.diff").write_text(creation())
    pristine_record = inst.record.read_bytes()
    rel_record = inst.record.relative_to(venv)
    applied = tmp_path / "applied"
    subprocess.run(["cp", "-al", str(venv), str(applied)], check=True)
    assert gptoss(applied, "apply", "--patch-dir", str(patches), trace=tmp_path / "apply.trace").returncode == 0
    assert gptoss(applied, "revert", trace=tmp_path / "revert.trace").returncode == 0
    shutil.rmtree(applied)
    runs = [("apply", spec) for spec in _points(tmp_path / "apply.trace")]
    runs += [("revert", spec) for spec in _points(tmp_path / "revert.trace")]
    assert len(runs) >= 15
    template = tmp_path / "template"  # applied once: the start of every revert run
    subprocess.run(["cp", "-al", str(venv), str(template)], check=True)
    assert gptoss(template, "apply", "--patch-dir", str(patches)).returncode == 0
    new = inst.site_packages.relative_to(venv) / NEW_REL

    def kill_then_check(n: int, command: str, spec: str) -> None:
        work = tmp_path / f"run{n}"
        subprocess.run(["cp", "-al", str(venv if command == "apply" else template), str(work)], check=True)
        killed = gptoss(work, command, *(["--patch-dir", str(patches)] if command == "apply" else []), at=(spec,),
                        forks=forks)
        assert killed.returncode == KILLED, (command, spec, killed.stderr)
        status = gptoss(work, "status", "--json", "--patch-dir", str(patches), forks=forks)
        assert status.returncode in (0, 1), (command, spec, status.stderr)
        exists = (work / new).exists()
        listed = NEW_REL in read_hashes(work / rel_record)
        state = states(status)["helpers"]
        assert exists == listed and state == ("applied" if exists else "pending"), (command, spec, exists, listed, state)
        if exists:
            assert (work / new).read_text() == NEW
        assert gptoss(work, "revert", forks=forks).returncode == 0, (command, spec)
        assert not (work / new).exists() and (work / rel_record).read_bytes() == pristine_record, (command, spec)
        shutil.rmtree(work)

    # Each run is its own copy of the venv and its own processes: two at a time halve the wall time on 2 cores.
    with ForkServer() as forks, ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(lambda job: kill_then_check(job[0], *job[1]), enumerate(runs)))  # re-raises the first failure


# -- capture without --from: the release's wheel from gptoss-patch's wheel cache, downloaded by pip on a miss --


@pytest.fixture
def index(site, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A local package index (pip --find-links) holding the fake release's wheel, and an empty wheel cache."""
    inst, venv, patches = site
    links = tmp_path / "links"
    links.mkdir()
    wheel_of(inst, links / "vllm-0.17.1-py3-none-any.whl")
    cache = tmp_path / "wheel-cache"
    monkeypatch.setenv("GPTOSS_PATCH_WHEEL_CACHE", str(cache))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    return inst, venv, patches, links, cache


def test_capture_without_from_downloads_the_release_wheel_into_the_cache_once(index):
    inst, venv, patches, links, cache = index
    edit(inst, ENVS_REL, "VLLM_PORT = None", "VLLM_PORT = 8123")
    result = run("capture", "port", "--dir", str(patches), "--venv", str(venv))
    assert result.exit_code == 0, result.stderr
    lines = result.stderr.splitlines()
    assert lines[0] == f"Downloading vllm==0.17.1 (the wheel of vllm 0.17.1) into {cache} with pip", lines
    assert [p.name for p in cache.iterdir()] == ["vllm-0.17.1-py3-none-any.whl"]
    assert "+VLLM_PORT = 8123\n" in (patches / "port.diff").read_text()
    assert states(venv, "--patch-dir", str(patches))["port"] == "applied"

    shutil.rmtree(links)  # cached now: a second capture needs no index
    edit(inst, fakesite_marlin(), "import torch\n", "import torch  # mine\n")
    result = run("capture", "torch", "--dir", str(patches), "--venv", str(venv))
    assert result.exit_code == 0, result.stderr
    assert "Downloading" not in result.stderr


def test_a_failed_download_is_one_line_naming_the_wheel_the_index_and_from_and_writes_nothing(index):
    inst, venv, patches, links, cache = index
    (links / "vllm-0.17.1-py3-none-any.whl").unlink()
    edit(inst, ENVS_REL, "VLLM_PORT = None", "VLLM_PORT = 8123")
    before = snapshot(inst)
    result = run("capture", "port", "--dir", str(patches), "--venv", str(venv))
    assert result.exit_code == 4, result.stderr  # TargetError
    error = next(line for line in result.stderr.splitlines() if line.startswith("error: "))
    assert error.startswith(f"error: vllm==0.17.1 is not in {cache} and pip could not download it from no index (PIP_NO_INDEX), "
                            f"links {links}: "), error
    assert "pass --from WHEEL with the wheel of vllm 0.17.1" in result.stderr
    assert not list(patches.iterdir()) and snapshot(inst) == before and not (inst.dist_info / "gptoss_patch").exists()
    result = run("capture", "port", "--dir", str(patches), "--venv", str(venv), "--no-download")
    assert result.exit_code == 2 and "pass --from with its wheel (--no-download: none was fetched)" in result.stderr
    assert "Downloading" not in result.stderr and not list(patches.iterdir())


def test_a_cached_wheel_that_is_not_the_release_is_refused_by_record(index):
    inst, venv, patches, links, cache = index
    cache.mkdir()
    other = build(Path(str(cache) + "-other"))
    (other.site_packages / ENVS_REL).write_text("# another build\n")
    wheel_of(other, cache / "vllm-0.17.1-cp311-cp311-linux_x86_64.whl")
    edit(inst, ENVS_REL, "VLLM_PORT = None", "VLLM_PORT = 8123")
    result = run("capture", "port", "--dir", str(patches), "--venv", str(venv))
    assert result.exit_code == 2 and "no cached wheel of vllm 0.17.1" in result.stderr and "matches its RECORD" in result.stderr
    assert not list(patches.iterdir())


def fakesite_marlin() -> str:
    from tests.support import fakesite

    return fakesite.MARLIN_REL


@pytest.fixture
@needs("upstream")  # a --no-deps install of the real 0.17.1 wheel, which the wheel cache holds
def real(tmp_path: Path):
    from tests.support.upstream import fresh_install, site_packages

    venv = tmp_path / "venv"
    fresh_install("0.17.1", venv)
    patches = tmp_path / "patches"
    patches.mkdir()
    return venv, site_packages(venv), patches


def test_real_release_capture_without_from_takes_the_cached_wheel_and_carries_a_new_file(real, tmp_path):
    """On the real vllm 0.17.1 (--no-deps install): an edit to envs.py and a new module, captured with no
    --from (the release's wheel comes from the wheel cache the tests share), applied on a fresh install,
    reverted there with RECORD as pip wrote it."""
    from tests.support.upstream import fresh_install, site_packages

    venv, site, patches = real
    replace_text(site / ENVS_REL, '"VLLM_HOST_IP": lambda: os.getenv("VLLM_HOST_IP", ""),',
                 '"VLLM_HOST_IP": lambda: os.getenv("VLLM_HOST_IP", "127.0.0.1"),')
    (site / NEW_REL).write_text(NEW)
    result = run("capture", "site-local", "--dir", str(patches), "--venv", str(venv))
    assert result.exit_code == 0, result.stderr
    assert "Downloading" not in result.stderr  # the shared cache holds the 0.17.1 wheel already
    text = (patches / "site-local.diff").read_text()
    assert f"--- a/{ENVS_REL}\n" in text and f"--- /dev/null\n+++ b/{NEW_REL}\n" in text
    assert run("audit", "--venv", str(venv)).exit_code == 0

    fresh = tmp_path / "fresh"
    fresh_install("0.17.1", fresh)
    new_site = site_packages(fresh)
    record = next(new_site.glob("vllm-0.17.1.dist-info")) / "RECORD"
    pristine = record.read_bytes()
    subprocess.run(["git", "apply", "--check", "-p1", str(patches / "site-local.diff")], cwd=new_site, check=True)
    result = run("apply", "--venv", str(fresh), "--patch-dir", str(patches))
    assert result.exit_code == 0, result.stderr
    assert (new_site / NEW_REL).read_text() == NEW and (new_site / ENVS_REL).read_bytes() == (site / ENVS_REL).read_bytes()
    assert run("audit", "--venv", str(fresh)).exit_code == 0
    assert run("revert", "--venv", str(fresh)).exit_code == 0
    assert not (new_site / NEW_REL).exists() and record.read_bytes() == pristine


def test_diff_shows_a_pending_creation_as_git_applies_it_and_capture_files_takes_one_new_file(site, tmp_path):
    inst, venv, patches = site
    (patches / "helpers.diff").write_text(creation())
    result = run("diff", "--venv", str(venv), "--patch-dir", str(patches), "--only", "helpers")
    assert result.exit_code in (0, 1), result.stderr
    assert f"--- /dev/null\n+++ b/{NEW_REL}\n" in result.stdout
    shown = tmp_path / "shown.diff"
    shown.write_text(result.stdout)
    other = build(tmp_path / "other")
    subprocess.run(["git", "apply", "--check", "-p1", str(shown)], cwd=other.site_packages, check=True)
    assert not (inst.site_packages / NEW_REL).exists()  # a dry run

    (patches / "helpers.diff").unlink()
    (inst.site_packages / NEW_REL).write_text(NEW)
    (inst.site_packages / "vllm" / "other_new.py").write_text("x = 1\n")
    result = run("capture", "one", "--dir", str(patches), "--venv", str(venv), "--files", NEW_REL)
    assert result.exit_code == 0, result.stderr
    text = (patches / "one.diff").read_text()
    assert f"+++ b/{NEW_REL}\n" in text and "other_new.py" not in text
    result = run("capture", "two", "--dir", str(patches), "--venv", str(venv), "--files", "vllm/nothing_here.py")
    assert result.exit_code == 2 and "neither listed in vllm's RECORD nor a file in the package" in result.stderr


# -- behaviour probes shipped by plugin patches (PatchSpec.probe), run in the target like the built-ins' --


def test_a_plugin_patch_ships_a_behaviour_probe_that_verify_runs_in_the_target(site, tmp_path):
    from gptoss_patch.verify.probes import MARKER, RUNNER

    inst, venv, patches = site
    env = plugin_env(tmp_path)
    probe = EXAMPLE / "src" / "gptoss_example_patches" / "probe_example_envs_marker.py"

    def probed(payload: dict) -> dict:
        proc = subprocess.run([inst.python, "-B", str(RUNNER), json.dumps(payload)], capture_output=True, text=True, timeout=60)
        return next(json.loads(line[len(MARKER):]) for line in proc.stdout.splitlines()
                    if line.startswith(MARKER) and '"result"' in line)

    stock = probed({"probes": ["example_envs_marker"], "files": {"example_envs_marker": str(probe)}})
    assert stock["passed"] is False and "the marker is not in the imported module" in stock["evidence"]
    missing = probed({"probes": ["example_envs_marker"], "files": {"example_envs_marker": str(tmp_path / "gone.py")}})
    assert missing["passed"] is None and "cannot read its probe" in missing["evidence"]
    broken = tmp_path / "broken_probe.py"
    broken.write_text("import no_such_module_here\n")
    failed = probed({"probes": ["example_envs_marker"], "files": {"example_envs_marker": str(broken)}})
    assert failed["passed"] is False and "does not load: ModuleNotFoundError" in failed["evidence"]

    assert run_process("apply", "--venv", str(venv), env=env).returncode == 0
    verified = run_process("verify", "--venv", str(venv), "--behaviour", "--json", "--only", "example_envs_marker", env=env)
    behaviour = {p["id"]: p for p in json.loads(verified.stdout)["behaviour"]}
    assert behaviour["example_envs_marker"]["passed"] is True, verified.stderr
    assert "vllm.envs.GPTOSS_EXAMPLE_PATCHES is True" in behaviour["example_envs_marker"]["evidence"]
    assert verified.returncode == 0, verified.stderr


@pytest.fixture
@needs("harness")  # the CPU venv that imports the real vLLM 0.17.1
def harness_0171(tmp_path: Path) -> Path:
    from tests.support import harness

    return harness.clone_venv(harness.cpu_venv("0.17.1"), tmp_path / "venv")


def test_real_vllm_imports_the_plugin_patch_and_its_probe_passes_only_once_applied(harness_0171, tmp_path):
    env = plugin_env(tmp_path)
    python = str(harness_0171)
    stock = run_process("verify", "--python", python, "--behaviour", "--json", "--only", "example_envs_marker", env=env)
    assert stock.returncode == 1 and json.loads(stock.stdout)["behaviour"][0]["passed"] is False, stock.stderr
    assert run_process("apply", "--python", python, "--only", "example_envs_marker", env=env).returncode == 0
    verified = run_process("verify", "--python", python, "--behaviour", "--json", "--only", "example_envs_marker", env=env)
    behaviour = {p["id"]: p for p in json.loads(verified.stdout)["behaviour"]}
    assert behaviour["example_envs_marker"]["passed"] is True, (verified.stderr, behaviour)
    assert "site-packages/vllm/envs.py" in behaviour["example_envs_marker"]["evidence"]
    assert run_process("revert", "--python", python, env=env).returncode == 0


def test_a_plugin_whose_probe_is_not_a_file_is_left_out_with_one_line(tmp_path):
    package = tmp_path / "src" / "bad_probe_patches"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "bad_probe.py").write_text(
        "from gptoss_patch.spec import Band, PatchSpec, module_id\n"
        "SPEC = PatchSpec(id=module_id(__name__), summary='x', upstream=(), bands=(Band('>=0.15.1', 'envs.py'),),\n"
        "                 codemod=lambda: None, is_applied=lambda s, p: False, probe='probe_bad_probe.py')\n"
    )
    dist = tmp_path / "plugins" / "bad_probe_patches-0.1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: bad-probe-patches\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text("[gptoss_patch.patches]\nbad_probe = bad_probe_patches.bad_probe\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "src"), str(tmp_path / "plugins")])}
    listed = run_process("list", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    assert "bad_probe" not in {p["id"] for p in json.loads(listed.stdout)}
    assert [ln for ln in listed.stderr.splitlines() if "bad_probe" in ln] == [
        "warning: plugin bad-probe-patches 0.1.0: patch 'bad_probe' (bad_probe_patches.bad_probe) "
        "left out: its SPEC's probe 'probe_bad_probe.py' is not the absolute path of a .py file"
    ]


def test_a_failed_revert_force_that_restored_a_missing_file_keeps_its_record_row(site):
    """Only rows of created files ever leave RECORD: rolling back the restore of a deleted pip file removes
    the file again but never its RECORD row."""
    from tests.support import fakesite

    inst, venv, patches = site
    assert run("apply", "--venv", str(venv)).exit_code == 0
    (inst.site_packages / fakesite.MARLIN_REL).unlink()
    record = inst.record.read_bytes()
    before = snapshot(inst)
    seen: list[Path] = []

    def deny(step: str, path: Path | None) -> None:
        if step == "before-file" and path is not None:
            seen.append(path)
        if step == "before-rename" and len(seen) == 2 and path == seen[1]:
            raise PermissionError(13, "Permission denied")

    with injected(deny), pytest.raises(WriteFailed, match="permission denied"):
        engine.revert(inst, force=True)
    assert len(seen) >= 2  # the second write failed (then the roll-back wrote)
    assert inst.record.read_bytes() == record and snapshot(inst) == before


def test_a_new_file_in_new_folders_is_captured_created_with_its_folders_and_removed_with_them(site, tmp_path):
    inst, venv, patches = site
    package = inst.site_packages / "vllm"
    (package / "mine" / "tools").mkdir(parents=True)
    (package / "mine" / "tools" / "tool.py").write_text(NEW)
    (package / "mine" / "tools" / "__pycache__").mkdir()
    (package / "mine" / "tools" / "__pycache__" / "tool.cpython-311.pyc").write_bytes(b"\x00")  # not captured, not reported
    result = run("capture", "mine", "--dir", str(patches), "--venv", str(venv))
    assert result.exit_code == 0, result.stderr
    assert "vllm/mine/tools/tool.py (new)" in result.stderr and "not captured" not in result.stderr
    assert "+++ b/vllm/mine/tools/tool.py\n" in (patches / "mine.diff").read_text()

    # revert takes the file out, and the folders it leaves empty (its stale __pycache__ with them)
    assert run("revert", "--venv", str(venv), "--only", "mine").exit_code == 0
    assert not (package / "mine").exists()
    assert states(venv, "--patch-dir", str(patches))["mine"] == "pending"

    # apply makes the folders again; pip uninstall leaves neither file nor folder behind
    pristine_record = inst.record.read_bytes()
    assert run("apply", "--venv", str(venv), "--patch-dir", str(patches)).exit_code == 0
    assert (package / "mine" / "tools" / "tool.py").read_text() == NEW
    assert states(venv, "--patch-dir", str(patches))["mine"] == "applied"
    assert run("audit", "--venv", str(venv)).exit_code == 0
    assert run("revert", "--venv", str(venv)).exit_code == 0
    assert not (package / "mine").exists() and inst.record.read_bytes() == pristine_record
    assert run("apply", "--venv", str(venv), "--patch-dir", str(patches)).exit_code == 0
    gone = pip("--python", inst.python, "uninstall", "-y", "vllm")
    assert gone.returncode == 0, gone.stdout + gone.stderr
    assert not (package / "mine").exists()


def test_hunk_lines_that_look_like_file_headers_are_content(site):
    """A created file with a line `++ x`, an edit removing `-- y`: inside a hunk (by its counts) such lines
    are content, as git reads them, not file headers."""
    inst, venv, patches = site
    text = "QUERY = '''\n-- not a header\n'''\n"
    body = "++ also not a header\n"
    (inst.site_packages / ENVS_REL).write_text(ENVS + text)  # the file as the release would have it
    pristine = inst.site_packages / ENVS_REL
    record_line = next(line for line in inst.record.read_text().splitlines() if line.startswith(ENVS_REL + ","))
    from gptoss_patch.engine.record import row

    inst.record.write_text(inst.record.read_text().replace(record_line, row(ENVS_REL, pristine.read_bytes())))
    patch = (
        "# vllm: ==0.17.1\n"
        f"--- a/{ENVS_REL}\n+++ b/{ENVS_REL}\n@@ -5,3 +5,2 @@\n QUERY = '''\n--- not a header\n '''\n"
        f"diff --git a/{NEW_REL} b/{NEW_REL}\nnew file mode 100644\n--- /dev/null\n+++ b/{NEW_REL}\n@@ -0,0 +1 @@\n+{body}"
    )
    (patches / "tricky.diff").write_text(patch)
    (loaded,) = load_dirs([patches])
    assert loaded.files == (ENVS_REL, NEW_REL) and loaded.created == (NEW_REL,)
    result = run("apply", "--venv", str(venv), "--patch-dir", str(patches))
    assert result.exit_code == 0, result.stderr
    assert "-- not a header" not in pristine.read_text() and (inst.site_packages / NEW_REL).read_text() == body
