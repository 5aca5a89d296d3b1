"""Issue 12: output for people and for pipes. 80-column tables that never split an id or a path, --wide,
-q/--quiet, additive -v, --color with NO_COLOR/FORCE_COLOR, shell completion, help text as sentences.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gptoss_patch import render
from gptoss_patch.registry import all_specs
from tests.support import fakesite
from tests.support.cli import run

COLOUR = re.compile(r"\x1b\[(?:\d+;)*3[0-9]")  # a foreground colour (bold alone is not colour, as NO_COLOR says)
IDS = [spec.id for spec in all_specs()]
TARGETS = sorted({f"vllm/{band.target}" for spec in all_specs() for band in spec.bands})


@pytest.fixture
def venv(tmp_path: Path) -> str:
    fakesite.build(tmp_path / "venv")
    return str(tmp_path / "venv")


@pytest.fixture(autouse=True)
def _fresh_consoles() -> None:
    """-q and --color reconfigure render's consoles: each test starts from the defaults."""
    yield
    render.configure()
    render.err, render.out = render._console(stderr=True), render._console()


def test_status_at_80_columns_fits_and_keeps_every_id_whole(venv: str) -> None:
    result = run("status", "--venv", venv, columns=80)
    lines = result.stdout.splitlines()
    assert result.exit_code == 1 and lines
    assert max(len(line) for line in lines) <= 80
    for patch_id in IDS:
        assert any(f"│ {patch_id} " in line for line in lines), patch_id
    assert "(file left out to fit 80 columns: --wide or --json shows it)" in result.stderr


@pytest.mark.parametrize("flag", ["--wide", "-v"])
def test_status_wide_shows_every_path_whole_on_one_line(venv: str, flag: str) -> None:
    result = run("status", "--venv", venv, flag, columns=80)
    assert "serving.py" in result.stdout
    shown = {path for path in TARGETS for line in result.stdout.splitlines() if path in line.split()}
    assert "vllm/entrypoints/openai/chat_completion/serving.py" in shown and "left out" not in result.stderr


def test_list_at_80_columns_never_cuts_an_id_a_path_or_a_url() -> None:
    result = run("list", columns=80)
    assert result.exit_code == 0
    words = set(result.stdout.split())
    assert set(IDS) <= words
    assert {path for path in TARGETS} <= words
    assert {url for spec in all_specs() for url in spec.upstream} <= words


def test_piped_output_without_columns_keeps_one_table_row_per_patch(venv: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    proc = subprocess.run([sys.executable, "-m", "gptoss_patch", "status", "--venv", venv], capture_output=True, text=True, env=env, check=False)
    rows = [line for line in proc.stdout.splitlines() if line.startswith("│ ") and not line.startswith("│  ")]
    assert [row.split()[1] for row in rows] == IDS


def test_quiet_leaves_only_the_result(venv: str) -> None:
    applied = run("apply", "--venv", venv, "-q", columns=80)
    assert applied.exit_code == 0 and applied.stderr == ""
    status = run("-q", "status", "--venv", venv, "--json", columns=80)
    assert status.exit_code == 0 and status.stderr == "" and json.loads(status.stdout)["clean"] is True


def test_quiet_keeps_errors() -> None:
    result = run("status", "-q", "--venv", "/nonexistent/venv", columns=80)
    assert result.exit_code == 4 and result.stderr.startswith("error: ")


def test_verbose_is_additive_from_the_root_and_the_command(venv: str) -> None:
    assert run("-v", "status", "--venv", venv, "-vv", columns=80).exit_code == 1
    wide = run("-v", "status", "--venv", venv, columns=200)
    assert "file" in wide.stdout.splitlines()[1] and "left out" not in wide.stderr


@pytest.mark.parametrize(
    ("args", "env", "coloured"),
    [
        (("--color", "always"), {"NO_COLOR": "1"}, True),
        (("--color", "never"), {"FORCE_COLOR": "1"}, False),
        ((), {"NO_COLOR": "1", "FORCE_COLOR": "1"}, False),
        ((), {"FORCE_COLOR": "1"}, True),
        ((), {}, False),  # auto: a pipe gets no colour
    ],
)
def test_color_flag_and_the_environment(venv: str, args: tuple[str, ...], env: dict[str, str], coloured: bool) -> None:
    base = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    command = [sys.executable, "-m", "gptoss_patch", "status", "--venv", venv, *args]
    proc = subprocess.run(command, capture_output=True, text=True, env={**base, **env}, check=False)
    assert proc.returncode == 1, proc.stderr
    assert bool(COLOUR.search(proc.stdout)) is coloured
    if args == ("--color", "never"):
        assert "\x1b[" not in proc.stdout  # not even bold


def test_color_rejects_other_values_at_parse_time(venv: str) -> None:
    result = run("status", "--venv", venv, "--color", "sometimes", columns=80)
    assert result.exit_code == 2 and "sometimes" in result.stderr


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_prints_a_script_for_each_shell(shell: str) -> None:
    result = run("completion", shell, columns=80)
    assert result.exit_code == 0 and "_GPTOSS_PATCH_COMPLETE" in result.stdout


def test_completion_completes_commands_and_patch_ids() -> None:
    def complete(words: str, cword: int) -> list[str]:
        env = {**os.environ, "COMP_WORDS": words, "COMP_CWORD": str(cword), "_GPTOSS_PATCH_COMPLETE": "bash_complete"}
        proc = subprocess.run([sys.executable, "-m", "gptoss_patch"], capture_output=True, text=True, env=env, check=False)
        return [line.split(",", 1)[1] for line in proc.stdout.splitlines()]

    assert complete("gptoss-patch st", 1) == ["status"]
    assert complete("gptoss-patch apply --only harmony_s", 3) == ["harmony_stream_guard"]


def test_an_unknown_shell_is_a_usage_error() -> None:
    result = run("completion", "tcsh", columns=80)
    assert result.exit_code == 2 and "'tcsh' is not one of bash, zsh, fish" in result.stderr


@pytest.mark.parametrize("command", [(), ("status",), ("apply",), ("venv", "create"), ("hook", "install"), ("vocab", "status")])
def test_help_paragraphs_are_re_flowed_sentences(command: tuple[str, ...]) -> None:
    """click re-flows each paragraph of the docstring: the words are the docstring's, every line but a
    paragraph's last is filled, and no word is broken at a hyphen (`gptoss-` / `patch`)."""
    result = run(*command, "--help", columns=80)
    assert result.exit_code == 0
    description = result.stdout.split("Options:")[0].split("\n\n")[1:]
    assert description
    for paragraph in filter(str.strip, description):
        lines = [line.strip() for line in paragraph.strip().splitlines()]
        assert not any(line.endswith("-") for line in lines), paragraph
        if lines[0].startswith(("Usage:", "DIR:", "bash|zsh|fish:")) or len(lines) < 2:
            continue
        assert all(len(line) >= 45 for line in lines[:-1]), paragraph  # filled (a long word may end a line early)


# -- issue 22, item 4: every table and every verbosity holds at 80, 100 and 120 columns -------------------------


def _expected_status(venv: str) -> dict[str, tuple[str, str]]:
    """patch id -> (state, file) from `status --json`."""
    report = json.loads(run("status", "--venv", venv, "--json", columns=3000).stdout)
    return {p["id"]: (p["state"], p["file"]) for p in report["patches"]}


@pytest.mark.parametrize("columns", [80, 100, 120])
@pytest.mark.parametrize("flags", [(), ("-v",), ("--wide",)])
def test_status_fits_every_width_with_ids_states_and_paths_whole(venv: str, flags: tuple[str, ...], columns: int) -> None:
    expected = _expected_status(venv)
    result = run("status", "--venv", venv, *flags, columns=columns)
    assert result.exit_code == 1, result.stderr
    lines = result.stdout.splitlines()
    assert lines and max(len(line) for line in lines) <= columns, max(lines, key=len)
    for patch_id, (state, _file) in expected.items():  # the id and its state whole, on one line
        assert any({patch_id, state} <= set(line.replace("│", " ").split()) for line in lines), (patch_id, state)
    if flags:  # -v and --wide leave no column out: every path is there, whole
        assert "left out" not in result.stderr
        words = set(result.stdout.replace("│", " ").split())
        assert {file for _state, file in expected.values() if file} <= words
        reasons = json.loads(run("status", "--venv", venv, "--json", columns=3000).stdout)["patches"]
        assert all(p["reason"].split()[-1] in words for p in reasons)  # the reason is shown (not an empty column)


@pytest.mark.parametrize("columns", [80, 100, 120])
@pytest.mark.parametrize("flags", [(), ("-v",), ("--wide",)])
def test_list_fits_every_width_with_ids_paths_and_urls_whole(flags: tuple[str, ...], columns: int) -> None:
    result = run("list", *flags, columns=columns)
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines and max(len(line) for line in lines) <= columns, max(lines, key=len)
    words = set(result.stdout.replace("│", " ").split())
    assert set(IDS) <= words
    if flags:
        assert "left out" not in result.stderr
        assert set(TARGETS) <= words
        assert {url for spec in all_specs() for url in spec.upstream} <= words
        assert "VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS=1" in words  # a long word of a summary is never folded


def test_list_takes_verbose_as_the_readme_says() -> None:
    assert run("list", "-v", columns=80).exit_code == 0
    assert run("-v", "list", columns=80).stdout == run("list", "--wide", columns=80).stdout


def test_apply_verbose_adds_every_state_and_very_verbose_the_diff_written(venv: str) -> None:
    plain = run("apply", "--venv", venv, columns=80)
    assert run("revert", "--venv", venv, columns=80).exit_code == 0
    verbose = run("apply", "--venv", venv, "-v", columns=80)
    assert run("revert", "--venv", venv, columns=80).exit_code == 0
    very = run("apply", "--venv", venv, "-vv", columns=80)
    assert plain.exit_code == verbose.exit_code == very.exit_code == 0
    assert "out-of-range" not in plain.stdout and "out-of-range" in verbose.stdout  # every patch, not only the changed
    assert "+++ b/vllm/" not in verbose.stdout and "+++ b/vllm/entrypoints/openai/chat_completion/serving.py" in very.stdout
    assert max(len(line) for line in verbose.stdout.splitlines()) <= 80


def test_no_color_removes_every_escape_code_as_color_never_does(venv: str) -> None:
    """On a terminal (FORCE_COLOR stands in for one), NO_COLOR leaves no bold or dim codes either."""
    base = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}

    def status(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "gptoss_patch", "status", "--venv", venv, *args]
        return subprocess.run(command, capture_output=True, text=True, env={**base, "COLUMNS": "200", **env}, check=False)

    no_color = status(NO_COLOR="1", FORCE_COLOR="1")
    never = status("--color", "never", FORCE_COLOR="1")
    assert "\x1b[" not in no_color.stdout + no_color.stderr
    assert (no_color.stdout, no_color.stderr) == (never.stdout, never.stderr)
