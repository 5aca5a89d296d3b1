"""The hook in real vLLM 0.17.1 processes: vLLM's own plugin loader, every mode, every kind of tree.

One CPU-harness clone and one long-lived driver process per module (tests/support/hook_driver.py: importing
vllm costs seconds, so every case is a request to the same process); each test first puts the tree
into the state it needs. The last tests need no vLLM import and use the cheap --no-deps install.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gptoss_patch import target
from tests.support import fakesite, harness
from tests.support.cli import run, states
from tests.support.markers import needs
from tests.support.upstream import fresh_install, replace_file, site_packages, wheel_path

VERSION = "0.17.1"
SERVING = "vllm/entrypoints/openai/chat_completion/serving.py"
MARLIN = "vllm/model_executor/layers/quantization/utils/marlin_utils.py"
DRIVER = Path(__file__).parents[1] / "support" / "hook_driver.py"
MARK = "@@ "


class Driver:
    """The long-lived vLLM process: one JSON request in, one answer out."""

    def __init__(self, python: Path, log: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "GPTOSS_PATCH_", "VIRTUAL_ENV"))}
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # bytecode of the hook is written, so uninstall must remove it
        # Its own mount namespace, so a test can make site-packages read-only for this process only.
        argv = ["unshare", "--mount", "--propagation", "private", str(python), str(DRIVER)]
        self.log, self.stderr = log, log.open("w")
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True, env=env)
        assert self._answer().get("ready")

    def _answer(self) -> dict:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            if line.startswith(MARK):
                return json.loads(line[len(MARK) :])
        tail = self.log.read_text()[-1500:]
        pytest.fail(f"the vLLM driver process died (exit {self.proc.wait()}): {tail}", pytrace=False)

    def ask(self, **request) -> dict:
        self.proc.stdin.write(json.dumps(request) + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        return self._answer()

    def load(self, mode: str | None = None, **request) -> dict:
        env = dict(request.pop("env", {}))
        if mode:
            env["GPTOSS_PATCH_HOOK_MODE"] = mode
        return self.ask(op="load", env=env, **request)

    def close(self) -> None:
        self.proc.stdin.close()  # type: ignore[union-attr]
        self.proc.wait(timeout=60)
        self.proc.stdout.close()  # type: ignore[union-attr]
        self.stderr.close()


@pytest.fixture(scope="module")
@needs("upstream", "harness")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    try:
        base = harness.cpu_venv(VERSION)
    except harness.HarnessError as exc:
        pytest.fail(str(exc), pytrace=False)
    home = tmp_path_factory.mktemp("hook")
    python = harness.clone_venv(base, home / "venv")
    yield python.parent.parent
    # The reinstalls made vLLM's files this clone's own (1.1 GB): gone with the module, not at the run's end.
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def ids(venv: Path) -> list[str]:
    """The patches vLLM 0.17.1 needs (derived, like the patch set itself: new patches join by themselves)."""
    pristine(venv)
    found = sorted(i for i, state in states(venv, by_python=True).items() if state == "pending")
    assert {"harmony_instructions", "marlin_atomic_add_sm121"} <= set(found)
    return found


@pytest.fixture(scope="module")
def driver(venv: Path, tmp_path_factory: pytest.TempPathFactory):
    proc = Driver(venv / "bin" / "python", tmp_path_factory.mktemp("driver") / "stderr.log")
    yield proc
    proc.close()


def pristine(venv: Path) -> None:
    assert run("revert", "--force", venv=venv, by_python=True).exit_code == 0


def patched(venv: Path, mode: str = "fail") -> None:
    pristine(venv)
    assert run("apply", venv=venv, by_python=True).exit_code == 0
    result = run("hook", "install", "--mode", mode, venv=venv, by_python=True)
    assert result.exit_code == 0, result.stderr


def hook_state(venv: Path) -> dict:
    return json.loads((site_packages(venv) / "gptoss_patch_hook.json").read_text())


def set_hook_state(venv: Path, **changes) -> None:
    path = site_packages(venv) / "gptoss_patch_hook.json"
    replace_file(path, json.dumps({**hook_state(venv), **changes}).encode())


def lines(answer: dict, level: str) -> list[str]:
    return [message for lvl, message in answer["logs"] if lvl == level]


def only_line(answer: dict, level: str) -> str:
    found = lines(answer, level)
    assert len(found) == 1, answer["logs"]
    return found[0]


def fingerprint_of(answer: dict) -> str:
    logged = [line for line in lines(answer, "INFO") if line.startswith("gptoss-patch: fingerprint ")]
    assert len(logged) == 1, answer["logs"]  # once per process
    return logged[0].split()[2]


def tree(venv: Path) -> set[tuple[str, int]]:
    root = str(venv)
    return {
        (os.path.relpath(os.path.join(d, f), root), os.lstat(os.path.join(d, f)).st_size)
        for d, _, files in os.walk(root) for f in files
    }


# -- the hook inside vLLM processes --------------------------------------------------------------


def test_uninstall_leaves_no_trace_and_vllm_loads_without_it(venv, driver, ids):
    run("hook", "uninstall", venv=venv, by_python=True)
    pristine(venv)  # the module's venv is shared: other tests may have left it patched
    warm = driver.load()  # vLLM's own first-load bytecode is written before the snapshot
    assert warm["outcome"] == "ok" and warm["logs"] == []
    before = tree(venv)

    installed = run("hook", "install", "--mode", "warn", venv=venv, by_python=True)
    assert installed.exit_code == 1  # installed; patches pending
    loaded = driver.load()
    assert loaded["outcome"] == "ok" and f"lacks patches {', '.join(ids)}; continuing (mode warn)" in only_line(loaded, "WARNING")
    assert fingerprint_of(loaded).startswith("0.17.1:none:")
    assert any(p.name.startswith("gptoss_patch_hook.") for p in (site_packages(venv) / "__pycache__").iterdir())
    removed = run("hook", "uninstall", venv=venv, by_python=True)

    assert removed.exit_code == 0 and "Removed" in removed.stderr
    assert tree(venv) == before
    assert driver.load()["logs"] == []


def test_patched_tree_starts_in_every_mode_and_logs_one_fingerprint(venv, driver, ids):
    patched(venv)
    expected = json.loads(run("hook", "status", "--json", venv=venv, by_python=True).stdout)["check"]["fingerprint"]
    for mode in ("fail", "warn", "apply"):
        answer = driver.load(mode)
        assert answer["outcome"] == "ok", answer
        assert fingerprint_of(answer) == expected == answer["env"]["GPTOSS_PATCH_FINGERPRINT"]
        assert expected.startswith(f"0.17.1:{'+'.join(ids)}:")
    # Without gptoss-patch or libcst in the vLLM environment (the plugin is self-contained).
    assert not answer["gptoss_patch_importable"] and not answer["libcst_imported"]
    # Ray copies only VLLM_* and the names listed here: process0 adds ours.
    assert answer["env"]["VLLM_RAY_EXTRA_ENV_VARS_TO_COPY"] == "GPTOSS_PATCH_FINGERPRINT,GPTOSS_PATCH_FINGERPRINT_ORIGIN"

    child = driver.ask(op="child")  # a spawned process, as vLLM starts engine cores and workers
    assert child["outcome"] == "ok" and child["exitcode"] == 0 and child["pid"] != child["parent_pid"]
    assert fingerprint_of(child) == expected == child["env"]["GPTOSS_PATCH_FINGERPRINT"]
    assert child["env"]["GPTOSS_PATCH_FINGERPRINT_ORIGIN"].endswith(f"pid {child['parent_pid']}")


def test_worker_whose_fingerprint_differs_from_the_api_server_refuses(venv, driver):
    patched(venv)
    other = {"GPTOSS_PATCH_FINGERPRINT": "0.17.1:none:000000000000", "GPTOSS_PATCH_FINGERPRINT_ORIGIN": "head-node pid 7"}
    refused = driver.load("fail", env=other)
    assert refused["outcome"] == "raised" and refused["type"] == "Refused"  # vLLM reports it as a failed worker
    line = only_line(refused, "ERROR")
    assert "but the API server (head-node pid 7) runs 0.17.1:none:000000000000" in line
    assert line.startswith("gptoss-patch: refusing to start: this process (")
    assert driver.load("apply", env=other)["outcome"] == "raised"
    warned = driver.load("warn", env=other)
    assert warned["outcome"] == "ok" and "continuing (mode warn)" in only_line(warned, "WARNING")


def test_hand_modified_tree(venv, driver):
    patched(venv)
    target = site_packages(venv) / MARLIN
    edited = target.read_bytes() + b"\n# hand edit\n"
    replace_file(target, edited)

    failed = driver.load("fail")
    assert failed["outcome"] == "exit" and failed["code"] == 1
    line = only_line(failed, "ERROR")
    assert line.startswith(f"gptoss-patch: refusing to start: {MARLIN} changed after gptoss-patch wrote it (patches marlin_atomic_add_sm121); fix: ")
    assert "pip install " in line and "reinstall --no-deps vllm==0.17.1" in line  # pip's or uv's, whichever the venv has
    assert driver.load("apply")["outcome"] == "exit"  # apply cannot repair an edit: it refuses, writes nothing
    assert target.read_bytes() == edited
    warned = driver.load("warn")
    assert warned["outcome"] == "ok" and f"{MARLIN} changed after gptoss-patch wrote it" in only_line(warned, "WARNING")
    pristine(venv)


def test_force_reinstalled_tree(venv, driver, ids):
    patched(venv)
    good = json.loads(run("hook", "status", "--json", venv=venv, by_python=True).stdout)["check"]["fingerprint"]
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", "--no-deps"]
    subprocess.run([*pip, "--force-reinstall", "--no-compile", str(wheel_path(VERSION))], check=True, capture_output=True)
    assert sorted(i for i, state in states(venv, by_python=True).items() if state == "pending") == ids
    assert sorted(hook_state(venv)["patches"]) == ids  # the expectation survived the reinstall

    failed = driver.load("fail")
    assert failed["outcome"] == "exit" and failed["code"] == 1
    python = venv / "bin" / "python"
    assert only_line(failed, "ERROR") == (
        f"gptoss-patch: refusing to start: vllm 0.17.1 lacks patches {', '.join(ids)}; fix: gptoss-patch apply --python {python}"
    )
    warned = driver.load("warn")
    assert warned["outcome"] == "ok" and f"lacks patches {', '.join(ids)}; continuing (mode warn)" in only_line(warned, "WARNING")

    # apply, but the serving module is already imported in this process: re-applied on disk, then stop.
    late = driver.load("apply", imported=[SERVING.removesuffix(".py").replace("/", ".")])
    assert late["outcome"] == "exit"
    assert "this process had already imported vllm.entrypoints.openai.chat_completion.serving; fix: start vLLM again" in only_line(late, "ERROR")
    assert states(venv, by_python=True)["harmony_instructions"] == "applied"

    pristine(venv)  # back to what the reinstall left
    healed = driver.load("apply")
    assert healed["outcome"] == "ok", healed["logs"]
    assert any(f"re-applied {SERVING}" in line for line in lines(healed, "INFO"))
    assert fingerprint_of(healed) == good  # the same bytes as the first apply
    assert states(venv, by_python=True)["marlin_atomic_add_sm121"] == "applied"


def test_apply_mode_on_read_only_site_packages_refuses_and_writes_nothing(venv, driver, ids):
    patched(venv, "apply")
    pristine(venv)
    site = str(site_packages(venv))
    assert driver.ask(op="shell", argv=["mount", "--bind", "-o", "ro", site, site])["returncode"] == 0
    try:
        answer = driver.load()
    finally:
        assert driver.ask(op="shell", argv=["umount", site])["returncode"] == 0
    assert answer["outcome"] == "exit"
    line = only_line(answer, "ERROR")
    assert f"lacks patches {', '.join(ids)}; mode apply cannot re-apply: " in line and " is not writable (read-only or permissions); " in line
    assert states(venv, by_python=True)["harmony_instructions"] == "pending"


def test_apply_mode_with_no_gptoss_patch_anywhere_says_so(venv, driver):
    patched(venv, "apply")
    pristine(venv)
    set_hook_state(venv, tool="/nonexistent/bin/python")
    answer = driver.load()
    assert answer["outcome"] == "exit"
    assert "gptoss-patch is not importable here and the interpreter that installed the hook (/nonexistent/bin/python) is gone" in only_line(answer, "ERROR")
    assert states(venv, by_python=True)["harmony_instructions"] == "pending"


@pytest.mark.parametrize(
    ("ledger", "why"),
    [(b"{not json", "unreadable"), (None, "it describes another vllm or has bad entries")],
    ids=["corrupted", "foreign"],
)
def test_untrusted_ledger_refuses_in_fail_and_apply_mode(venv, driver, ledger, why):
    patched(venv)
    path = next(site_packages(venv).glob("vllm-*.dist-info")) / "gptoss_patch" / "ledger.json"
    original = path.read_bytes()
    foreign = json.dumps({**json.loads(original), "vllm_version": "0.16.0"}).encode()
    replace_file(path, ledger or foreign)
    try:
        for mode in ("fail", "apply"):
            answer = driver.load(mode)
            assert answer["outcome"] == "exit"
            assert f"ledger at {path} cannot be trusted ({why})" in only_line(answer, "ERROR")
    finally:
        replace_file(path, original)


def test_vllm_version_change_apply_mode_applies_and_re_records(venv, driver):
    patched(venv, "apply")
    pristine(venv)
    set_hook_state(venv, vllm="0.16.0")
    failed = driver.load("fail")
    python = venv / "bin" / "python"
    assert only_line(failed, "ERROR").endswith(
        f"vllm 0.17.1 is installed but the hook was set up for vllm 0.16.0; fix: gptoss-patch apply --python {python} "
        f"&& gptoss-patch hook install --python {python}"
    )
    healed = driver.load()  # the installed mode: apply
    assert healed["outcome"] == "ok", healed["logs"]
    assert hook_state(venv)["vllm"] == "0.17.1" and hook_state(venv)["mode"] == "apply"


CPU_VLLM = """\
import sys
import vllm.platforms
from vllm.platforms.cpu import CpuPlatform
CpuPlatform.import_kernels = classmethod(lambda cls: None)
vllm.platforms._current_platform = CpuPlatform()
import vllm.entrypoints.cli.main
sys.exit(vllm.entrypoints.cli.main.main())
"""


def test_vllm_cli_refuses_then_re_applies_and_re_executes(venv, ids, tmp_path):
    """`vllm serve --help` (CPU platform forced: docs/development.md, "The CPU harness") imports marlin_utils before plugins load."""
    script = tmp_path / "vllm"  # the name of vLLM's console script: the one program the hook re-executes
    script.write_text(CPU_VLLM)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "GPTOSS_PATCH_", "VIRTUAL_ENV"))}
    patched(venv)
    pristine(venv)
    argv = [str(venv / "bin" / "python"), str(script), "serve", "--help"]

    refused = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    assert refused.returncode == 1 and "usage:" not in refused.stdout
    refusal = [ln for ln in refused.stdout.splitlines() if "refusing to start" in ln][0]
    assert refusal.endswith(f"lacks patches {', '.join(ids)}; fix: gptoss-patch apply --python {argv[0]}")

    assert run("hook", "install", "--mode", "apply", venv=venv, by_python=True).exit_code == 1  # installed; the patches still pending
    healed = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    assert healed.returncode == 0, healed.stdout[-2000:]
    assert "was imported before the re-apply; re-executing" in healed.stdout
    assert healed.stdout.count(f"gptoss-patch: fingerprint 0.17.1:{'+'.join(ids)}:") == 1
    assert "usage:" in healed.stdout
    assert states(venv, by_python=True)["marlin_atomic_add_sm121"] == "applied"
    pristine(venv)


# -- the command line: bad input, nothing half-installed (no vLLM import needed) ------------------


@pytest.fixture
@needs("upstream")
def nodeps(tmp_path: Path) -> Path:
    fresh_install(VERSION, tmp_path / "venv")
    return tmp_path / "venv"


def hook_files(venv: Path) -> list[str]:
    site = site_packages(venv)
    return sorted(p.name for p in [*site.glob("gptoss_patch_hook*"), *site.glob("__pycache__/gptoss_patch_hook*")])


def test_install_status_uninstall_round_trip(nodeps):
    assert run("hook", "status", venv=nodeps, by_python=True).exit_code == 1
    pending = sorted(i for i, state in states(nodeps, by_python=True).items() if state == "pending")
    installed = run("hook", "install", venv=nodeps, by_python=True)
    assert installed.exit_code == 1  # installed, but the patches are still pending
    assert f"fix: gptoss-patch apply --python {nodeps / 'bin' / 'python'}" in installed.stderr
    compiled = f"gptoss_patch_hook.{sys.implementation.cache_tag}.pyc"  # precompiled: processes never compile it
    assert hook_files(nodeps) == sorted(["gptoss_patch_hook-0.1.0.dist-info", compiled, "gptoss_patch_hook.json", "gptoss_patch_hook.py"])
    assert run("apply", venv=nodeps, by_python=True).exit_code == 0
    report = json.loads(run("hook", "status", "--json", venv=nodeps, by_python=True).stdout)
    assert report["ok"] and report["mode"] == "fail" and report["expected_patches"] == pending
    assert run("hook", "uninstall", venv=nodeps, by_python=True).exit_code == 0
    assert hook_files(nodeps) == []
    again = run("hook", "uninstall", venv=nodeps, by_python=True)
    assert again.exit_code == 0 and "(it was not)" in again.stderr


def test_the_hook_is_a_complete_distribution_for_pip(nodeps):
    run("apply", venv=nodeps, by_python=True)
    assert run("hook", "install", venv=nodeps, by_python=True).exit_code == 0
    info = next(site_packages(nodeps).glob("gptoss_patch_hook-*.dist-info"))
    wheel = dict(line.split(": ", 1) for line in (info / "WHEEL").read_text().splitlines())
    pip = [sys.executable, "-m", "pip", "--python", str(nodeps / "bin" / "python")]
    shown = subprocess.run([*pip, "show", "-f", "gptoss-patch-hook"], capture_output=True, text=True, check=False)

    assert {p.name for p in info.iterdir()} >= {"METADATA", "RECORD", "WHEEL", "INSTALLER", "entry_points.txt"}
    assert wheel["Wheel-Version"] == "1.0" and wheel["Root-Is-Purelib"] == "true"
    assert shown.returncode == 0 and "gptoss_patch_hook-0.1.0.dist-info/WHEEL" in shown.stdout


def test_pip_uninstall_of_the_hook_distribution_removes_it_too(nodeps):
    run("apply", venv=nodeps, by_python=True)
    assert run("hook", "install", venv=nodeps, by_python=True).exit_code == 0
    pip = [sys.executable, "-m", "pip", "--python", str(nodeps / "bin" / "python")]
    subprocess.run([*pip, "uninstall", "-y", "gptoss-patch-hook"], check=True, capture_output=True)
    assert hook_files(nodeps) == []


def test_install_with_skip_expects_only_the_rest_and_keeps_it_on_refresh(nodeps):
    run("apply", "--skip", "harmony_instructions", venv=nodeps, by_python=True)
    assert run("hook", "install", "--skip", "harmony_instructions", "--mode", "warn", venv=nodeps, by_python=True).exit_code == 0
    assert run("hook", "install", venv=nodeps, by_python=True).exit_code == 0  # a refresh keeps the selection and the mode
    report = json.loads(run("hook", "status", "--json", venv=nodeps, by_python=True).stdout)
    assert "harmony_instructions" not in report["expected_patches"] and "marlin_atomic_add_sm121" in report["expected_patches"]
    assert report["mode"] == "warn" and report["ok"]


def test_install_invalid_mode_is_a_usage_error(nodeps):
    result = run("hook", "install", "--mode", "sometimes", venv=nodeps, by_python=True)
    assert result.exit_code == 2 and result.stderr.startswith("error: --mode sometimes: expected one of fail, apply, warn")
    assert hook_files(nodeps) == []


def test_invalid_mode_is_a_usage_error_before_any_target_lookup(tmp_path):
    result = run("hook", "install", "--mode", "bogus", "--python", str(tmp_path / "no-such-python"))
    assert result.exit_code == 2 and result.stderr.startswith("error: --mode bogus: expected one of fail, apply, warn")


def test_install_over_an_untrusted_ledger_creates_nothing(nodeps):
    run("apply", venv=nodeps, by_python=True)
    ledger = next(site_packages(nodeps).glob("vllm-*.dist-info")) / "gptoss_patch" / "ledger.json"
    replace_file(ledger, b'{"format": 1, "vllm_version": "0.16.0", "files": {}}')
    result = run("hook", "install", venv=nodeps, by_python=True)
    assert result.exit_code == 5 and "cannot be trusted: it describes vllm 0.16.0" in result.stderr
    assert hook_files(nodeps) == []


def run_fix(line: str):
    """Run a `gptoss-patch ...` command line the tool recommended, in this process."""
    words = shlex.split(line)
    assert words[0] == "gptoss-patch", line
    return run(*words[1:])


def fix_lines(stderr: str) -> list[str]:
    """The commands under revert's "fix, one of:" (each followed by what it does, in parentheses)."""
    after = stderr.split("fix, one of:\n", 1)[1].splitlines()
    return [line.strip().rsplit("   (", 1)[0] for line in after if line.startswith("  gptoss-patch ")]


def test_hook_status_on_an_untrusted_ledger_recommends_a_fix_that_works(nodeps):
    python = nodeps / "bin" / "python"
    assert run("apply", venv=nodeps, by_python=True).exit_code == 0
    assert run("hook", "install", venv=nodeps, by_python=True).exit_code == 0
    ledger = next(site_packages(nodeps).glob("vllm-*.dist-info")) / "gptoss_patch" / "ledger.json"
    replace_file(ledger, b"{not json")
    assert run("revert", "--force", venv=nodeps, by_python=True).exit_code == 5  # what it recommended before: refused, every time

    status = run("hook", "status", venv=nodeps, by_python=True)
    fix = next(line for line in status.stderr.splitlines() if line.startswith("fix: "))[len("fix: "):]
    assert status.exit_code == 1 and "revert --force" not in fix
    reinstall, _, then = fix.partition(", then ")
    assert reinstall == target.pip_command(str(python), "install", "--force-reinstall", "--no-deps", f"vllm=={VERSION}")
    # the same reinstall, from the cached wheel (no index here), with the test's pip
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--force-reinstall", "--no-compile"]
    subprocess.run([*pip, str(wheel_path(VERSION))], check=True, capture_output=True)
    applied = run_fix(then)
    assert applied.exit_code == 0, applied.stderr
    assert run("hook", "status", venv=nodeps, by_python=True).exit_code == 0


def test_revert_warns_when_a_fail_hook_will_refuse_and_each_fix_it_offers_works(nodeps):
    assert run("apply", venv=nodeps, by_python=True).exit_code == 0
    assert run("hook", "install", venv=nodeps, by_python=True).exit_code == 0
    partial = run("revert", "--only", "harmony_instructions", venv=nodeps, by_python=True)
    assert partial.exit_code == 0, partial.stderr
    assert (f"warning: the gptoss-patch hook in {site_packages(nodeps)} (mode fail) expects harmony_instructions: "
            "it now refuses every vLLM start") in partial.stderr
    apply_again, narrower, uninstall = fix_lines(partial.stderr)
    assert apply_again.startswith("gptoss-patch apply --python ") and uninstall.startswith("gptoss-patch hook uninstall --python ")
    assert narrower.endswith(" --skip harmony_instructions")
    installed = run_fix(narrower)  # expect only what is still applied
    assert installed.exit_code == 0, installed.stderr
    assert run("hook", "status", venv=nodeps, by_python=True).exit_code == 0

    everything = run("revert", venv=nodeps, by_python=True)
    assert everything.exit_code == 0 and "it now refuses every vLLM start" in everything.stderr
    apply_again, uninstall = fix_lines(everything.stderr)  # nothing left to expect: no narrower install
    assert apply_again.endswith(" --skip harmony_instructions")  # the hook's recorded selection
    assert run_fix(apply_again).exit_code == 0 and run("hook", "status", venv=nodeps, by_python=True).exit_code == 0

    again = run("revert", venv=nodeps, by_python=True)
    assert "refuses every vLLM start" in again.stderr
    assert run_fix(fix_lines(again.stderr)[-1]).exit_code == 0  # hook uninstall
    assert run("apply", venv=nodeps, by_python=True).exit_code == 0
    quiet = run("revert", venv=nodeps, by_python=True)  # no hook: nothing to warn about
    assert quiet.exit_code == 0 and "hook" not in quiet.stderr


def test_revert_says_nothing_about_a_warn_hook_and_warns_that_an_apply_hook_re_applies(nodeps):
    assert run("apply", venv=nodeps, by_python=True).exit_code == 0
    assert run("hook", "install", "--mode", "warn", venv=nodeps, by_python=True).exit_code == 0
    assert "hook" not in run("revert", venv=nodeps, by_python=True).stderr
    assert run("apply", venv=nodeps, by_python=True).exit_code == 0
    assert run("hook", "install", "--mode", "apply", venv=nodeps, by_python=True).exit_code == 0
    reverted = run("revert", "--only", "harmony_instructions", venv=nodeps, by_python=True)
    assert "(mode apply) expects harmony_instructions: it will re-apply them at the next vLLM start" in reverted.stderr


def test_install_refuses_a_drifted_patch_and_creates_nothing(nodeps):
    target = site_packages(nodeps) / SERVING
    replace_file(target, target.read_bytes().replace(b"        messages.append(sys_msg)\n", b""))
    result = run("hook", "install", venv=nodeps, by_python=True)
    # A hand edit that makes a patch drift: refused as a file that is not what vLLM installed (with the way to keep
    # the edit), not as a drift to --skip.
    assert result.exit_code == 3 and f"{SERVING} is not the file vllm 0.17.1 installed" in result.stderr
    assert "the hook was not installed" in result.stderr
    assert hook_files(nodeps) == []


def test_install_on_read_only_site_packages_exits_7_and_creates_nothing(nodeps):
    site = site_packages(nodeps)
    python = nodeps / "bin" / "python"
    shell = f"mount --bind -o ro {site} {site} && exec {sys.executable} -m gptoss_patch hook install --python {python}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "GPTOSS_PATCH_"))}
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", shell], capture_output=True, text=True, env=env)
    assert proc.returncode == 7, proc.stderr
    assert "read-only filesystem; nothing was changed" in proc.stderr
    assert hook_files(nodeps) == []


def test_user_patches_are_expected_named_in_the_refusal_and_re_applied_in_apply_mode(venv, driver, ids, tmp_path):
    """A user patch in a patch directory: `hook install --patch-dir` expects it; after a reinstall (the
    original bytes back, no ledger) `fail` names it and the fix line carries --patch-dir, `apply` re-applies it."""
    import difflib

    pristine(venv)
    path = site_packages(venv) / MARLIN
    text = path.read_text()
    old = "    # the performance of atomicAdd is better than global reduce\n"
    new = text.replace(old, "    # site-local: tuned for our GB10s\n" + old, 1)
    patches = tmp_path / "patches"
    patches.mkdir()
    diff = "".join(difflib.unified_diff(text.splitlines(True), new.splitlines(True), f"a/{MARLIN}", f"b/{MARLIN}"))
    (patches / "site-local.diff").write_text("# vllm: ==0.17.1\n" + diff)
    try:
        assert run("apply", "--patch-dir", str(patches), venv=venv, by_python=True).exit_code == 0
        result = run("hook", "install", "--mode", "fail", "--patch-dir", str(patches), venv=venv, by_python=True)
        assert result.exit_code == 0, result.stderr
        patched_bytes = path.read_bytes()
        pristine(venv)  # what a reinstall leaves behind: original bytes, no ledger

        failed = driver.load("fail")
        python = venv / "bin" / "python"
        assert only_line(failed, "ERROR") == (
            f"gptoss-patch: refusing to start: vllm 0.17.1 lacks patches {', '.join(sorted([*ids, 'site-local']))}; "
            f"fix: gptoss-patch apply --python {python} --patch-dir {patches}"
        )
        healed = driver.load("apply")
        assert healed["outcome"] == "ok", healed["logs"]
        assert path.read_bytes() == patched_bytes  # the user's line and the built-in, as after the first apply
        assert driver.load("fail")["outcome"] == "ok"
    finally:
        run("hook", "uninstall", venv=venv, by_python=True)  # the recorded patch directory must not reach the other tests
        pristine(venv)


def test_a_user_patch_that_creates_a_module_comes_back_in_apply_mode_after_a_reinstall(venv, driver, ids, tmp_path):
    """A creation patch (a new module in the vllm package): the hook expects it; after a reinstall (pip removes
    the file, which RECORD lists while applied) `apply` mode creates it again, and vLLM starts."""
    pristine(venv)
    rel = "vllm/site_local_helpers.py"
    path = site_packages(venv) / rel
    text = "SITE = 'gb10'\n"
    patches = tmp_path / "patches"
    patches.mkdir()
    (patches / "helpers.diff").write_text(
        f"# vllm: ==0.17.1\ndiff --git a/{rel} b/{rel}\nnew file mode 100644\n--- /dev/null\n+++ b/{rel}\n@@ -0,0 +1 @@\n+{text}"
    )
    try:
        assert run("apply", "--patch-dir", str(patches), venv=venv, by_python=True).exit_code == 0
        assert path.read_text() == text
        result = run("hook", "install", "--mode", "fail", "--patch-dir", str(patches), venv=venv, by_python=True)
        assert result.exit_code == 0, result.stderr
        assert driver.load("fail")["outcome"] == "ok"
        pristine(venv)  # what a reinstall leaves behind: no new file, no ledger
        assert not path.exists()
        assert "helpers" in only_line(driver.load("fail"), "ERROR")
        healed = driver.load("apply")
        assert healed["outcome"] == "ok", healed["logs"]
        assert path.read_text() == text
        assert driver.load("fail")["outcome"] == "ok"
    finally:
        run("hook", "uninstall", venv=venv, by_python=True)
        pristine(venv)
    assert not path.exists()


# -- on a fake vLLM (no download): what hook install says, and the advice it shares with apply and status ------


@pytest.fixture
def fake(tmp_path: Path) -> Path:
    fakesite.build(tmp_path / "venv")
    return tmp_path / "venv"


def test_install_on_an_unpatched_venv_says_vllm_now_refuses_to_start_and_its_fix_works(fake):
    installed = run("hook", "install", venv=fake, by_python=True)
    assert installed.exit_code == 1
    assert (f"warning: vLLM in {site_packages(fake)} now refuses to start (hook mode fail) until the fix below is run; "
            "`hook install --mode warn` only logs instead") in installed.stderr
    fix = next(line for line in installed.stderr.splitlines() if line.startswith("fix: ")).removeprefix("fix: ")
    assert run_fix(fix).exit_code == 0
    assert run("hook", "status", venv=fake, by_python=True).exit_code == 0
    again = run("hook", "install", venv=fake, by_python=True)  # nothing missing: nothing to warn about
    assert again.exit_code == 0 and "refuses to start" not in again.stderr


def test_install_over_a_modified_patch_advises_revert_force_only_and_the_advice_works(fake):
    assert run("apply", venv=fake, by_python=True).exit_code == 0
    target = site_packages(fake) / MARLIN
    target.write_text(target.read_text() + "# a later edit\n")
    refused = run("hook", "install", venv=fake, by_python=True)
    assert refused.exit_code == 5 and "the hook was not installed" in refused.stderr and "--skip" not in refused.stderr
    hint = next(line for line in refused.stderr.splitlines() if line.startswith("hint: "))
    command = hint.split("`")[1]
    assert command.startswith("gptoss-patch revert --force --only marlin_atomic_add_sm121 --python ")
    assert run_fix(command).exit_code == 0
    assert run("apply", venv=fake, by_python=True).exit_code == 0
    assert run("hook", "install", venv=fake, by_python=True).exit_code == 0


def test_install_over_a_damaged_file_advises_a_reinstall_not_skip(fake):
    target = site_packages(fake) / SERVING
    target.write_text(target.read_text().replace("        messages.append(sys_msg)\n", ""))
    refused = run("hook", "install", venv=fake, by_python=True)
    assert refused.exit_code == 3 and "the hook was not installed" in refused.stderr
    assert "reinstall vllm" in refused.stderr and "--skip harmony" not in refused.stderr.split("hint:")[1]
    assert hook_files(fake) == []

