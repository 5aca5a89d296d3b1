"""`venv create` end to end with the real vLLM 0.17.1 wheel (from the wheel cache, via --find-links).

gptoss-patch's own dependencies come from the package index through pip, as documented for this
command. Bad input must leave nothing behind.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gptoss_patch import provision as venv_create
from gptoss_patch.engine.record import read_hashes
from gptoss_patch.fsutil import sha256
from gptoss_patch.provision import installers
from tests.support import cli, harness
from tests.support.health import complaints, uv_binary
from tests.support.upstream import WHEELS, fresh_install, site_packages, wheel_path

pytestmark = pytest.mark.upstream
VERSION = "0.17.1"


def create(directory: Path, *args: str) -> cli.CliResult:
    return cli.run("venv", "create", str(directory), "--install-vllm", VERSION, *args)


def run(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    return subprocess.run([str(python), *args], capture_output=True, text=True, env=env, check=False)


def pristine(venv: Path) -> bool:
    """Every vllm file matches vLLM's RECORD (no patch left behind)."""
    site = site_packages(venv)
    record = read_hashes(next(site.glob("vllm-*.dist-info")) / "RECORD")
    return all(sha256((site / rel).read_bytes()) == digest for rel, digest in record.items() if rel.startswith("vllm/") and rel.endswith(".py"))


def dists(venv: Path) -> set[str]:
    return venv_create.installed_dists(venv / "bin" / "python")


@pytest.fixture(scope="module")
def created(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, object]]:
    wheel_path(VERSION)  # in the cache (downloaded once if missing)
    home = tmp_path_factory.mktemp("created")
    yield home / "venv", create(home / "venv", "--no-deps", "--find-links", str(WHEELS))
    shutil.rmtree(home, ignore_errors=True)  # a real install (1.2 GB): gone with the module, not at the run's end


def test_fresh_venv_has_vllm_gptoss_patch_patches_and_hook(created):
    directory, result = created
    assert result.exit_code == 0, result.stderr
    python = directory / "bin" / "python"
    states = cli.states(run(python, "-m", "gptoss_patch", "status", "--json"))  # gptoss-patch runs inside the new venv
    assert states["harmony_instructions"] == states["marlin_atomic_add_sm121"] == "applied"
    assert not any(s in ("pending", "drifted", "modified") for s in states.values())
    hook = json.loads(run(python, "-m", "gptoss_patch", "hook", "status", "--json").stdout)
    assert hook["ok"] and hook["mode"] == "fail" and hook["check"]["fingerprint"].startswith("0.17.1:")
    assert {"vllm", "gptoss-patch", "gptoss-patch-hook", "libcst"} <= dists(directory)
    labels = [line for line in result.stderr.splitlines() if line.startswith("==> ")]
    assert labels[:4] == [f"==> virtualenv {directory} (pip)", f"==> vllm=={VERSION}", "==> gptoss-patch 0.1.0", "==> apply the patches"]
    lines = result.stderr.splitlines()
    notice = next(i for i, line in enumerate(lines) if line.startswith("Uses "))  # the cached wheel, with its size
    assert f"{wheel_path(VERSION)} (" in lines[notice] and notice < lines.index(f"==> vllm=={VERSION}")
    # ... and installed from that file: given vllm==X and --find-links, pip took the index's copy first (433 MB again)
    direct = json.loads((next(site_packages(directory).glob("vllm-*.dist-info")) / "direct_url.json").read_text())
    assert direct["url"].startswith("file://") and direct["url"].endswith("/" + wheel_path(VERSION).name), direct
    assert "Ready: " in result.stderr


def test_the_new_venv_has_no_complaint_beyond_vllms_own_missing_dependencies(created, tmp_path):
    """`pip check`/`uv pip check`: only what vLLM installed --no-deps reports by itself (nothing about us)."""
    directory, _ = created
    uv = uv_binary(tmp_path)
    alone = complaints(fresh_install(VERSION, tmp_path / "alone"), uv)
    assert complaints(directory / "bin" / "python", uv) <= alone


def test_rerun_only_does_what_is_missing(created):
    directory, _ = created
    target = site_packages(directory) / "vllm/entrypoints/openai/chat_completion/serving.py"
    stamp = target.stat().st_mtime_ns
    again = create(directory, "--no-deps", "--find-links", str(WHEELS))
    assert again.exit_code == 0, again.stderr
    outcomes = [line.strip() for line in again.stderr.splitlines() if line.startswith("    ")]
    assert [o.split(":")[0] for o in outcomes if not o.startswith("done")] == ["already done"] * 5  # all but verify
    assert target.stat().st_mtime_ns == stamp


def test_changing_the_hook_mode_on_rerun_touches_only_the_hook(created):
    directory, _ = created
    try:
        result = create(directory, "--no-deps", "--mode", "warn")
        assert result.exit_code == 0, result.stderr
        assert "==> install the hook (mode warn)" in result.stderr
        assert json.loads(run(directory / "bin" / "python", "-m", "gptoss_patch", "hook", "status", "--json").stdout)["mode"] == "warn"
    finally:  # the venv is shared by the module's tests: leave it as the fixture made it (mode fail)
        assert create(directory, "--no-deps", "--mode", "fail").exit_code == 0


def test_a_wheel_rebuilt_from_an_installed_gptoss_patch_installs_the_same_files(created, tmp_path):
    """The source for a venv when gptoss-patch runs from a wheel install, not a checkout."""
    directory, _ = created
    python = directory / "bin" / "python"
    code = "import sys; from importlib import metadata; from pathlib import Path; from gptoss_patch import provision as venv; " \
           "print(venv.rebuild_wheel(metadata.distribution('gptoss-patch'), Path(sys.argv[1])))"
    wheel = Path(run(python, "-c", code, str(tmp_path)).stdout.strip())
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    pip = [sys.executable, "-m", "pip", "--python", str(bare / "bin" / "python"), "install", "-q", "--no-deps", str(wheel)]
    subprocess.run(pip, check=True, capture_output=True)
    ours = sorted(p.relative_to(site_packages(directory)).as_posix() for p in (site_packages(directory) / "gptoss_patch").rglob("*.py"))
    theirs = sorted(p.relative_to(site_packages(bare)).as_posix() for p in (site_packages(bare) / "gptoss_patch").rglob("*.py"))
    assert ours == theirs and len(ours) > 20
    entry = next(site_packages(bare).glob("gptoss_patch-*.dist-info")) / "entry_points.txt"
    assert "gptoss-patch = gptoss_patch.cli:main" in entry.read_text()


@pytest.mark.harness
def test_existing_cpu_venv_gets_a_hook_that_re_applies_with_its_own_gptoss_patch(tmp_path):
    """The CPU harness imports vLLM: after a revert, vLLM's own plugin loader re-applies in apply mode."""
    try:
        base = harness.cpu_venv(VERSION)
    except harness.HarnessError as exc:
        pytest.fail(str(exc), pytrace=False)
    python = harness.clone_venv(base, tmp_path / "venv")
    uv = uv_binary(tmp_path)
    before = complaints(python, uv)
    result = create(tmp_path / "venv", "--mode", "apply")
    assert result.exit_code == 0, result.stderr
    assert complaints(python, uv) <= before  # gptoss-patch and its dependencies constrain nothing vLLM needs
    assert f"already done: vllm {VERSION} is installed" in result.stderr
    assert run(python, "-m", "gptoss_patch", "revert").returncode == 0
    load = "import vllm.plugins; vllm.plugins.load_general_plugins()"
    started = run(python, "-c", load)
    assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:]
    assert "re-applying (mode apply)" in started.stdout and "gptoss-patch: fingerprint 0.17.1:" in started.stdout
    assert cli.states(run(python, "-m", "gptoss_patch", "status", "--json"))["harmony_instructions"] == "applied"


# -- bad input: one clear line, non-zero exit, nothing left behind ---------------------------------


def test_existing_directory_that_is_not_a_venv_is_left_alone(tmp_path):
    (tmp_path / "data.txt").write_text("keep me")
    result = create(tmp_path)
    assert result.exit_code == 4
    assert result.stderr.splitlines()[0] == f"error: {tmp_path} exists and is not a virtualenv (no pyvenv.cfg); nothing was changed"
    assert [p.name for p in tmp_path.iterdir()] == ["data.txt"]


def test_malformed_version_is_a_usage_error_before_anything_is_created(tmp_path):
    result = cli.run("venv", "create", str(tmp_path / "v"), "--install-vllm", "0.17.x")
    assert result.exit_code == 2 and result.stderr.startswith("error: invalid version '0.17.x'")
    assert not (tmp_path / "v").exists()


def test_uv_asked_for_but_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(installers.shutil, "which", lambda name: None)
    result = create(tmp_path / "v", "--uv")
    assert result.exit_code == 4 and result.stderr.startswith("error: --uv was given, but uv is not on PATH; nothing was changed")
    assert not (tmp_path / "v").exists()


def test_version_not_on_the_index_removes_the_new_venv(tmp_path):
    result = cli.run("venv", "create", str(tmp_path / "v"), "--install-vllm", "0.0.999")
    assert result.exit_code == 4, result.stderr
    assert "error: vllm==0.0.999 is not available from the package index; nothing was left installed" in result.stderr
    assert not (tmp_path / "v").exists()


def test_no_network_removes_the_new_venv(tmp_path, monkeypatch):
    for name in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_INDEX_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # no mirror from pip.conf either
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens there
    monkeypatch.setenv("PIP_RETRIES", "1")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    result = create(tmp_path / "v")
    assert result.exit_code == 4, result.stderr
    assert f"error: cannot reach a package index that has vllm=={VERSION} (no network?); nothing was left installed" in result.stderr
    assert not (tmp_path / "v").exists()


def test_failure_after_apply_in_an_existing_venv_undoes_only_this_run(tmp_path):
    """An existing venv (vLLM already there, no pip of its own): the hook cannot be written, so
    the patches are reverted and gptoss-patch and its dependencies uninstalled again."""
    python = fresh_install(VERSION, tmp_path / "venv")
    venv = python.parent.parent
    before = dists(venv)
    (site_packages(venv) / "gptoss_patch_hook.json").mkdir()  # in the way of the hook's expectation file
    result = create(venv)
    assert result.exit_code == 7, result.stderr
    assert "cannot write" in result.stderr.splitlines()[-2]
    assert dists(venv) == before and pristine(venv)
    assert not any(site_packages(venv).glob("vllm-*.dist-info/gptoss_patch"))
    assert sorted(p.name for p in site_packages(venv).glob("gptoss_patch_hook*")) == ["gptoss_patch_hook.json"]  # not ours to remove


def test_bad_user_patch_is_a_usage_error_before_anything_is_created(tmp_path):
    patches = tmp_path / "patches"
    patches.mkdir()
    (patches / "bad.diff").write_text("# vllm: ==0.17.1\n--- a/setup.py\n+++ b/setup.py\n@@ -1 +1 @@\n-a\n+b\n")
    result = create(tmp_path / "v", "--patch-dir", str(patches))
    assert result.exit_code == 2 and "which is not a file of the vllm package" in result.stderr.splitlines()[0]
    assert not (tmp_path / "v").exists()


def test_user_patches_are_applied_verified_and_expected_in_the_new_venv(tmp_path):
    """venv create --patch-dir: the user patch goes in with the built-ins, and the hook expects it."""
    wheel_path(VERSION)
    patches = tmp_path / "patches"
    patches.mkdir()
    import difflib

    from tests.support.upstream import read_from_wheel

    text = read_from_wheel(VERSION, "vllm/envs.py").decode()
    new = text.replace('os.getenv("VLLM_HOST_IP", "")', 'os.getenv("VLLM_HOST_IP", "127.0.0.1")', 1)
    diff = "".join(difflib.unified_diff(text.splitlines(True), new.splitlines(True), "a/vllm/envs.py", "b/vllm/envs.py"))
    (patches / "host-ip.diff").write_text("# vllm: >=0.17,<0.18\n" + diff)
    directory = tmp_path / "venv"
    result = create(directory, "--no-deps", "--find-links", str(WHEELS), "--patch-dir", str(patches))
    assert result.exit_code == 0, result.stderr
    python = directory / "bin" / "python"
    assert '"VLLM_HOST_IP", "127.0.0.1"' in (site_packages(directory) / "vllm" / "envs.py").read_text()
    states = cli.states(run(python, "-m", "gptoss_patch", "status", "--json", "--patch-dir", str(patches)))
    assert states["host-ip"] == "applied"
    hook = json.loads(run(python, "-m", "gptoss_patch", "hook", "status", "--json").stdout)
    assert hook["ok"] and "host-ip" in hook["expected_patches"]
