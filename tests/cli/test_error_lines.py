"""Issue 12: a user-facing error is one line (plus at most a hint): no script text, no traceback, no
multi-line subprocess output. The detail is there under -v.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gptoss_patch import clikit
from gptoss_patch.errors import CheckFailed, InterpreterFailed, PatchFailed
from gptoss_patch.options import JsonOption, VerboseOption, handles_errors
from tests.support.cli import run, states

CHATTY = "#!/bin/sh\necho 'Traceback (most recent call last):' >&2\necho '  File \"x\", line 1' >&2\necho 'SomeError: the last line' >&2\nexit 1\n"


def one_error_line(stderr: str) -> str:
    """The error line, after checking that nothing but one hint line follows it."""
    lines = [line for line in stderr.splitlines() if not line.startswith("Detected ")]
    assert lines and lines[0].startswith("error: "), stderr
    assert all(line.startswith("hint: ") for line in lines[1:]) and len(lines) <= 2, stderr
    assert "Traceback" not in stderr and "import " not in stderr
    return lines[0]


@pytest.fixture
def chatty(tmp_path: Path) -> Path:
    """A `python` that fails with a multi-line traceback on stderr."""
    path = tmp_path / "python"
    path.write_text(CHATTY)
    path.chmod(0o755)
    return path


@pytest.mark.parametrize(
    "args",
    [
        ("status", "--python", "/bin/ls"),
        ("apply", "--python", "/bin/ls"),
        ("hook", "install", "--python", "/bin/ls"),
        ("doctor", "--python", "/bin/ls"),
        ("status", "--venv", "/nonexistent"),
        ("status", "--python", "/nonexistent/python"),
    ],
)
def test_target_errors_are_one_line(args: tuple[str, ...]) -> None:
    result = run(*args)
    assert result.exit_code == 4
    one_error_line(result.stderr)


def test_a_failing_interpreter_gives_its_last_line_and_the_rest_only_under_verbose(chatty: Path) -> None:
    quiet = run("status", "--python", str(chatty))
    assert quiet.exit_code == 4
    line = one_error_line(quiet.stderr)
    assert line == f"error: {chatty} is not a usable Python interpreter (exit 1): SomeError: the last line"
    assert "hint: re-run with -v for the details" in quiet.stderr
    verbose = run("status", "--python", str(chatty), "-v")
    assert verbose.exit_code == 4
    assert verbose.stderr.splitlines()[0] == line
    assert "  Traceback (most recent call last):" in verbose.stderr and '    File "x", line 1' in verbose.stderr


def test_json_error_object_is_one_line_too(chatty: Path) -> None:
    result = run("status", "--python", str(chatty), "--json")
    error = json.loads(result.stdout)["error"]
    assert error["code"] == 4 and "\n" not in error["message"] and error["message"].endswith("SomeError: the last line")


def _command(exc: Exception) -> clikit.App:
    group = clikit.App()

    @group.command("boom")
    @handles_errors
    def boom(verbose: VerboseOption = 0, json: JsonOption = False) -> None:
        raise exc

    return group


# -- issue 35, item 4: one error path, one JSON shape, the last lines carried on the error -------------------


@pytest.mark.parametrize(
    ("exc", "hint", "last_lines"),
    [
        pytest.param(PatchFailed("plain"), None, [], id="plain"),
        pytest.param(CheckFailed("server died", hint="log: x.log", last_lines=["INFO up", "OOM"]), "log: x.log",
                     ["INFO up", "OOM"], id="server-lines"),
        pytest.param(InterpreterFailed("probe", "E: last", stderr="Traceback\nE: last\n", returncode=1),
                     "re-run with -v for the details", ["Traceback", "E: last"], id="interpreter"),
        pytest.param(ValueError("boom"), "re-run with --verbose for the traceback", [], id="unexpected"),
    ],
)
def test_every_error_under_json_is_one_shape(exc: Exception, hint: str | None, last_lines: list[str]) -> None:
    result = run("boom", "--json", command=_command(exc))
    error = json.loads(result.stdout)["error"]
    assert list(error) == ["code", "message", "hint", "last_lines"]
    assert error["code"] == result.exit_code and error["message"] == result.stderr.splitlines()[0].removeprefix("error: ")
    assert error["hint"] == hint and error["last_lines"] == last_lines


def test_a_servers_last_lines_follow_the_error_line_and_a_processs_whole_output_is_under_verbose() -> None:
    lines = run("boom", command=_command(CheckFailed("server died", last_lines=["INFO up", "OOM"])))
    assert lines.exit_code == 1 and lines.stderr.splitlines() == ["error: server died", "  | INFO up", "  | OOM"]
    failed = InterpreterFailed("probe", "E: last", stderr="Traceback\nE: last\n", returncode=1)
    quiet = run("boom", command=_command(failed))
    assert quiet.stderr.splitlines() == ["error: probe (exit 1): E: last", "hint: re-run with -v for the details"]
    verbose = run("boom", "-v", command=_command(failed))
    assert verbose.stderr.splitlines() == ["error: probe (exit 1): E: last", "  Traceback", "  E: last"]


def test_a_multi_line_message_keeps_its_first_line_and_shows_the_rest_under_verbose() -> None:
    group = _command(PatchFailed("the codemod failed\n  at line 3\n  because of x", hint="see gptoss-patch diff"))
    result = run("boom", command=group)
    assert result.exit_code == 3
    assert result.stderr.splitlines() == ["error: the codemod failed", "hint: see gptoss-patch diff; -v shows the details"]
    verbose = run("boom", "-v", command=group)
    assert verbose.stderr.splitlines() == ["error: the codemod failed", "hint: see gptoss-patch diff", "    at line 3", "    because of x"]


def test_an_unexpected_error_is_one_line_and_a_traceback_only_under_verbose() -> None:
    group = _command(ValueError("bad\nvalue"))
    result = run("boom", command=group)
    assert result.exit_code == 3
    assert result.stderr.splitlines() == ["error: unexpected error: ValueError: bad", "hint: re-run with --verbose for the traceback"]
    verbose = run("boom", "-v", command=group)
    assert isinstance(verbose.exception, ValueError)  # re-raised: python prints the traceback


# -- issue 22, item 5: every error names its source and a fix that works ------------------------------------


@pytest.fixture
def fake(tmp_path: Path) -> str:
    from tests.support import fakesite

    fakesite.build(tmp_path / "venv")
    return str(tmp_path / "venv")


def test_no_active_virtualenv_says_so_and_points_at_venv_not_at_our_own_interpreter(tmp_path: Path) -> None:
    """Under pipx (or uv tool) with no venv active, the target is gptoss-patch's own interpreter: never suggest
    installing vLLM there."""
    result = run("status", env={"VIRTUAL_ENV": None})
    assert result.exit_code == 4
    line = one_error_line(result.stderr)
    assert line.startswith("error: no virtualenv is active, and the interpreter running gptoss-patch")
    assert "--venv DIR" in result.stderr and "pip install" not in result.stderr


def test_a_virtual_env_that_does_not_exist_is_named_as_coming_from_virtual_env() -> None:
    result = run("status", env={"VIRTUAL_ENV": "/nonexistent"})
    assert result.exit_code == 4
    assert one_error_line(result.stderr) == (
        "error: $VIRTUAL_ENV is /nonexistent, which has no bin/python (a virtualenv removed or moved since it was activated?)"
    )
    assert "deactivate" in result.stderr and "--venv DIR" in result.stderr


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ("@@ -1,3 +1,4 @@\n import torch\n+import os\ngarbage\n", "line 7 ('garbage') breaks the hunk that starts at line 4"),
        ("@@ -1,3 +1,4 @@\n import torch\n+import os\n", "the file ends inside the hunk that starts at line 4"),
    ],
)
def test_a_malformed_user_patch_is_unreadable_not_a_conflict(fake: str, tmp_path: Path, body: str, where: str) -> None:
    from tests.support.fakesite import MXFP4_REL

    patches = tmp_path / "patches"
    patches.mkdir()
    (patches / "broken.diff").write_text(f"# vllm: ==0.17.1\n--- a/{MXFP4_REL}\n+++ b/{MXFP4_REL}\n{body}")
    for command in ("status", "apply"):
        result = run(command, "--venv", fake, "--patch-dir", str(patches))
        assert result.exit_code == 2, result.stderr
        line = one_error_line(result.stderr)
        assert line.startswith(f"error: user patch {patches / 'broken.diff'} cannot be read as a patch: {where}"), line
        assert "conflict" not in result.stderr and "capture" in result.stderr


def test_a_user_patch_that_does_not_apply_names_its_file_what_is_in_the_way_and_a_fix(fake: str, tmp_path: Path) -> None:
    from tests.support.fakesite import MXFP4_REL

    patches = tmp_path / "patches"
    patches.mkdir()
    (patches / "noapply.diff").write_text(
        f"# vllm: ==0.17.1\n--- a/{MXFP4_REL}\n+++ b/{MXFP4_REL}\n@@ -1,1 +1,1 @@\n-import numpy\n+import numpy as np\n"
    )
    result = run("apply", "--venv", fake, "--patch-dir", str(patches))
    assert result.exit_code == 5
    line = one_error_line(result.stderr)
    assert "is conflict" not in line
    assert line.startswith(f"error: user patch noapply ({patches / 'noapply.diff'}): does not apply to vllm 0.17.1: patch failed: {MXFP4_REL}:1")
    assert "capture" in result.stderr and "--skip noapply" in result.stderr


def test_revert_calls_an_unnamed_opt_in_patch_opt_in_never_pending(fake: str) -> None:
    opt_in = "harmony_no_tools_channels"
    assert run("apply", "--venv", fake, "--with", opt_in).exit_code == 0
    for _ in ("reverted", "nothing to revert"):
        result = run("revert", "--venv", fake, "--json")
        assert result.exit_code == 0
        state = states(result)[opt_in]
        assert state == "opt-in"


def test_apply_check_with_nothing_to_do_says_so(fake: str) -> None:
    assert run("apply", "--venv", fake).exit_code == 0
    result = run("apply", "--venv", fake, "--check")
    assert result.exit_code == 0
    assert "Would apply" not in result.stderr and "Nothing to apply: 10 applied, 1 not-needed, 4 out-of-range, 1 opt-in" in result.stderr


# -- issue 36, item 14: an error says its cause, not an exception class (the class is for -v) ---------------


@pytest.mark.parametrize(
    ("args", "cause"),
    [
        (("apply", "--with-diff", "{dir}"), "cannot read diff {dir}: Is a directory"),
        (("status", "--patch-dir", "{patches}"), "cannot read user patch {patches}/mine.diff: Is a directory"),
    ],
    ids=["with-diff", "user-patch"],
)
def test_a_read_error_names_its_cause_not_the_exception_class(fake: str, tmp_path: Path, args: tuple[str, ...], cause: str) -> None:
    (tmp_path / "patches" / "mine.diff").mkdir(parents=True)  # a directory where a file is expected
    where = {"dir": str(tmp_path), "patches": str(tmp_path / "patches")}
    result = run(*(a.format(**where) for a in args), "--venv", fake)
    assert result.exit_code == 2
    assert one_error_line(result.stderr) == f"error: {cause.format(**where)}"
    assert "Error" not in result.stderr  # IsADirectoryError only under -v
    verbose = run(*(a.format(**where) for a in args), "--venv", fake, "-v")
    assert "IsADirectoryError" in verbose.stderr


def test_an_unexpected_os_error_says_its_cause_and_file() -> None:
    group = _command(PermissionError(13, "Permission denied", "/srv/x"))
    result = run("boom", command=group)
    assert result.stderr.splitlines()[0] == "error: unexpected error: Permission denied: /srv/x"
