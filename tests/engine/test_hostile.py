"""Hostile and odd inputs on the real vllm 0.17.1 install: each a clear message, a documented exit code
(see errors.ExitCode), nothing lost.

Read-only and full filesystems are real where the kernel lets us: a read-only bind mount and a small
tmpfs, inside a private mount namespace (`unshare -m`, we run as root), so nothing leaks to the host;
those tests skip, naming the reason, where mount namespaces are unavailable. The same failures are
also injected at the write itself through the faults hook (tests/support/crash_runner.py raises EROFS or
ENOSPC at `before-rename`), which always runs. A summary line reports how many inputs were tried.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gptoss_patch.engine.record import read_hashes
from gptoss_patch.fsutil import sha256
from tests.support.cli import states
from tests.support.safety import (
    VERSION,
    Reference,
    assert_patched,
    assert_pristine,
    changed,
    command_line,
    contents,
    describe,
    dist_info,
    gptoss,
    ledger_dir,
    listing,
    print_line,
)
from tests.support.upstream import fresh_install, replace_file, site_packages, wheel_path

pytestmark = pytest.mark.upstream
OTHER_VERSION = "0.16.0"  # cached by the golden tests; inside every 0.17.1 patch's range


@dataclass
class Tally:
    tried: list[str] = field(default_factory=list)
    handled: int = 0


@pytest.fixture(scope="module")
def tally(request: pytest.FixtureRequest) -> Iterator[Tally]:
    counts = Tally()
    yield counts
    print_line(
        request,
        f"hostile inputs: {len(counts.tried)} tried, {counts.handled} handled (clear message, documented exit code, "
        f"nothing lost), {len(counts.tried) - counts.handled} not",
    )


@pytest.fixture
def hostile(request: pytest.FixtureRequest, tally: Tally) -> Iterator[None]:
    """Counts this test as one hostile input; `handled` only if it passed (the call phase raised nothing)."""
    name = request.node.name.removeprefix("test_")
    tally.tried.append(name)
    failed_before = request.session.testsfailed
    yield
    if request.session.testsfailed == failed_before:
        tally.handled += 1


@pytest.fixture(scope="module")
def ref(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    return Reference.build(tmp_path_factory.mktemp("hostile") / "applied")


def apply_ok(venv: Path, ref: Reference) -> None:
    done = gptoss(venv, "apply")
    assert done.returncode == 0, describe(done)
    assert_patched(venv, ref)


def error_of(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, describe(proc)
    return lines[0]


# -- the ledger, edited by hand ---------------------------------------------------------------------


def edit_ledger(venv: Path, change) -> dict:
    path = ledger_dir(venv) / "ledger.json"
    raw = json.loads(path.read_text())
    change(raw)
    replace_file(path, json.dumps(raw).encode())
    return raw


@pytest.mark.parametrize(
    "bad_path",
    [
        pytest.param("vllm/../../../../evil.py", id="dotdot"),
        pytest.param("/etc/passwd", id="absolute"),
        pytest.param("torch/__init__.py", id="another-package"),
    ],
)
def test_ledger_pointing_outside_the_package_is_refused(venv, ref, bad_path, hostile):
    apply_ok(venv, ref)
    first = ref.targets[0]
    edit_ledger(venv, lambda raw: raw["files"].update({bad_path: raw["files"].pop(first)}))
    ledger_bytes = (ledger_dir(venv) / "ledger.json").read_bytes()
    for command in ("status", "apply", "revert"):
        refused = gptoss(venv, command)
        assert refused.returncode == 5, describe(refused)
        assert f"path {bad_path!r} points outside the vllm package; nothing was written" in error_of(refused)
    assert contents(venv, ref) == "patched" and (ledger_dir(venv) / "ledger.json").read_bytes() == ledger_bytes


def test_ledger_entry_through_a_symlink_leaving_the_package_is_refused(venv, ref, tmp_path, hostile):
    """A path that looks inside (vllm/...) but resolves outside through a planted link."""
    apply_ok(venv, ref)
    outside = tmp_path / "outside.py"
    outside.write_bytes(b"# not vllm's\n")
    (site_packages(venv) / "vllm" / "planted.py").symlink_to(outside)
    first = ref.targets[0]
    edit_ledger(venv, lambda raw: raw["files"].update({"vllm/planted.py": raw["files"].pop(first)}))
    refused = gptoss(venv, "revert", "--force")
    assert refused.returncode == 5 and "'vllm/planted.py' points outside the vllm package" in error_of(refused)
    assert outside.read_bytes() == b"# not vllm's\n" and contents(venv, ref) == "patched"


def test_ledger_with_a_wrong_patched_hash_is_modified_and_revert_needs_force(venv, ref, hostile):
    apply_ok(venv, ref)
    first = ref.targets[0]
    edit_ledger(venv, lambda raw: raw["files"][first].update(patched="0" * 64))
    look = gptoss(venv, "status", "--json")
    assert look.returncode == 1 and "modified" in states(look).values()
    refused = gptoss(venv, "revert")
    assert refused.returncode == 5 and f"{first} changed after gptoss-patch wrote it" in error_of(refused)
    assert contents(venv, ref) == "patched"
    forced = gptoss(venv, "revert", "--force")
    assert forced.returncode == 0, describe(forced)
    assert_pristine(venv, ref)  # the stored originals were intact: nothing lost


def test_ledger_with_a_wrong_original_hash_is_refused(venv, ref, hostile):
    apply_ok(venv, ref)
    first = ref.targets[0]
    edit_ledger(venv, lambda raw: raw["files"][first].update(original="1" * 64))
    refused = gptoss(venv, "revert")
    assert refused.returncode == 5, describe(refused)
    assert f"object {'1' * 12} is missing; nothing was written" in error_of(refused)
    assert contents(venv, ref) == "patched"


def test_ledger_with_malformed_hashes_is_refused(venv, ref, hostile):
    apply_ok(venv, ref)
    edit_ledger(venv, lambda raw: raw["files"][ref.targets[0]].update(original="zz" + "0" * 62))
    for command in ("status", "revert"):
        refused = gptoss(venv, command)
        assert refused.returncode == 5 and f"bad hash for {ref.targets[0]}; nothing was written" in error_of(refused)
    assert contents(venv, ref) == "patched"


def test_tampered_stored_original_is_refused(venv, ref, hostile):
    apply_ok(venv, ref)
    raw = json.loads((ledger_dir(venv) / "ledger.json").read_text())
    digest = raw["files"][ref.targets[0]]["original"]
    replace_file(ledger_dir(venv) / "objects" / digest, b"print('owned')\n")
    refused = gptoss(venv, "revert")
    assert refused.returncode == 5 and f"object {digest[:12]} does not match its hash" in error_of(refused)
    assert contents(venv, ref) == "patched"


def test_ledger_for_a_foreign_version_is_refused(venv, ref, hostile):
    apply_ok(venv, ref)
    edit_ledger(venv, lambda raw: raw.update(vllm_version=OTHER_VERSION))
    for command in ("status", "apply", "revert"):
        refused = gptoss(venv, command)
        assert refused.returncode == 5, describe(refused)
        assert f"it describes vllm {OTHER_VERSION}, but {VERSION} is installed" in error_of(refused)
    assert contents(venv, ref) == "patched"


def test_unreadable_ledger_is_refused(venv, ref, hostile):
    apply_ok(venv, ref)
    replace_file(ledger_dir(venv) / "ledger.json", b'{"format": 1, "files": {')
    refused = gptoss(venv, "status")
    assert refused.returncode == 5 and "cannot be trusted: unreadable (Expecting property name" in error_of(refused)
    assert "hint: inspect it; if it is not needed, reinstall vllm" in refused.stderr
    assert contents(venv, ref) == "patched"


@pytest.mark.parametrize("bad_row", ["outside", "setuid-mode", "missing-key"])
def test_hand_made_journal_is_refused(venv, ref, tmp_path, bad_row, hostile):
    """A planted journal would make the next command "finish" its writes: every row is checked."""
    apply_ok(venv, ref)
    victim = tmp_path / "victim.py"
    victim.write_bytes(b"keep me\n")
    raw = json.loads((ledger_dir(venv) / "ledger.json").read_text())
    first = ref.targets[0]
    row = {"path": first, "before": sha256(ref.patched[first]), "after": raw["files"][first]["original"], "mode": 0o644}
    if bad_row == "outside":
        row.update(path=f"vllm/../../../../../../../..{victim}", before=sha256(b"keep me\n"))
    elif bad_row == "setuid-mode":
        row.update(mode=0o104755)
    else:
        del row["after"]
    journal = {"op": "apply", "pid": 1, "writes": [row], "ledger": raw}
    (ledger_dir(venv) / "journal.json").write_text(json.dumps(journal))
    refused = gptoss(venv, "status")
    assert refused.returncode == 5, describe(refused)
    why = {"outside": "points outside the vllm package", "setuid-mode": f"bad journal row for {first}", "missing-key": "bad journal"}
    assert f"{why[bad_row]}; nothing was written" in error_of(refused)
    assert victim.read_bytes() == b"keep me\n" and contents(venv, ref) == "patched"
    assert stat.S_IMODE((site_packages(venv) / first).stat().st_mode) == 0o644


def test_symlink_planted_in_the_ledger_directory_is_refused(venv, ref, tmp_path, hostile):
    """Our files are replaced by rename; a link there must not redirect a write out of the ledger."""
    apply_ok(venv, ref)
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me\n")
    objects = ledger_dir(venv) / "objects"
    planted = objects / ("f" * 64)
    planted.symlink_to(victim)
    refused = gptoss(venv, "revert")
    assert refused.returncode == 5 and f"{planted.name} is a symbolic link; nothing was written" in error_of(refused)
    assert victim.read_bytes() == b"keep me\n" and contents(venv, ref) == "patched"


def test_ledger_directory_replaced_by_a_symlink_is_never_followed(venv, ref, tmp_path, hostile):
    """The next command tidies a ledger directory without ledger.json: it removes the link, not the
    directory the link points to."""
    elsewhere = tmp_path / "precious"
    elsewhere.mkdir()
    (elsewhere / "data.txt").write_text("keep me\n")
    (elsewhere / "x.gptoss-tmp").write_text("not ours either\n")
    ledger_dir(venv).symlink_to(elsewhere)
    look = gptoss(venv, "status", "--json")
    assert look.returncode == 1 and states(look) == ref.pending, describe(look)
    assert sorted(p.name for p in elsewhere.iterdir()) == ["data.txt", "x.gptoss-tmp"]
    assert not ledger_dir(venv).is_symlink()
    apply_ok(venv, ref)


# -- links --------------------------------------------------------------------------------------------


def test_target_symlinked_inside_the_package_is_patched_through_the_link(venv, ref, hostile):
    """Decision: a link inside the vllm package is followed; the link stays a link, its file is patched."""
    site = site_packages(venv)
    target = site / ref.targets[-1]
    real = target.with_name("real_" + target.name)
    shutil.copy2(target, real)  # a new inode: the base venv's file is not touched
    target.unlink()
    target.symlink_to(real.name)
    done = gptoss(venv, "apply")
    assert done.returncode == 0, describe(done)
    assert target.is_symlink() and os.readlink(target) == real.name
    assert real.read_bytes() == ref.patched[ref.targets[-1]]
    assert contents(venv, ref) == "patched"
    back = gptoss(venv, "revert")
    assert back.returncode == 0, describe(back)
    assert target.is_symlink() and real.read_bytes() == ref.original[ref.targets[-1]]


def test_target_symlinked_outside_the_package_is_refused(venv, ref, tmp_path, hostile):
    """Decision: a link leaving the package (a shared store, another environment) is never written through."""
    site = site_packages(venv)
    target = site / ref.targets[-1]
    outside = tmp_path / "shared" / target.name
    outside.parent.mkdir()
    shutil.copy2(target, outside)
    target.unlink()
    target.symlink_to(outside)
    look = gptoss(venv, "status", "--json")
    assert look.returncode == 1 and states(look) == ref.pending  # reading through the link is fine
    refused = gptoss(venv, "apply")
    assert refused.returncode == 4, describe(refused)
    assert error_of(refused) == (
        f"error: {ref.targets[-1]} is a symbolic link to {outside}, outside the vllm package; nothing was written"
    )
    assert outside.read_bytes() == ref.original[ref.targets[-1]] and target.is_symlink()
    assert all((site / rel).read_bytes() == ref.original[rel] for rel in ref.targets) and not ledger_dir(venv).exists()


def test_site_packages_reached_through_a_symlink(venv, ref, tmp_path, hostile):
    lib = site_packages(venv)
    real = tmp_path / "elsewhere" / "site-packages"
    real.parent.mkdir()
    lib.rename(real)
    lib.symlink_to(real)
    look = gptoss(venv, "status", "--json")
    assert look.returncode == 1 and json.loads(look.stdout)["vllm"]["location"] == str(lib)
    apply_ok(venv, ref)
    assert lib.is_symlink()
    back = gptoss(venv, "revert")
    assert back.returncode == 0, describe(back)
    assert_pristine(venv, ref)


def test_hardlinked_install_keeps_the_shared_file_intact(venv, ref, hostile):
    """uv installs by hardlink from its cache (so do our test clones): we replace, never write in place."""
    from tests.support.upstream import nodeps_venv

    base = site_packages(nodeps_venv(VERSION))
    site = site_packages(venv)
    assert all(os.stat(site / rel).st_ino == os.stat(base / rel).st_ino for rel in ref.targets)
    apply_ok(venv, ref)
    for rel in ref.targets:
        assert (base / rel).read_bytes() == ref.original[rel]
        assert os.stat(site / rel).st_ino != os.stat(base / rel).st_ino


# -- read-only and full filesystems --------------------------------------------------------------------


def test_read_only_file_is_patched_and_keeps_its_mode(venv, ref, hostile):
    """As root, mode 0444 does not stop a rename; the file's mode survives apply and revert."""
    site = site_packages(venv)
    target = site / ref.targets[-1]
    replace_file(target, target.read_bytes())  # own inode before chmod (the base venv shares the old one)
    target.chmod(0o444)
    apply_ok(venv, ref)
    assert stat.S_IMODE(target.stat().st_mode) == 0o444
    assert gptoss(venv, "revert").returncode == 0
    assert stat.S_IMODE(target.stat().st_mode) == 0o444 and target.read_bytes() == ref.original[ref.targets[-1]]


@pytest.mark.parametrize(
    "action, reason", [pytest.param("erofs", "read-only filesystem", id="erofs"), pytest.param("enospc", "no space left", id="enospc")]
)
def test_write_refused_by_the_filesystem_is_rolled_back_injected(venv, ref, action, reason, hostile):
    """Simulated: the runner raises EROFS/ENOSPC at the rename of the last target file (after the
    others were replaced); apply puts them back and says so. The real mounts are tested below."""
    last = Path(ref.targets[-1]).name
    refused = gptoss(venv, "apply", at=(f"before-rename@/{last}:1:{action}",))
    assert refused.returncode == 7, describe(refused)
    assert error_of(refused) == f"error: cannot write {site_packages(venv) / ref.targets[-1]}: {reason}; nothing was changed"
    assert_pristine(venv, ref)
    assert gptoss(venv, "status").returncode == 1


def test_write_refused_while_storing_originals_leaves_nothing_injected(venv, ref, hostile):
    """Simulated: the disk fills up while the originals are stored, before any vllm file is touched."""
    refused = gptoss(venv, "apply", at=("before-rename@/objects/:2:enospc",))
    assert refused.returncode == 7 and "no space left; nothing was changed" in error_of(refused)
    assert_pristine(venv, ref)


DRIVER = r"""
import hashlib, json, os, subprocess, sys
spec = json.loads(sys.argv[1])
def sh(*cmd):
    subprocess.run(cmd, check=True, capture_output=True)
for step in spec["setup"]:
    if step["kind"] == "ro":
        sh("mount", "--bind", step["dir"], step["dir"])
        sh("mount", "-o", "remount,bind,ro", step["dir"])
    else:  # a tmpfs over dir, holding a copy of it, with no room left
        sh("mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", step["dir"])
        sh("cp", "-a", step["stage"] + "/.", step["dir"])
        st = os.statvfs(step["dir"])
        used = (st.f_blocks - st.f_bfree) * st.f_frsize
        sh("mount", "-o", f"remount,size={used + step['headroom']}", step["dir"])
out = {"runs": [], "hashes": {}, "listing": {}}
for cmd in spec["commands"]:
    p = subprocess.run(cmd, capture_output=True, text=True)
    out["runs"].append({"rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr})
for path in spec["hash"]:
    out["hashes"][path] = hashlib.sha256(open(path, "rb").read()).hexdigest() if os.path.exists(path) else None
for d in spec["list"]:
    out["listing"][d] = sorted(os.listdir(d))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def mount_namespace(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Fail (never skip) unless we can mount in a private mount namespace (root, unshare -m)."""
    probe = tmp_path_factory.mktemp("mnt")
    if shutil.which("unshare") is None:
        pytest.fail("unshare(1) is missing: install util-linux (apt-get install util-linux) to test real read-only and full filesystems", pytrace=False)
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe)],
        capture_output=True, text=True, check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"cannot mount in a private mount namespace ({done.stderr.strip()}): these tests need root and unshare -m", pytrace=False)


def in_namespace(setup: list[dict], commands: list[list[str]], hash_paths: list[Path], list_dirs: list[Path]) -> dict:
    """`commands` (gptoss-patch command lines: safety.command_line) run in a private mount namespace after `setup`."""
    argvs = [[sys.executable, *command] for command in commands]
    spec = {"setup": setup, "commands": argvs, "hash": [str(p) for p in hash_paths], "list": [str(d) for d in list_dirs]}
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", sys.executable, "-c", DRIVER, json.dumps(spec)],
        capture_output=True, text=True, check=False, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_read_only_directory_real_mount(venv, ref, mount_namespace, hostile):
    """Real: the last target's directory is a read-only bind mount; the other files were already
    replaced when its write fails, and are put back. Exit 7, nothing changed."""
    site = site_packages(venv)
    folder = (site / ref.targets[-1]).parent
    assert all((site / rel).parent != folder for rel in ref.targets[:-1])
    commands = [command_line(venv, "apply"), command_line(venv, "status", "--json")]
    got = in_namespace([{"kind": "ro", "dir": str(folder)}], commands, [], [])
    refused, look = got["runs"]
    assert refused["rc"] == 7, refused
    assert f"error: cannot write {site / ref.targets[-1]}: read-only filesystem; nothing was changed" in refused["stderr"]
    assert look["rc"] == 1 and {p["id"]: p["state"] for p in json.loads(look["stdout"])["patches"]} == ref.pending
    assert_pristine(venv, ref)  # a bind mount: the same files, seen from outside the namespace


def test_read_only_site_packages_real_mount(venv, ref, mount_namespace, hostile):
    """Real: all of site-packages is mounted read-only (a read-only image): refused before any write."""
    site = site_packages(venv)
    commands = [command_line(venv, "apply"), command_line(venv, "status")]
    got = in_namespace([{"kind": "ro", "dir": str(site)}], commands, [], [])
    refused, look = got["runs"]
    assert refused["rc"] == 7 and "read-only filesystem; nothing was changed" in refused["stderr"], refused
    assert look["rc"] == 1 and "error" not in look["stderr"]
    assert_pristine(venv, ref)


def test_full_disk_under_a_target_real_tmpfs(venv, ref, tmp_path, mount_namespace, hostile):
    """Real: the last target's directory is a tmpfs with no free page: its write gets ENOSPC after the
    other files were replaced; they are put back. Checked inside the namespace (the tmpfs dies with it)."""
    site = site_packages(venv)
    folder = (site / ref.targets[-1]).parent
    stage = tmp_path / "stage"
    shutil.copytree(folder, stage, symlinks=True)
    targets = [site / rel for rel in ref.targets]
    got = in_namespace(
        [{"kind": "tmpfs", "dir": str(folder), "stage": str(stage), "headroom": 0}],
        [command_line(venv, "apply"), command_line(venv, "status", "--json")],
        [*targets, dist_info(venv) / "RECORD"],
        [folder],
    )
    refused, look = got["runs"]
    assert refused["rc"] == 7, refused
    assert f"error: cannot write {targets[-1]}: no space left; nothing was changed" in refused["stderr"]
    assert look["rc"] == 1 and {p["id"]: p["state"] for p in json.loads(look["stdout"])["patches"]} == ref.pending
    assert got["hashes"] == {
        **{str(site / rel): sha256(ref.original[rel]) for rel in ref.targets},
        str(dist_info(venv) / "RECORD"): sha256(ref.record),
    }
    assert got["listing"][str(folder)] == sorted(os.listdir(stage))  # no temporary file left in the full directory
    assert_pristine(venv, ref)


def test_full_disk_under_the_ledger_real_tmpfs(venv, ref, tmp_path, mount_namespace, hostile):
    """Real: vLLM's .dist-info (where the ledger goes) is a full tmpfs: refused before any vllm file."""
    info = dist_info(venv)
    stage = tmp_path / "stage"
    shutil.copytree(info, stage)
    got = in_namespace(
        [{"kind": "tmpfs", "dir": str(info), "stage": str(stage), "headroom": 0}],
        [command_line(venv, "apply"), command_line(venv, "status")],
        [info / "RECORD"],
        [info],
    )
    refused, look = got["runs"]
    assert refused["rc"] == 7 and "no space left; nothing was changed" in refused["stderr"], refused
    assert look["rc"] == 1 and "warning" not in look["stderr"]
    assert got["hashes"] == {str(info / "RECORD"): sha256(ref.record)}
    assert got["listing"][str(info)] == sorted(os.listdir(stage))  # no ledger directory, no stray file
    assert_pristine(venv, ref)


# -- odd bytes in a target ---------------------------------------------------------------------------


def rewrite_targets(venv: Path, ref: Reference, change) -> dict[str, bytes]:
    site = site_packages(venv)
    odd = {rel: change(ref.original[rel]) for rel in ref.targets}
    for rel, data in odd.items():
        replace_file(site / rel, data)
    return odd


def tabs(data: bytes) -> bytes:
    """Indentation by tabs: every leading group of four spaces becomes one tab."""
    out = []
    for line in data.splitlines(keepends=True):
        stripped = line.lstrip(b" ")
        depth = len(line) - len(stripped)
        out.append(b"\t" * (depth // 4) + b" " * (depth % 4) + stripped)
    return b"".join(out)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda d: d.replace(b"\n", b"\r\n"), id="crlf"),
        pytest.param(lambda d: b"\xef\xbb\xbf" + d, id="bom"),
        pytest.param(tabs, id="tabs"),
    ],
)
def test_odd_but_valid_target_bytes_survive_apply_and_revert(venv, ref, change, hostile):
    odd = rewrite_targets(venv, ref, change)
    site = site_packages(venv)
    done = gptoss(venv, "apply", "--json")
    assert done.returncode == 0, describe(done)
    assert states(gptoss(venv, "status", "--json")) == ref.applied
    for rel, data in odd.items():
        patched = (site / rel).read_bytes()
        assert patched != data
        if b"\r\n" in data:
            assert patched.count(b"\n") == patched.count(b"\r\n"), f"{rel}: mixed line endings after apply"
        assert patched.startswith(b"\xef\xbb\xbf") == data.startswith(b"\xef\xbb\xbf")
    checked = gptoss(venv, "verify")
    assert checked.returncode == 0, describe(checked)  # compiles with the target interpreter
    back = gptoss(venv, "revert")
    assert back.returncode == 0, describe(back)
    assert {rel: (site / rel).read_bytes() for rel in odd} == odd


def test_non_utf8_target_is_refused_and_nothing_is_written(venv, ref, hostile):
    site = site_packages(venv)
    last = ref.targets[-1]
    replace_file(site / last, ref.original[last] + b"# caf\xe9 (latin-1)\n")
    look = gptoss(venv, "status", "--json")
    assert look.returncode == 1
    drifted = [p for p in json.loads(look.stdout)["patches"] if p["state"] == "drifted"]
    assert drifted and all(p["file"] == last and "not valid UTF-8" in p["reason"] for p in drifted)
    refused = gptoss(venv, "apply")
    assert refused.returncode == 3 and "not valid UTF-8" in error_of(refused) and "nothing was written" in error_of(refused)
    assert all((site / rel).read_bytes() == ref.original[rel] for rel in ref.targets[:-1])
    assert not ledger_dir(venv).exists()


def test_hand_edit_after_apply_is_modified_and_revert_needs_force(venv, ref, hostile):
    apply_ok(venv, ref)
    site = site_packages(venv)
    last = ref.targets[-1]
    edited = ref.patched[last] + b"\n# local hand edit\n"
    replace_file(site / last, edited)
    look = gptoss(venv, "status", "--json")
    assert look.returncode == 1 and "modified" in states(look).values()
    again = gptoss(venv, "apply")
    assert again.returncode == 5 and "is modified: changed after gptoss-patch wrote it" in error_of(again)
    refused = gptoss(venv, "revert")
    assert refused.returncode == 5 and f"{last} changed after gptoss-patch wrote it" in error_of(refused)
    assert "hint: revert --force restores the original anyway" in refused.stderr
    assert (site / last).read_bytes() == edited  # the edit is kept until --force says otherwise
    forced = gptoss(venv, "revert", "--force")
    assert forced.returncode == 0, describe(forced)
    assert_pristine(venv, ref)


# -- other installations -----------------------------------------------------------------------------


def test_vllm_upgraded_in_place_between_apply_and_revert(venv, ref, hostile):
    """pip replaces the patched 0.17.1 by 0.16.0: the ledger (listed in RECORD) goes with the old
    files, so status sees a fresh 0.16.0 and revert has nothing to restore; both exit cleanly."""
    apply_ok(venv, ref)
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", "--no-deps", "--no-compile"]
    subprocess.run([*pip, str(wheel_path(OTHER_VERSION))], check=True, capture_output=True)
    site = site_packages(venv)
    assert not (site / f"vllm-{VERSION}.dist-info").exists()
    new_info = site / f"vllm-{OTHER_VERSION}.dist-info"
    assert not (new_info / "gptoss_patch").exists()

    look = gptoss(venv, "status", "--json")
    assert look.returncode == 1 and json.loads(look.stdout)["vllm"]["version"] == OTHER_VERSION, describe(look)
    assert "applied" not in states(look).values() and "modified" not in states(look).values()
    back = gptoss(venv, "revert", "--json")
    assert back.returncode == 0 and not changed(back), describe(back)
    assert "nothing to revert" in back.stdout
    hashes = read_hashes(new_info / "RECORD")
    assert all(sha256((site / rel).read_bytes()) == hashes[rel] for rel in ref.targets if rel in hashes)
    # and the new version is patched and reverted normally
    assert gptoss(venv, "apply").returncode == 0
    assert gptoss(venv, "revert").returncode == 0
    assert all(sha256((site / rel).read_bytes()) == hashes[rel] for rel in ref.targets if rel in hashes)
    assert not (new_info / "gptoss_patch").exists()


@pytest.fixture
def other_install(tmp_path: Path) -> Path:
    """A second, complete vllm (0.16.0) in a directory of its own, to put on sys.path."""
    fresh_install(OTHER_VERSION, tmp_path / "other")
    return site_packages(tmp_path / "other")


def pristine_in(site: Path, version: str) -> bool:
    hashes = read_hashes(site / f"vllm-{version}.dist-info" / "RECORD")
    return all(sha256((site / rel).read_bytes()) == h for rel, h in hashes.items() if rel.endswith(".py"))


def test_second_vllm_later_on_sys_path_is_named_as_shadowed(venv, ref, other_install, hostile):
    site = site_packages(venv)
    pth = site / "zz-second-vllm.pth"
    pth.write_text(f"{other_install}\n")
    look = gptoss(venv, "status", "--json")
    assert json.loads(look.stdout)["vllm"]["location"] == str(site)
    assert f"Detected vllm {VERSION} at {site}" in look.stderr
    assert f"warning: another vllm is installed later on sys.path and is shadowed: {OTHER_VERSION} at {other_install}" in look.stderr
    done = gptoss(venv, "apply")
    assert done.returncode == 0 and contents(venv, ref) == "patched", describe(done)
    assert pristine_in(other_install, OTHER_VERSION)  # the shadowed one is never touched
    assert gptoss(venv, "revert").returncode == 0
    pth.unlink()
    assert_pristine(venv, ref)


def test_second_vllm_first_on_sys_path_is_the_one_patched(venv, ref, other_install, hostile):
    """PYTHONPATH puts 0.16.0 first: that is what `import vllm` loads, so that is what gets patched."""
    env = {"PYTHONPATH": str(other_install)}
    site = site_packages(venv)
    look = gptoss(venv, "status", "--json", env=env)
    expected = {"version": OTHER_VERSION, "distribution": "vllm", "location": str(other_install), "python": str(venv / "bin" / "python")}
    assert json.loads(look.stdout)["vllm"] == expected
    assert f"warning: another vllm is installed later on sys.path and is shadowed: {VERSION} at {site}" in look.stderr
    done = gptoss(venv, "apply", "--json", env=env)
    assert done.returncode == 0 and changed(done), describe(done)
    assert not pristine_in(other_install, OTHER_VERSION)
    assert contents(venv, ref) == "original" and listing(venv) == ref.listing  # the shadowed 0.17.1 untouched
    assert gptoss(venv, "revert", env=env).returncode == 0
    assert pristine_in(other_install, OTHER_VERSION)
