"""The user's own patches on a fake vLLM: capture, patch directories, apply/status/revert, re-apply after a
reinstall, the hook's expectation, audit, and bad input (one line, exit code, nothing written)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from gptoss_patch.hook import plugin
from tests.support import fakesite
from tests.support.cli import run, run_process, states
from tests.support.markers import needs
from tests.support.userpatches import (
    ENVS,
    ENVS_REL,
    assert_refused_at_load,
    build,
    edit,
    plugin_env,
    replace_text,
    snapshot,
    wheel_of,
)

MARLIN = fakesite.MARLIN_REL


@pytest.fixture
def site(tmp_path: Path):
    """A fake vllm 0.17.1, its pristine wheel, and a patch directory."""
    inst = build(tmp_path / "venv")
    wheel = wheel_of(inst, tmp_path / "vllm-0.17.1-py3-none-any.whl")
    patches = tmp_path / "patches"
    patches.mkdir()
    return inst, tmp_path / "venv", wheel, patches


def capture_edits(inst, venv: Path, wheel: Path, patches: Path, *extra: str):
    edit(inst, ENVS_REL, "VLLM_PORT = None", "VLLM_PORT = 8123")
    edit(inst, MARLIN, "    if not envs.VLLM_MARLIN_USE_ATOMIC_ADD:", "    # local: always allowed\n    if not envs.VLLM_MARLIN_USE_ATOMIC_ADD:")
    return run("capture", "mine", "--dir", str(patches), "--from", str(wheel), "--venv", str(venv), *extra)


def test_capture_writes_a_version_keyed_diff_that_git_applies_from_site_packages(site, tmp_path):
    inst, venv, wheel, patches = site
    result = capture_edits(inst, venv, wheel, patches)
    assert result.exit_code == 0, result.stderr
    text = (patches / "mine.diff").read_text()
    assert text.startswith("# gptoss-patch user patch: mine\n# vllm: ==0.17.1\n--- a/vllm/")
    assert f"--- a/{ENVS_REL}\n+++ b/{ENVS_REL}\n" in text and f"+++ b/{MARLIN}\n" in text
    assert "+VLLM_PORT = 8123\n" in text and "+    # local: always allowed\n" in text

    other = build(tmp_path / "other")  # a pristine copy: git apply -p1 from its site-packages gives the edited files
    subprocess.run(["git", "apply", "-p1", str(patches / "mine.diff")], cwd=other.site_packages, check=True)
    for rel in (ENVS_REL, MARLIN):
        assert (other.site_packages / rel).read_bytes() == (inst.site_packages / rel).read_bytes()

    # recorded as applied: proven by the ledger, nothing else pending for it
    assert states(venv, "--patch-dir", str(patches))["mine"] == "applied"
    assert run("audit", "--venv", str(venv)).exit_code == 0


def test_nothing_to_capture_is_one_line_and_exit_1(site):
    inst, venv, wheel, patches = site
    result = run("capture", "mine", "--dir", str(patches), "--from", str(wheel), "--venv", str(venv))
    assert result.exit_code == 1
    assert result.stderr.splitlines()[-1].startswith("nothing to capture: ")
    assert not list(patches.iterdir())


def test_capture_of_a_patched_file_keeps_only_the_users_lines(site, tmp_path):
    inst, venv, wheel, patches = site
    assert run("apply", "--venv", str(venv)).exit_code == 0
    edit(inst, MARLIN, "    return torch.cuda", "    # local tweak\n    return torch.cuda")
    edited = (inst.site_packages / MARLIN).read_bytes()
    result = run("capture", "tweak", "--dir", str(patches), "--venv", str(venv))  # the ledger has the original: no --from
    assert result.exit_code == 0, result.stderr
    text = (patches / "tweak.diff").read_text()
    assert [ln for ln in text.splitlines() if ln.startswith(("+", "-")) and not ln.startswith(("+++", "---"))] == [
        "+    # local tweak"
    ]
    assert states(venv, "--patch-dir", str(patches)) == {**states(venv), "tweak": "applied"}

    fresh = tmp_path / "fresh"  # a reinstall: pristine files, no ledger
    build(fresh)
    result = run("apply", "--venv", str(fresh), "--patch-dir", str(patches))
    assert result.exit_code == 0, result.stderr
    assert (fresh / (inst.site_packages / MARLIN).relative_to(venv)).read_bytes() == edited

    # revert --only takes out the user patch and keeps the built-in
    result = run("revert", "--venv", str(venv), "--only", "tweak")
    assert result.exit_code == 0, result.stderr
    text = (inst.site_packages / MARLIN).read_text()
    assert "# local tweak" not in text and states(venv)["marlin_atomic_add_sm121"] == "applied"


def test_reinstall_then_apply_re_applies_user_patches_with_the_built_ins_and_revert_restores_record(site, tmp_path):
    inst, venv, wheel, patches = site
    assert capture_edits(inst, venv, wheel, patches).exit_code == 0
    fresh_venv = tmp_path / "reinstalled"
    fresh = build(fresh_venv)
    pristine = snapshot(fresh)
    assert states(fresh_venv, "--patch-dir", str(patches))["mine"] == "pending"
    shown = run("diff", "--venv", str(fresh_venv), "--patch-dir", str(patches), "--only", "mine")
    assert shown.exit_code == 0 and "+VLLM_PORT = 8123\n" in shown.stdout and "_gptoss_patch" not in shown.stdout
    assert snapshot(fresh) == pristine
    result = run("apply", "--venv", str(fresh_venv), "--patch-dir", str(patches))
    assert result.exit_code == 0, result.stderr
    assert result.stderr.splitlines()[1] == f"Patched {ENVS_REL}, {MARLIN} (mine)"  # user patches first
    assert (fresh.site_packages / ENVS_REL).read_bytes() == (inst.site_packages / ENVS_REL).read_bytes()
    after = states(fresh_venv, "--patch-dir", str(patches))
    assert after["mine"] == "applied" and after["marlin_atomic_add_sm121"] == "applied"
    # idempotent: a second apply writes nothing
    again = run("apply", "--venv", str(fresh_venv), "--patch-dir", str(patches))
    assert again.exit_code == 0 and "Patched" not in again.stderr
    # the JSON names the user patch, its origin and all its files
    payload = json.loads(run("status", "--venv", str(fresh_venv), "--patch-dir", str(patches), "--json").stdout)
    mine = next(p for p in payload["patches"] if p["id"] == "mine")
    assert mine["origin"] == f"user: {patches / 'mine.diff'}" and mine["files"] == [ENVS_REL, MARLIN]
    assert run("audit", "--venv", str(fresh_venv)).exit_code == 0
    verified = run("verify", "--venv", str(fresh_venv), "--patch-dir", str(patches))
    assert verified.exit_code == 0, verified.stderr
    assert run("revert", "--venv", str(fresh_venv)).exit_code == 0
    assert snapshot(fresh) == pristine


def test_patch_dirs_from_the_environment_and_pyproject(site, tmp_path, monkeypatch):
    inst, venv, wheel, patches = site
    assert capture_edits(inst, venv, wheel, patches).exit_code == 0
    assert states(venv)  # without a patch directory the user patch is not listed
    assert "mine" not in states(venv)
    assert run("status", "--venv", str(venv), env={"GPTOSS_PATCH_DIRS": str(patches)}).exit_code in (0, 1)
    assert "mine" in json.loads(run("status", "--venv", str(venv), "--json", env={"GPTOSS_PATCH_DIRS": str(patches)}).stdout)["patches"][0]["id"]
    project = tmp_path / "project"
    (project / "sub").mkdir(parents=True)
    (project / "pyproject.toml").write_text('[tool.gptoss-patch]\npatch-dirs = ["../patches"]\n')
    monkeypatch.chdir(project / "sub")
    monkeypatch.delenv("GPTOSS_PATCH_DIRS", raising=False)
    assert states(venv)["mine"] == "applied"


def test_stale_patch_is_conflict_with_the_failing_hunk_and_apply_writes_nothing(site, tmp_path):
    inst, venv, wheel, patches = site
    (patches / "stale.diff").write_text(
        f"# vllm: >=0.17\n--- a/{ENVS_REL}\n+++ b/{ENVS_REL}\n@@ -4,1 +4,1 @@\n-VLLM_PORT = 9999\n+VLLM_PORT = 1\n"
    )
    result = run("status", "--venv", str(venv), "--patch-dir", str(patches), "--json")
    stale = json.loads(result.stdout)["patches"][0]
    assert result.exit_code == 1 and stale["state"] == "conflict"
    assert f"patch failed: {ENVS_REL}:4" in stale["reason"]
    before = snapshot(inst)
    result = run("apply", "--venv", str(venv), "--patch-dir", str(patches))
    assert result.exit_code == 5
    error, hint = result.stderr.splitlines()[:2]  # the file, what is in the way, and a fix (issue 22: not "stale is conflict")
    assert error.startswith(f"error: user patch stale ({patches / 'stale.diff'}): does not apply to vllm 0.17.1: patch failed")
    assert "capture" in hint and "--skip stale" in hint
    assert snapshot(inst) == before


def test_out_of_range_is_fine_unless_strict(site):
    inst, venv, wheel, patches = site
    assert capture_edits(inst, venv, wheel, patches, "--vllm-range", ">=0.17,<0.19").exit_code == 0
    text = (patches / "mine.diff").read_text().replace("# vllm: >=0.17,<0.19", "# vllm: ==0.16.0")
    (patches / "mine.diff").write_text(text)
    assert run("revert", "--venv", str(venv), "--only", "mine").exit_code == 0
    assert run("apply", "--venv", str(venv)).exit_code == 0
    assert states(venv, "--patch-dir", str(patches))["mine"] == "out-of-range"
    assert run("status", "--venv", str(venv), "--patch-dir", str(patches)).exit_code == 0
    assert run("status", "--venv", str(venv), "--patch-dir", str(patches), "--strict").exit_code == 1


def test_user_patch_on_the_lines_a_built_in_rewrites_is_a_conflict_naming_both(site):
    inst, venv, wheel, patches = site
    old = "    if not envs.VLLM_MARLIN_USE_ATOMIC_ADD:\n        return False\n"
    text = (inst.site_packages / MARLIN).read_text()
    assert old in text
    import difflib

    new = text.replace(old, "    if not envs.VLLM_MARLIN_USE_ATOMIC_ADD and n > 0:\n        return False\n")
    diff = "".join(difflib.unified_diff(text.splitlines(True), new.splitlines(True), f"a/{MARLIN}", f"b/{MARLIN}"))
    (patches / "clash.diff").write_text("# vllm: ==0.17.1\n" + diff)
    before = snapshot(inst)
    shown = json.loads(run("status", "--venv", str(venv), "--patch-dir", str(patches), "--json").stdout)["patches"][0]
    assert shown["state"] == "conflict"
    assert shown["reason"].startswith(f"changes the code built-in patch marlin_atomic_add_sm121 rewrites in {MARLIN}")
    result = run("apply", "--venv", str(venv), "--patch-dir", str(patches))
    assert result.exit_code == 5, result.stderr
    line = result.stderr.splitlines()[0]
    assert "clash" in line and "marlin_atomic_add_sm121" in line and line.endswith("nothing was written")
    assert snapshot(inst) == before


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ("--- a/setup.py\n+++ b/setup.py\n@@ -1 +1 @@\n-a\n+b\n", "touches 'a/setup.py', which is not a file of the vllm package"),
        ("--- /etc/passwd\n+++ /etc/passwd\n@@ -1 +1 @@\n-a\n+b\n", "touches '/etc/passwd'"),
        ("--- a/vllm/../x.py\n+++ b/vllm/../x.py\n@@ -1 +1 @@\n-a\n+b\n", "touches 'a/vllm/../x.py'"),
        ("--- a/vllm/envs.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-a\n", "user patches cannot delete vllm files"),
    ],
)
def test_bad_patch_files_are_refused_at_load_with_one_line(site, body, why):
    inst, venv, wheel, patches = site
    assert_refused_at_load(inst, venv, patches, body, why)


def test_not_utf8_missing_header_and_duplicate_names_are_usage_errors(site, tmp_path):
    inst, venv, wheel, patches = site
    (patches / "latin.diff").write_bytes(b"# vllm: ==0.17.1\n--- a/vllm/envs.py\n+++ b/vllm/envs.py\n@@ -1 +1 @@\n-a\n+\xe9\n")
    result = run("status", "--venv", str(venv), "--patch-dir", str(patches))
    assert result.exit_code == 2 and "is not UTF-8 text" in result.stderr
    (patches / "latin.diff").write_text(f"--- a/{ENVS_REL}\n+++ b/{ENVS_REL}\n@@ -1 +1 @@\n-a\n+b\n")
    result = run("status", "--venv", str(venv), "--patch-dir", str(patches))
    assert result.exit_code == 2 and "has no `# vllm: <versions>` header line" in result.stderr
    other = tmp_path / "other"
    other.mkdir()
    (patches / "latin.diff").write_text(f"# vllm: ==0.17.1\n--- a/{ENVS_REL}\n+++ b/{ENVS_REL}\n@@ -1 +1 @@\n-a\n+b\n")
    shutil.copy(patches / "latin.diff", other / "latin.diff")
    result = run("status", "--venv", str(venv), "--patch-dir", str(patches), "--patch-dir", str(other))
    assert result.exit_code == 2 and "two patch directories hold a patch named 'latin'" in result.stderr


def test_capture_refuses_files_outside_the_package_and_bad_names(site, tmp_path):
    inst, venv, wheel, patches = site
    outside = tmp_path / "elsewhere.py"
    outside.write_text("x = 1\n")
    result = run("capture", "mine", "--dir", str(patches), "--files", str(outside), "--venv", str(venv))
    assert result.exit_code == 2 and "is not a file of the vllm package" in result.stderr
    result = run("capture", "harmony_instructions", "--dir", str(patches), "--venv", str(venv))
    assert result.exit_code == 2 and "is the id of a built-in patch" in result.stderr
    edit(inst, ENVS_REL, "VLLM_PORT = None", "VLLM_PORT = 1")
    empty = {"GPTOSS_PATCH_WHEEL_CACHE": str(tmp_path / "no-wheels")}  # no original, no --from, no cached wheel
    result = run("capture", "mine", "--dir", str(patches), "--venv", str(venv), "--no-download", env=empty)
    assert result.exit_code == 2 and "pass --from with its wheel" in result.stderr
    assert not list(patches.iterdir())


def test_capture_creates_its_patch_directory_as_the_readme_shows(site, tmp_path):
    """`capture my-fix --dir ./vllm-patches` on a first capture: the directory is made (issue #36, item 1)."""
    inst, venv, wheel, patches = site
    fresh = tmp_path / "new" / "vllm-patches"
    result = capture_edits(inst, venv, wheel, fresh)
    assert result.exit_code == 0, result.stderr
    assert (fresh / "mine.diff").read_text().startswith("# gptoss-patch user patch: mine\n")
    assert states(venv, "--patch-dir", str(fresh))["mine"] == "applied"


def test_capture_refuses_a_bad_dir_before_it_downloads_anything(site, tmp_path):
    inst, venv, wheel, patches = site
    edit(inst, ENVS_REL, "VLLM_PORT = None", "VLLM_PORT = 1")  # needs the release's wheel, which is not cached
    not_a_dir = tmp_path / "a-file"
    not_a_dir.write_text("x\n")
    cache = tmp_path / "no-wheels"
    env = {"GPTOSS_PATCH_WHEEL_CACHE": str(cache), "PIP_NO_INDEX": "1"}  # a download would fail, not be slow
    for where in (not_a_dir, not_a_dir / "sub"):
        result = run("capture", "mine", "--dir", str(where), "--venv", str(venv), env=env)
        assert result.exit_code == 2, result.stderr
        assert len(result.stderr.splitlines()) == 1 and "not a directory" in result.stderr, result.stderr
    assert not_a_dir.read_text() == "x\n"
    assert not cache.exists() or not any(cache.rglob("*.whl"))


def test_capture_without_a_name_is_a_one_line_usage_error(site):
    inst, venv, wheel, patches = site
    edit(inst, ENVS_REL, "VLLM_PORT = None", "VLLM_PORT = 1")
    before = snapshot(inst)
    result = run("capture", "--dir", str(patches), "--from", str(wheel), "--venv", str(venv))
    assert result.exit_code == 2
    assert result.stderr.splitlines() == ["Error: Missing argument 'NAME'. Usage: gptoss-patch capture [OPTIONS] NAME"]
    assert snapshot(inst) == before and not list(patches.iterdir())


def test_audit_lists_changed_missing_and_added_files_with_hints(site):
    inst, venv, wheel, patches = site
    assert run("audit", "--venv", str(venv)).exit_code == 0
    assert run("apply", "--venv", str(venv)).exit_code == 0
    assert run("audit", "--venv", str(venv)).exit_code == 0  # patched files hold what gptoss-patch wrote
    edit(inst, ENVS_REL, "VLLM_PORT = None", "VLLM_PORT = 1")
    (inst.site_packages / fakesite.MXFP4_REL).unlink()
    (inst.site_packages / "vllm" / "extra.py").write_text("x = 1\n")
    result = run("audit", "--venv", str(venv), "--json")
    assert result.exit_code == 1
    findings = {f["path"]: f for f in json.loads(result.stdout)["findings"]}
    assert {p: f["kind"] for p, f in findings.items()} == {
        ENVS_REL: "changed", fakesite.MXFP4_REL: "missing", "vllm/extra.py": "added",
    }
    assert findings[ENVS_REL]["hint"].startswith(f"keep it as your own patch: gptoss-patch capture NAME --files {ENVS_REL}")


def test_audit_hint_for_an_added_file_removes_it_when_followed_literally(site):
    """A reinstall leaves a file RECORD does not list in place: the hint removes it (issue #36, item 5)."""
    inst, venv, wheel, patches = site
    (inst.site_packages / "vllm" / "my extra.py").write_text("x = 1\n")
    result = run("audit", "--venv", str(venv), "--json")
    assert result.exit_code == 1
    [finding] = json.loads(result.stdout)["findings"]
    assert finding["kind"] == "added" and "reinstall" not in finding["hint"]
    fix = finding["hint"].split("or remove it: ", 1)[1]
    subprocess.run(fix, shell=True, check=True)
    assert run("audit", "--venv", str(venv)).exit_code == 0


def test_hook_expects_user_patches_and_its_fix_line_names_the_patch_dir(site, tmp_path):
    inst, venv, wheel, patches = site
    assert capture_edits(inst, venv, wheel, patches).exit_code == 0
    assert run("apply", "--venv", str(venv), "--patch-dir", str(patches)).exit_code == 0
    result = run("hook", "install", "--venv", str(venv), "--patch-dir", str(patches))
    assert result.exit_code == 0, result.stderr
    state = json.loads((inst.site_packages / "gptoss_patch_hook.json").read_text())
    assert state["patch_dirs"] == [str(patches)] and "mine" in state["patches"]
    assert plugin.evaluate(inst.site_packages, state).problems == []
    # a reinstall: pristine files back, the ledger gone; the hook's expectation stays
    pristine = build(tmp_path / "pristine")
    for rel in (ENVS_REL, MARLIN):
        os.replace(pristine.site_packages / rel, inst.site_packages / rel)
    shutil.rmtree(inst.dist_info / "gptoss_patch")
    verdict = plugin.evaluate(inst.site_packages, state)
    assert "mine" in dict(verdict.problems)["missing"] and verdict.fixable
    fix = plugin.fix_command(verdict, state, inst.python)
    assert fix == f"gptoss-patch apply --python {inst.python} --patch-dir {patches}"
    # what mode apply runs: the fix line itself
    assert run("apply", "--python", inst.python, "--patch-dir", str(patches)).exit_code == 0
    assert plugin.evaluate(inst.site_packages, state).problems == []


# -- the real vLLM 0.17.1 (a --no-deps install of its wheel; pristine files from its cached source archive) --


@pytest.fixture
@needs("upstream")  # a --no-deps install of the real 0.17.1 wheel
def real(tmp_path: Path):
    from tests.support.upstream import fresh_install, site_packages, sources_path

    venv = tmp_path / "venv"
    fresh_install("0.17.1", venv)
    patches = tmp_path / "patches"
    patches.mkdir()
    return venv, site_packages(venv), sources_path("0.17.1"), patches


def test_real_release_hand_edits_survive_a_reinstall_through_the_patch_directory(real, tmp_path):
    """The issue's story on the real files: edits to envs.py (no codemod touches it) and to marlin_utils.py
    (a built-in patches it), captured, then a reinstall, then apply --patch-dir brings both back."""
    from tests.support.upstream import fresh_install, site_packages

    venv, site, archive, patches = real
    assert run("apply", "--venv", str(venv)).exit_code == 0
    replace_text(site / ENVS_REL, '"VLLM_HOST_IP": lambda: os.getenv("VLLM_HOST_IP", ""),',
                 '"VLLM_HOST_IP": lambda: os.getenv("VLLM_HOST_IP", "127.0.0.1"),')
    replace_text(site / MARLIN, "    # the performance of atomicAdd is better than global reduce\n",
                 "    # site-local: tuned for our GB10s\n    # the performance of atomicAdd is better than global reduce\n")
    assert states(venv)["marlin_atomic_add_sm121"] == "modified"  # a hand edit on a patched file, before capture
    audit = json.loads(run("audit", "--venv", str(venv), "--json").stdout)
    assert {f["path"] for f in audit["findings"]} == {ENVS_REL, MARLIN}
    result = run("capture", "site-local", "--dir", str(patches), "--from", str(archive), "--venv", str(venv),
                 "--vllm-range", ">=0.17,<0.19")
    assert result.exit_code == 0, result.stderr
    assert (patches / "site-local.diff").read_text().startswith("# gptoss-patch user patch: site-local\n# vllm: >=0.17,<0.19\n")
    edited = {rel: (site / rel).read_bytes() for rel in (ENVS_REL, MARLIN)}
    assert run("audit", "--venv", str(venv)).exit_code == 0
    assert states(venv, "--patch-dir", str(patches))["site-local"] == "applied"
    assert states(venv)["marlin_atomic_add_sm121"] == "applied"

    reinstalled = tmp_path / "reinstalled"  # pristine files, no ledger: what pip install --force-reinstall leaves
    fresh_install("0.17.1", reinstalled)
    result = run("apply", "--venv", str(reinstalled), "--patch-dir", str(patches))
    assert result.exit_code == 0, result.stderr
    new_site = site_packages(reinstalled)
    assert {rel: (new_site / rel).read_bytes() for rel in (ENVS_REL, MARLIN)} == edited
    assert run("status", "--venv", str(reinstalled), "--patch-dir", str(patches)).exit_code == 0
    assert run("audit", "--venv", str(reinstalled)).exit_code == 0
    assert run("revert", "--venv", str(reinstalled)).exit_code == 0
    assert run("audit", "--venv", str(reinstalled), "--json").exit_code == 0  # every file as RECORD says


def test_real_release_patch_for_another_range_is_out_of_range_and_a_stale_one_conflicts(real):
    import difflib

    venv, site, archive, patches = real
    text = (site / ENVS_REL).read_text()

    def diff_of(base: str) -> str:
        new = base.replace('os.getenv("VLLM_HOST_IP", "")', 'os.getenv("VLLM_HOST_IP", "10.0.0.1")', 1)
        return "".join(difflib.unified_diff(base.splitlines(True), new.splitlines(True), f"a/{ENVS_REL}", f"b/{ENVS_REL}"))

    (patches / "fits.diff").write_text("# vllm: ==0.17.1\n" + diff_of(text))
    (patches / "future.diff").write_text("# vllm: >=0.18\n" + diff_of(text))
    # written against another release, whose neighbouring line differs
    other = text.replace("# used in distributed environment to manually set the communication port", "# the port", 1)
    assert other != text
    (patches / "stale.diff").write_text("# vllm: ==0.17.1\n" + diff_of(other))
    assert states(venv, "--patch-dir", str(patches))["fits"] == "pending"
    (patches / "fits.diff").unlink()
    got = states(venv, "--patch-dir", str(patches))
    assert got["future"] == "out-of-range" and got["stale"] == "conflict"
    before = (site / ENVS_REL).read_bytes()
    assert run("apply", "--venv", str(venv), "--patch-dir", str(patches)).exit_code == 5
    assert (site / ENVS_REL).read_bytes() == before
    assert not any(site.glob("vllm-*.dist-info/gptoss_patch"))


# -- patch sets from other packages: the entry-point group gptoss_patch.patches ----------------------

def test_a_plugin_patch_set_is_listed_with_its_origin_applied_like_a_built_in_and_a_broken_one_is_one_line(site, tmp_path):
    inst, venv, wheel, patches = site
    env = plugin_env(tmp_path)
    listed = run_process("list", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    origins = {p["id"]: p["origin"] for p in json.loads(listed.stdout)}
    assert origins["example_envs_marker"] == "plugin gptoss-example-patches 0.1.0"
    assert origins["harmony_instructions"] == "built-in"
    problems = [ln for ln in listed.stderr.splitlines() if "broken_one" in ln]
    assert problems == [
        "warning: plugin gptoss-example-patches 0.1.0: patch 'broken_one' (gptoss_example_patches.no_such_module) "
        "cannot be imported: ModuleNotFoundError: No module named 'gptoss_example_patches.no_such_module'"
    ]
    status = run_process("status", "--venv", str(venv), "--json", env=env)
    assert states(status)["example_envs_marker"] == "pending"
    applied = run_process("apply", "--venv", str(venv), env=env)
    assert applied.returncode == 0, applied.stderr
    assert "GPTOSS_EXAMPLE_PATCHES = True" in (inst.site_packages / ENVS_REL).read_text()
    assert "Patched vllm/envs.py (example_envs_marker)" in applied.stderr
    assert run_process("revert", "--venv", str(venv), "--only", "example_envs_marker", env=env).returncode == 0
    assert (inst.site_packages / ENVS_REL).read_text() == ENVS


def test_a_patch_whose_plugin_was_removed_is_orphaned_and_its_printed_fix_reverts_it(site, tmp_path):
    """Applied from a plugin, then the plugin uninstalled: status says orphaned (exit 1) with the fix, audit counts
    it, and the fix, run as printed, restores the original bytes from the ledger (issue #36, item 2)."""
    inst, venv, wheel, patches = site
    assert run_process("apply", "--venv", str(venv), env=plugin_env(tmp_path)).returncode == 0  # this process has no plugin
    assert "GPTOSS_EXAMPLE_PATCHES = True" in (inst.site_packages / ENVS_REL).read_text()
    result = run("status", "--venv", str(venv), "--json")
    assert result.exit_code == 1
    orphan = {p["id"]: p for p in json.loads(result.stdout)["patches"]}["example_envs_marker"]
    assert orphan["state"] == "orphaned" and orphan["file"] == ENVS_REL
    audited = run("audit", "--venv", str(venv), "--json")
    assert audited.exit_code == 1
    assert [(f["path"], f["kind"]) for f in json.loads(audited.stdout)["findings"]] == [(ENVS_REL, "orphaned")]
    fix = shlex.split(orphan["reason"].split("`")[1])
    assert fix[:4] == ["gptoss-patch", "revert", "--only", "example_envs_marker"]
    reverted = run(*fix[1:])
    assert reverted.exit_code == 0, reverted.stderr
    assert "Reverted vllm/envs.py (example_envs_marker)" in reverted.stderr
    assert (inst.site_packages / ENVS_REL).read_text() == ENVS
    assert "example_envs_marker" not in states(venv)
    assert run("status", "--venv", str(venv)).exit_code == 0 and run("audit", "--venv", str(venv)).exit_code == 0


def test_a_plain_revert_takes_out_an_orphaned_patch_too(site, tmp_path):
    inst, venv, wheel, patches = site
    assert run_process("apply", "--venv", str(venv), env=plugin_env(tmp_path)).returncode == 0
    result = run("revert", "--venv", str(venv))
    assert result.exit_code == 0, result.stderr
    assert "Reverted vllm/envs.py (example_envs_marker)" in result.stderr
    assert (inst.site_packages / ENVS_REL).read_text() == ENVS
    assert "orphaned" not in states(venv).values()


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


@pytest.mark.parametrize("hooked", [False, True], ids=["no-hook-yet", "hook-installed-with-the-plugin"])
def test_hook_install_refuses_an_orphaned_patch_with_the_fix_and_writes_nothing(site, tmp_path, hooked):
    """A plugin's patch applied, then the plugin removed (#36, item 2): `hook install` could neither check nor
    re-apply that patch, so it refuses (exit 5), says whether a hook already there was kept, writes nothing, and
    prints the fix; the fix, run as printed, lets the next `hook install` through."""
    inst, venv, wheel, patches = site
    env = plugin_env(tmp_path)
    assert run_process("apply", "--venv", str(venv), env=env).returncode == 0
    if hooked:
        assert run_process("hook", "install", "--venv", str(venv), env=env).returncode == 0
    before = tree_bytes(inst.site_packages)
    result = run("hook", "install", "--venv", str(venv))  # this process has no plugin
    assert result.exit_code == 5, result.stderr
    error, hint = result.stderr.splitlines()
    kept = "the installed hook was left as it was" if hooked else "the hook was not installed"
    assert error == ("error: patch example_envs_marker is orphaned: gptoss-patch applied it, but no installed patch set "
                     f"provides it any more (a plugin removed?); {kept}: it could neither check nor re-apply that patch")
    python = str(venv / "bin" / "python")
    fix = f"gptoss-patch revert --only example_envs_marker --python {python}"
    assert hint == f"hint: take it out first: {fix} (the ledger has the original bytes), or reinstall the plugin that provides it"
    assert tree_bytes(inst.site_packages) == before
    reverted = run(*shlex.split(fix)[1:])
    assert reverted.exit_code == 0, reverted.stderr
    assert (inst.site_packages / ENVS_REL).read_text() == ENVS
    installed = run("hook", "install", "--venv", str(venv))
    assert installed.exit_code == 0, installed.stderr
    assert "example_envs_marker" not in run("hook", "status", "--venv", str(venv), "--json").stdout


def test_a_user_patch_added_after_the_built_ins_goes_under_them_as_on_a_fresh_install(site, tmp_path):
    """User patches come first: added later to a patched file (its context touching a codemod's lines), it is
    applied to the file before the codemods, which run again on top; the bytes equal a fresh install's."""
    inst, venv, wheel, patches = site
    import difflib

    text = (inst.site_packages / MARLIN).read_text()
    new = text.replace("    return torch.cuda", "    # local tweak\n    return torch.cuda", 1)
    diff = "".join(difflib.unified_diff(text.splitlines(True), new.splitlines(True), f"a/{MARLIN}", f"b/{MARLIN}"))
    (patches / "tweak.diff").write_text("# vllm: ==0.17.1\n" + diff)
    assert run("apply", "--venv", str(venv), "--skip", "harmony_instructions").exit_code == 0
    assert states(venv, "--patch-dir", str(patches))["tweak"] == "pending"
    result = run("apply", "--venv", str(venv), "--patch-dir", str(patches), "--skip", "harmony_instructions")
    assert result.exit_code == 0, result.stderr
    fresh = build(tmp_path / "fresh")
    assert run("apply", "--venv", str(tmp_path / "fresh"), "--patch-dir", str(patches), "--skip", "harmony_instructions").exit_code == 0
    assert (inst.site_packages / MARLIN).read_bytes() == (fresh.site_packages / MARLIN).read_bytes()
    assert "# local tweak" in (inst.site_packages / MARLIN).read_text()
    got = states(venv, "--patch-dir", str(patches))
    assert got["tweak"] == "applied" and got["marlin_atomic_add_sm121"] == "applied"
    assert run("revert", "--venv", str(venv), "--only", "tweak").exit_code == 0
    assert "# local tweak" not in (inst.site_packages / MARLIN).read_text()
    assert states(venv)["marlin_atomic_add_sm121"] == "applied"


def test_audit_cache_never_hides_an_edit_that_keeps_size_and_mtime(site):
    inst, venv, wheel, patches = site
    path = inst.site_packages / ENVS_REL
    assert run("audit", "--venv", str(venv)).exit_code == 0  # fills the hash cache
    stat = path.stat()
    data = path.read_bytes().replace(b"VLLM_PORT = None", b"VLLM_PORT = Nope")
    with path.open("r+b") as handle:  # in place: same inode, same size
        handle.write(data)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # and the old modification time
    assert path.stat().st_size == stat.st_size and path.stat().st_mtime_ns == stat.st_mtime_ns
    result = run("audit", "--venv", str(venv), "--json")
    assert result.exit_code == 1
    assert [f["path"] for f in json.loads(result.stdout)["findings"]] == [ENVS_REL]


def test_revert_of_one_user_patch_replays_the_others_on_the_same_file(site):
    inst, venv, wheel, patches = site
    import difflib

    path = inst.site_packages / MARLIN
    text = path.read_text()
    first = text.replace("import torch\n", "import torch  # first\n", 1)
    second = first.replace("!= torch.bfloat16\n", "!= torch.bfloat16  # second\n", 1)
    assert first != text and second != first
    for name, old, new in (("a-first", text, first), ("b-second", first, second)):
        diff = "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{MARLIN}", f"b/{MARLIN}"))
        (patches / f"{name}.diff").write_text("# vllm: ==0.17.1\n" + diff)
    assert run("apply", "--venv", str(venv), "--patch-dir", str(patches)).exit_code == 0
    assert "# first" in path.read_text() and "# second" in path.read_text()
    result = run("revert", "--venv", str(venv), "--only", "a-first", "--json")
    assert result.exit_code == 0, result.stderr
    assert states(result)["a-first"] == "pending"
    assert "# first" not in path.read_text() and "# second" in path.read_text()
    got = states(venv, "--patch-dir", str(patches))
    assert got["b-second"] == "applied" and got["marlin_atomic_add_sm121"] == "applied" and got["a-first"] == "pending"


# -- issue 36, item 14: a broken pyproject.toml in the working directory ------------------------------------


@pytest.mark.parametrize(
    ("text", "code", "stderr"),
    [
        ('[project]\nname = "x"\ndependencies = ["gptoss-patch"\n', 1,
         "warning: ignoring {p}: cannot read {p}: Unclosed array ...; it has no [tool.gptoss-patch] table"),
        ('[project\nname = "x"\n', 1, None),  # not ours at all: not even read as TOML
        ('[tool.gptoss-patch]\npatch-dirs = ["p"\n', 2,
         "error: cannot read {p}: Unclosed array ..., which has the [tool.gptoss-patch] table that "
         "names your patch directories"),
    ],
    ids=["names-us-elsewhere", "unrelated", "our-table"],
)
def test_a_broken_pyproject_matters_only_when_it_has_our_table(tmp_path, monkeypatch, text, code, stderr):
    build(tmp_path / "venv")
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "pyproject.toml").write_text(text)
    monkeypatch.chdir(tmp_path / "project")
    monkeypatch.delenv("GPTOSS_PATCH_DIRS", raising=False)
    result = run("status", "--venv", str(tmp_path / "venv"), "--json")
    assert result.exit_code == code, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith(("warning:", "error:"))]
    expected = [stderr.format(p=tmp_path / "project" / "pyproject.toml").split(" ...")] if stderr else []
    assert [[line[: len(head)], line[len(line) - len(tail) :]] for line in lines for head, tail in [expected[0]]] == expected
    if code == 1:
        assert json.loads(result.stdout)["patches"]  # the command went on
    else:
        assert "hint: fix the file, or pass --patch-dir DIR" in result.stderr
        assert run("status", "--venv", str(tmp_path / "venv"), "--patch-dir", str(tmp_path)).exit_code == 1  # the hint works


def test_capture_without_a_wheel_hints_a_download_that_runs_in_a_pipless_venv(site, tmp_path):
    """The fake venv has no pip (like one uv made): the hint is the download gptoss-patch's own pip runner would do,
    not `PYTHON -m pip download`, and running it fetches the wheel that `--from` then takes (issue #36, leftover)."""
    inst, venv, wheel, patches = site
    edit(inst, ENVS_REL, "VLLM_PORT = None", "VLLM_PORT = 1")
    empty = {"GPTOSS_PATCH_WHEEL_CACHE": str(tmp_path / "no-wheels")}
    result = run("capture", "mine", "--dir", str(patches), "--venv", str(venv), "--no-download", env=empty)
    assert result.exit_code == 2
    hint = next(line for line in result.stderr.splitlines() if line.startswith("hint: ")).removeprefix("hint: ")
    line, _, then = hint.partition(", then ")
    assert f"{inst.python} -m pip" not in line and then == "--from DIR/WHEEL"
    dest = tmp_path / "DIR"
    local = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheel.parent)}  # the release's wheel, offline
    proc = subprocess.run(shlex.split(line.replace(" DIR ", f" {dest} ")), capture_output=True, text=True, env=local, check=False)
    assert proc.returncode == 0, proc.stderr
    fetched = dest / wheel.name
    result = run("capture", "mine", "--dir", str(patches), "--venv", str(venv), "--from", str(fetched), env=empty)
    assert result.exit_code == 0, result.stderr
