"""Issue 12: a user-facing error is one line (plus at most a hint): no script text, no traceback, no
multi-line subprocess output. The detail is there under -v.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from gptoss_patch import clikit
from gptoss_patch.cli import app
from gptoss_patch.errors import PatchFailed
from gptoss_patch.options import VerboseOption, handles_errors

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
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 4
    one_error_line(result.stderr)


def test_a_failing_interpreter_gives_its_last_line_and_the_rest_only_under_verbose(chatty: Path) -> None:
    quiet = CliRunner().invoke(app, ["status", "--python", str(chatty)])
    assert quiet.exit_code == 4
    line = one_error_line(quiet.stderr)
    assert line == f"error: {chatty} is not a usable Python interpreter: SomeError: the last line"
    assert "hint: re-run with -v for the details" in quiet.stderr
    verbose = CliRunner().invoke(app, ["status", "--python", str(chatty), "-v"])
    assert verbose.exit_code == 4
    assert verbose.stderr.splitlines()[0] == line
    assert "  Traceback (most recent call last):" in verbose.stderr and '    File "x", line 1' in verbose.stderr


def test_json_error_object_is_one_line_too(chatty: Path) -> None:
    result = CliRunner().invoke(app, ["status", "--python", str(chatty), "--json"])
    error = json.loads(result.stdout)["error"]
    assert error["code"] == 4 and "\n" not in error["message"] and error["message"].endswith("SomeError: the last line")


def _command(exc: Exception) -> clikit.App:
    group = clikit.App()

    @group.command("boom")
    @handles_errors
    def boom(verbose: VerboseOption = 0) -> None:
        raise exc

    return group


def test_a_multi_line_message_keeps_its_first_line_and_shows_the_rest_under_verbose() -> None:
    group = _command(PatchFailed("the codemod failed\n  at line 3\n  because of x", hint="see gptoss-patch diff"))
    result = CliRunner().invoke(group, ["boom"])
    assert result.exit_code == 3
    assert result.stderr.splitlines() == ["error: the codemod failed", "hint: see gptoss-patch diff; -v shows the details"]
    verbose = CliRunner().invoke(group, ["boom", "-v"])
    assert verbose.stderr.splitlines() == ["error: the codemod failed", "hint: see gptoss-patch diff", "    at line 3", "    because of x"]


def test_an_unexpected_error_is_one_line_and_a_traceback_only_under_verbose() -> None:
    group = _command(ValueError("bad\nvalue"))
    result = CliRunner().invoke(group, ["boom"])
    assert result.exit_code == 3
    assert result.stderr.splitlines() == ["error: unexpected error: ValueError: bad", "hint: re-run with --verbose for the traceback"]
    verbose = CliRunner().invoke(group, ["boom", "-v"])
    assert isinstance(verbose.exception, ValueError)  # re-raised: python prints the traceback
