"""Target discovery: the probe runs in the target interpreter; its cached answer is never stale. And `call`, the one way
to run code there: its framing, its timeout, its one error."""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from gptoss_patch import target
from gptoss_patch.errors import ExitCode, InterpreterFailed, TargetError, last_line
from tests.support import fakesite


@pytest.fixture
def venv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return fakesite.build(tmp_path / "venv")


def probes_run(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    real = target._run_probe
    monkeypatch.setattr(target, "_run_probe", lambda python: calls.append(python) or real(python))
    return calls


def test_a_second_lookup_reuses_the_probe(venv, monkeypatch):
    calls = probes_run(monkeypatch)
    first, second = target.discover(venv.python), target.discover(venv.python)
    assert first == second and len(calls) == 1


def test_a_reinstall_changes_the_directory_and_the_answer(venv, monkeypatch):
    calls = probes_run(monkeypatch)
    target.discover(venv.python)
    renamed = venv.dist_info.with_name("vllm-0.18.0.dist-info")
    venv.dist_info.rename(renamed)  # what an upgrade does to site-packages
    (renamed / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.18.0\n")
    assert str(target.discover(venv.python).version) == "0.18.0"
    assert len(calls) == 2


def test_a_missing_dist_info_is_never_served_from_the_cache(venv, monkeypatch):
    calls = probes_run(monkeypatch)
    target.discover(venv.python)
    stamp = venv.site_packages.stat().st_mtime_ns
    shutil.rmtree(venv.dist_info)
    os.utime(venv.site_packages, ns=(stamp, stamp))  # the directory stamp alone would not tell
    with pytest.raises(target.TargetError, match="no .dist-info there provides the vllm package"):
        target.discover(venv.python)  # the package files are still there, but nothing installed them
    assert len(calls) == 2


def test_pythonpath_is_part_of_the_key(venv, monkeypatch):
    calls = probes_run(monkeypatch)
    target.discover(venv.python)
    monkeypatch.setenv("PYTHONPATH", str(venv.site_packages.parent))
    target.discover(venv.python)
    assert len(calls) == 2


# -- fix lines name an installer that exists for the target (issue #36, item 7) ------------------------


def tiny_wheel(directory: Path) -> Path:
    """A pure-Python wheel made here (no download): the package `tinydemo` 1.0."""
    import base64
    import hashlib
    import zipfile

    files = {"tinydemo/__init__.py": b"VALUE = 1\n",
             "tinydemo-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: tinydemo\nVersion: 1.0\n",
             "tinydemo-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    rows = [f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}" for n, d in files.items()]
    files["tinydemo-1.0.dist-info/RECORD"] = ("\n".join([*rows, "tinydemo-1.0.dist-info/RECORD,,"]) + "\n").encode()
    wheel = directory / "tinydemo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return wheel


def test_fix_lines_for_a_venv_without_pip_use_uv_and_work_when_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess
    import sys

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)  # as `uv venv` makes
    python = str(tmp_path / "venv" / "bin" / "python")
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:/usr/bin:/bin")  # uv beside the test's Python
    assert shutil.which("uv") and not target.has_pip(python)
    links = tiny_wheel(tmp_path).parent
    offline = ("--no-index", "--find-links", str(links))
    install = target.pip_command(python, "install", "--force-reinstall", "--no-deps", *offline, "tinydemo==1.0")
    assert install.startswith(f"uv pip install --python {python} --reinstall --no-deps")
    env = {**os.environ, "UV_NO_CACHE": "1", "UV_OFFLINE": "1"}
    for line in (install, install, target.pip_command(python, "check")):  # the printed line, run as printed
        done = subprocess.run(line, shell=True, capture_output=True, text=True, env=env, check=False)
        assert done.returncode == 0, (line, done.stderr)
    assert subprocess.run([python, "-c", "import tinydemo"], check=False).returncode == 0
    done = subprocess.run(target.pip_command(python, "uninstall", "-y", "tinydemo"), shell=True, capture_output=True, env=env, check=False)
    assert done.returncode == 0 and subprocess.run([python, "-c", "import tinydemo"], capture_output=True, check=False).returncode == 1


def test_fix_lines_use_the_venvs_own_pip_when_it_has_one_and_ensurepip_when_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util
    import sys

    real_find_spec = importlib.util.find_spec
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\ninclude-system-site-packages = false\n")
    python = str(venv / "bin" / "python")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no uv
    assert target.pip_command(python, "check") == f"{sys.executable} -m pip --python {python} check"  # our own pip
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pip" else real_find_spec(name, *a))
    assert target.pip_command(python, "check") == f"{python} -m ensurepip && {python} -m pip check"
    (venv / "lib" / "python3.12" / "site-packages" / "pip").mkdir(parents=True)
    (venv / "lib" / "python3.12" / "site-packages" / "pip" / "__init__.py").write_text("")
    assert target.pip_command(python, "uninstall", "-y", "x") == f"{python} -m pip uninstall -y x"
    inst = target.Installation(python, target.parse_version("0.22.1+cu129"), venv, venv / "vllm-0.22.1.dist-info")
    assert inst.reinstall_command == f"{python} -m pip install --force-reinstall --no-deps vllm==0.22.1"


def test_the_hooks_reinstall_line_and_the_tools_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # One builder (the hook's stdlib plugin; target.pip_command calls it): the hook's refusal and the tool's hints
    # print the same reinstall, with the local version label dropped, in the spelling of the installer at hand.
    import sys

    from gptoss_patch.hook import plugin

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    python = str(venv / "bin" / "python")
    reinstall = ("install", "--force-reinstall", "--no-deps", "vllm==0.22.1")
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))  # uv is there (the test extra installs it)
    assert plugin.reinstall_command(python, "vllm", "0.22.1+cu129") == target.pip_command(python, *reinstall)
    assert target.pip_command(python, *reinstall).startswith(f"uv pip install --python {python} --reinstall")
    (venv / "lib" / "python3.12" / "site-packages" / "pip").mkdir(parents=True)
    (venv / "lib" / "python3.12" / "site-packages" / "pip" / "__init__.py").write_text("")
    assert plugin.reinstall_command(python, "vllm", "0.22.1+cu129") == f"{python} -m pip install --force-reinstall --no-deps vllm==0.22.1"


# -- target.call: the one way to run code in the target interpreter (a tiny script in this interpreter) ----------

LOGS_AND_TWO_ANSWERS = f"""
import sys
print("INFO a library logs to stdout")
print("a warning", file=sys.stderr)
{target.answer_line("{'first': sys.argv[1:]}")}
print({target.ANSWER!r} + "not json")  # a log line that happens to start like an answer is no answer
{target.answer_line("{'last': True}")}
print("INFO after the answer")
"""


def test_the_answer_is_the_last_json_line_behind_the_mark_and_every_one_comes_as_it_is_printed() -> None:
    seen: list[object] = []
    ran = target.call(sys.executable, LOGS_AND_TWO_ANSWERS, "a", "b", what="the test script", on_answer=seen.append)
    assert ran.answers == ({"first": ["a", "b"]}, {"last": True}) and ran.answer == {"last": True}
    assert seen == list(ran.answers) and ran.returncode == 0 and ran.failure is None
    assert ran.stderr == "a warning\n"


def test_a_script_file_takes_its_input_on_stdin_and_its_environment(tmp_path: Path) -> None:
    script = tmp_path / "echo.py"
    script.write_text("import os, sys\n" + target.answer_line("[sys.stdin.read(), os.environ['ECHOED']]") + "\n")
    ran = target.call(sys.executable, script, what="echo", stdin="payload", env={**os.environ, "ECHOED": "yes"})
    assert ran.answer == ["payload", "yes"]


def test_a_failure_names_the_last_meaningful_stderr_line_and_carries_the_last_lines() -> None:
    source = "import sys\nprint('Traceback (most recent call last):\\n  File \"x\"\\nValueError: the last line\\n\\n', file=sys.stderr)\nsys.exit(3)"
    with pytest.raises(InterpreterFailed) as caught:
        target.call(sys.executable, source, what="the test script failed")
    failure = caught.value
    assert str(failure) == "the test script failed (exit 3): ValueError: the last line"
    assert failure.reason == "ValueError: the last line" and failure.returncode == 3
    assert failure.last_lines == ("Traceback (most recent call last):", 'File "x"', "ValueError: the last line")
    assert isinstance(failure, TargetError) and failure.exit_code == ExitCode.TARGET
    assert failure.detail is not None and failure.detail.endswith("ValueError: the last line")


def test_a_run_past_its_timeout_is_killed_and_says_so() -> None:
    source = "import sys, time\n" + target.answer_line("'early'") + "\ntime.sleep(60)"
    started = time.monotonic()
    with pytest.raises(InterpreterFailed, match=r"^slow: did not finish in 1 s$"):
        target.call(sys.executable, source, what="slow", timeout=1)
    ran = target.call(sys.executable, source, what="slow", timeout=1, check=False)
    assert ran.timed_out and ran.returncode is None and ran.answers == ("early",)  # what came before it is kept
    assert ran.failure is not None and ran.failure.reason == "did not finish in 1 s"
    assert time.monotonic() - started < 30


@pytest.mark.parametrize(
    ("python", "source", "reason"),
    [
        pytest.param(sys.executable, "print('only a log line')", "only a log line", id="no-answer"),
        pytest.param("/bin/true", "", "no output", id="not-python-silent"),
        pytest.param("/nonexistent/python", "", "cannot start /nonexistent/python (No such file or directory)", id="missing"),
    ],
)
def test_no_answer_is_a_failure_too(python: str, source: str, reason: str) -> None:
    with pytest.raises(InterpreterFailed) as caught:
        target.call(python, source, what="asking")
    assert str(caught.value) == f"asking: {reason}"


def test_the_last_line_helper_skips_blank_lines_and_pips_notices() -> None:
    output = "ERROR: No matching distribution\n\n[notice] A new release of pip is available\n   \n"
    assert last_line(output) == "ERROR: No matching distribution"
    assert last_line("\n \n") == "no output" and last_line("", default="pip failed") == "pip failed"
