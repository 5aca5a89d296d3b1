"""Each command at its boundary: exit codes, exact stderr lines, --json on stdout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import pytest

from gptoss_patch import clikit
from gptoss_patch.cli import app
from gptoss_patch.commands._launch import LaunchGroup, ServersLaunchGroup
from gptoss_patch.commands._measure import RunOptions, ServerRun
from gptoss_patch.launcher.prepare import LaunchRequest
from tests.support import fakesite
from tests.support.cli import run


@pytest.fixture
def venv(tmp_path: Path):
    inst = fakesite.build(tmp_path / "venv")
    return inst, str(tmp_path / "venv")


def detected_line(inst) -> str:
    return f"Detected vllm 0.17.1 at {inst.site_packages} (python {inst.python})"


def test_status_json_has_the_documented_shape_and_exit_1_when_pending(venv):
    inst, path = venv
    result = run("status", "--venv", path, "--json")
    assert result.exit_code == 1
    payload = json.loads(result.stdout)
    assert payload["vllm"] == {"version": "0.17.1", "distribution": "vllm", "location": str(inst.site_packages), "python": inst.python}
    assert {p["id"]: p["state"] for p in payload["patches"]} == fakesite.STOCK_STATES
    assert set(payload["patches"][0]) >= {"id", "state", "file", "reason"}
    assert result.stderr.splitlines() == [detected_line(inst)]


def test_apply_narrates_what_it_patched_then_status_is_clean(venv):
    inst, path = venv
    result = run("apply", "--venv", path, "--vllm", "0.17.1")
    assert result.exit_code == 0, result.stderr
    assert result.stderr.splitlines() == [
        detected_line(inst),
        "Patched vllm/entrypoints/openai/chat_completion/serving.py (harmony_final_flush)",
        "Patched vllm/entrypoints/openai/chat_completion/serving.py (harmony_instructions)",
        "Patched vllm/entrypoints/openai/parser/harmony_utils.py (harmony_instructions_parser)",
        "Patched vllm/entrypoints/openai/parser/harmony_utils.py (harmony_output_guard)",
        "Patched vllm/entrypoints/openai/responses/harmony.py (harmony_responses_channels)",
        "Patched vllm/entrypoints/openai/responses/harmony.py (harmony_responses_input)",
        "Patched vllm/entrypoints/openai/responses/serving.py (harmony_responses_instructions)",
        "Patched vllm/entrypoints/openai/chat_completion/serving.py (harmony_stream_guard)",
        "Patched vllm/entrypoints/openai/chat_completion/serving.py (harmony_tool_choice_needs_parser)",
        "Patched vllm/model_executor/layers/quantization/utils/marlin_utils.py (marlin_atomic_add_sm121)",
        "Done: 10 patched, 1 not-needed, 4 out-of-range, 1 opt-in",
    ]
    assert run("status", "--venv", path).exit_code == 0


def test_dry_run_prints_the_diff_and_writes_nothing(venv):
    inst, path = venv
    result = run("apply", "--venv", path, "--dry-run")
    assert result.exit_code == 0
    assert result.stdout.startswith("--- a/vllm/")
    assert "Would patch vllm/entrypoints/openai/chat_completion/serving.py (harmony_instructions)" in result.stderr
    assert run("status", "--venv", path).exit_code == 1


def test_diff_is_empty_once_everything_is_applied(venv):
    _, path = venv
    assert "+++ b/vllm/" in run("diff", "--venv", path).stdout
    run("apply", "--venv", path)
    assert run("diff", "--venv", path).stdout == ""


def test_revert_and_verify(venv):
    _, path = venv
    run("apply", "--venv", path)
    assert run("verify", "--venv", path).exit_code == 0
    result = run("revert", "--venv", path)
    assert result.exit_code == 0
    assert "Reverted vllm/model_executor/layers/quantization/utils/marlin_utils.py (marlin_atomic_add_sm121)" in result.stderr
    assert run("verify", "--venv", path).exit_code == 1  # pending again: action needed


def test_list_names_every_patch_with_its_range(venv):
    payload = json.loads(run("list", "--json").stdout)
    by_id = {p["id"]: p for p in payload}
    assert by_id["harmony_instructions"]["fixed_in"] == "0.23.0"
    assert "use_atomic_add=False since 0.12.0" in by_id["marlin_atomic_add_sm121"]["note"]
    assert by_id["harmony_no_tools_channels"]["opt_in"] and not by_id["harmony_reasoning_effort"]["opt_in"]


@pytest.mark.parametrize(
    "args, code, message",
    [
        pytest.param(("status", "--only", "nope"), 2, "error: unknown patch id 'nope'", id="unknown-id"),
        pytest.param(("apply", "--vllm", "0.17.x"), 2, "error: invalid version '0.17.x'", id="invalid-version"),
        pytest.param(("apply", "--vllm", "0.17.0"), 4, "error: --vllm 0.17.0 was asserted, but", id="mismatched-version"),
        pytest.param(("status", "--python", "/no/such/python"), 4, "error: --python /no/such/python: no such executable", id="no-interpreter"),
        pytest.param(("status", "--python", "/bin/true"), 4, "error: /bin/true is not a usable Python interpreter", id="not-python"),
    ],
)
def test_bad_input_gets_one_clear_line_and_a_documented_exit_code(venv, args, code, message):
    _, path = venv
    extra = ("--venv", path) if "--python" not in args else ()
    result = run(*args, *extra)
    assert result.exit_code == code
    assert result.stderr.startswith(message), result.stderr


def test_no_vllm_installed_names_the_interpreter(tmp_path):
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "empty")], check=True)
    result = run("status", "--venv", str(tmp_path / "empty"))
    assert result.exit_code == 4
    assert result.stderr.splitlines()[0] == f"error: vLLM is not installed for {tmp_path / 'empty' / 'bin' / 'python'}"


def test_directory_that_is_not_a_venv(tmp_path):
    result = run("status", "--venv", str(tmp_path))
    assert result.exit_code == 4
    assert result.stderr.splitlines()[0] == f"error: {tmp_path} is not a virtualenv (no pyvenv.cfg)"


def test_module_entry_point_prints_help():
    proc = subprocess.run([sys.executable, "-m", "gptoss_patch", "--help"], capture_output=True, text=True, check=True)
    assert "apply" in proc.stdout and "status" in proc.stdout


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_flag_prints_the_version_and_exits_0(flag):
    from gptoss_patch import __version__

    result = run(flag)
    assert result.exit_code == 0 and result.stdout == f"gptoss-patch {__version__}\n"


def test_a_non_python_program_as_python_is_one_short_line_without_the_probe():
    result = run("status", "--python", "/bin/ls")
    assert result.exit_code == 4
    first, *rest = result.stderr.splitlines()
    assert first.startswith("error: /bin/ls is not a usable Python interpreter (exit 2): ")
    assert len(first) < 300 and "import" not in first and "gptoss-patch puts" not in first
    assert all(line.startswith("hint:") for line in rest)


def test_diff_exit_code_is_1_while_something_would_change_and_0_after(venv):
    _, path = venv
    pending = run("diff", "--venv", path, "--exit-code")
    assert pending.exit_code == 1 and "+++ b/vllm/" in pending.stdout
    assert run("diff", "--venv", path).exit_code == 0  # without the flag: 0, as before
    run("apply", "--venv", path)
    clean = run("diff", "--venv", path, "--exit-code")
    assert clean.exit_code == 0 and clean.stdout == ""


def test_apply_check_writes_nothing_and_exits_1_while_something_would_change(venv):
    _, path = venv
    before = run("status", "--venv", path, "--json").stdout
    pending = run("apply", "--venv", path, "--check")
    assert pending.exit_code == 1 and "Would apply: " in pending.stderr
    assert run("status", "--venv", path, "--json").stdout == before
    run("apply", "--venv", path)
    assert run("apply", "--venv", path, "--check").exit_code == 0


def test_dry_run_json_carries_each_patch_diff(venv):
    _, path = venv
    payload = json.loads(run("apply", "--venv", path, "--dry-run", "--json").stdout)
    changing = [p["id"] for p in payload["patches"] if p.get("changed")]
    assert changing and sorted(payload["diffs"]) == sorted(changing)
    assert all(payload["diffs"][i].startswith("--- a/vllm/") for i in changing)


def test_list_takes_only_and_skip_like_every_command():
    ids = [p["id"] for p in json.loads(run("list", "--json").stdout)]
    only = run("list", "--json", "--only", ids[0])
    skipped = run("list", "--json", "--skip", ids[0])
    unknown = run("list", "--only", "no_such_patch")

    assert [p["id"] for p in json.loads(only.stdout)] == ids[:1]
    assert [p["id"] for p in json.loads(skipped.stdout)] == ids[1:]
    assert unknown.exit_code == 2 and unknown.stderr.startswith("error: ")


def test_under_json_an_error_is_also_a_json_object_on_stdout(tmp_path):
    result = run("status", "--json", "--venv", str(tmp_path))
    assert result.exit_code == 4 and result.stderr.startswith("error: ")
    error = json.loads(result.stdout)["error"]
    assert error["code"] == 4 and error["message"] == result.stderr.splitlines()[0].removeprefix("error: ")


@pytest.mark.parametrize(
    "args, missing",
    [
        pytest.param(("capture",), "Missing argument 'NAME'", id="capture-name"),
        pytest.param(("completion",), "Missing argument 'bash|zsh|fish'", id="completion-shell"),
    ],
)
def test_a_missing_required_argument_or_option_is_one_usage_line_and_exit_2(tmp_path, monkeypatch, args, missing):
    """A required parameter left out never reaches the command as None (click 8.2+ took `default=None` as given)."""
    monkeypatch.chdir(tmp_path)
    result = run(*args)
    assert result.exit_code == 2, result.output
    [line] = result.stderr.splitlines()
    assert line.startswith(f"Error: {missing}. Usage: gptoss-patch {' '.join(a for a in args if a.islower())}")
    assert not any(tmp_path.iterdir())


def test_status_on_a_newer_unknown_vllm_says_its_verdicts_are_unchecked(tmp_path):
    fakesite.build(tmp_path / "venv", version="0.99.0")
    path = str(tmp_path / "venv")
    unchecked = "vllm 0.99.0 is newer than every release gptoss-patch was checked against"
    result = run("status", "--venv", path)
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert warnings == [f"warning: {unchecked}: these verdicts come from the shape of its code alone (unchecked); "
                        "apply writes to it only with --allow-unknown-version"]
    payload = json.loads(run("status", "--venv", path, "--json").stdout)
    assert payload["vllm"]["unchecked"] == unchecked


def test_apply_check_prints_a_summary_and_keeps_the_diff_for_verbose(venv):
    inst, path = venv
    result = run("apply", "--venv", path, "--check")
    assert result.exit_code == 1 and result.stdout == ""  # no 500-line diff: what would change, by patch and file
    assert result.stderr.splitlines()[1:] == [
        "Would patch vllm/entrypoints/openai/chat_completion/serving.py (harmony_final_flush)",
        "Would patch vllm/entrypoints/openai/chat_completion/serving.py (harmony_instructions)",
        "Would patch vllm/entrypoints/openai/parser/harmony_utils.py (harmony_instructions_parser)",
        "Would patch vllm/entrypoints/openai/parser/harmony_utils.py (harmony_output_guard)",
        "Would patch vllm/entrypoints/openai/responses/harmony.py (harmony_responses_channels)",
        "Would patch vllm/entrypoints/openai/responses/harmony.py (harmony_responses_input)",
        "Would patch vllm/entrypoints/openai/responses/serving.py (harmony_responses_instructions)",
        "Would patch vllm/entrypoints/openai/chat_completion/serving.py (harmony_stream_guard)",
        "Would patch vllm/entrypoints/openai/chat_completion/serving.py (harmony_tool_choice_needs_parser)",
        "Would patch vllm/model_executor/layers/quantization/utils/marlin_utils.py (marlin_atomic_add_sm121)",
        "Would apply: 10 to patch, 1 not-needed, 4 out-of-range, 1 opt-in",
    ]
    verbose = run("apply", "--venv", path, "--check", "-v")
    assert verbose.exit_code == 1 and verbose.stdout.startswith("--- a/vllm/")
    assert verbose.stdout.startswith(run("diff", "--venv", path).stdout)  # then -v's state table


def test_apply_check_and_dry_run_together_are_a_usage_error(venv):
    _, path = venv
    before = run("status", "--venv", path, "--json").stdout
    result = run("apply", "--venv", path, "--check", "--dry-run")
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        "error: --check and --dry-run do not combine: --check names what would change and exits 1 (for CI), "
        "--dry-run shows the diff; pass one of them"
    ]
    assert run("status", "--venv", path, "--json").stdout == before


def test_apply_and_revert_count_the_same_patches_the_same_way(venv):
    _, path = venv

    def summary(*args: str) -> str:
        return run(*args, "--venv", path).stderr.splitlines()[-1]

    assert summary("apply") == "Done: 10 patched, 1 not-needed, 4 out-of-range, 1 opt-in"
    assert summary("apply") == "Done: 10 applied, 1 not-needed, 4 out-of-range, 1 opt-in"
    assert summary("revert") == "Done: 10 reverted, 1 not-needed, 4 out-of-range, 1 opt-in"
    assert summary("revert") == "Nothing to revert: 10 pending, 1 not-needed, 4 out-of-range, 1 opt-in"


def every_command():
    """(words, click command) of every leaf command, groups walked."""
    import click

    ctx = click.Context(app)
    for name in app.list_commands(ctx):
        command = app.get_command(ctx, name)
        if isinstance(command, click.Group):
            yield from (((name, sub), command.get_command(ctx, sub)) for sub in command.list_commands(ctx))
        else:
            yield (name,), command


def test_every_commands_help_ends_with_its_own_exit_codes():
    from gptoss_patch.errors import COMMAND_EXITS, ExitCode

    seen = set()
    for words, command in every_command():
        seen.add(" ".join(words))
        text = run(*words, "--help").stdout
        last = " ".join(text.strip().split("\n\n")[-1].split())
        assert last.startswith("Exit codes: 0 ok, ") and "2 usage error" in last, (words, last)
        targets = {"--python", "--venv"} & {o for p in command.params for o in getattr(p, "opts", ())}
        listed = ExitCode.TARGET in COMMAND_EXITS.get(" ".join(words), ())  # venv create: an install that failed
        assert ("4 target problem" in last) == bool(targets or listed), (words, last)
    assert set(COMMAND_EXITS) <= seen  # the table names real commands only
    assert "1 action needed" in " ".join(run("apply", "--help").stdout.split())


def _meaning(help_text: str) -> str:
    """An option's meaning: the first sentence of its help (a command may add detail after it)."""
    import re

    return re.split(r"(?<=[.!?])\s+(?=[A-Z])", " ".join(help_text.split()), maxsplit=1)[0]


def test_an_option_shared_by_several_commands_means_one_thing_everywhere():
    """Every option name that several commands take opens its help with the same sentence and is the same kind
    (a flag everywhere, or a value everywhere), in every command's --help: `venv create --vllm X` installed X while
    every other `--vllm X` asserts the installed version is X (#36). Hidden (deprecated) spellings are left out."""
    import click

    meanings: dict[str, dict[tuple[str, bool], list[str]]] = {}
    for words, command in every_command():
        for param in command.params:
            if not isinstance(param, click.Option) or param.hidden:
                continue
            assert param.help, f"{' '.join(words)} {param.opts[0]} has no help"
            for name in (*param.opts, *param.secondary_opts):
                kind = (_meaning(param.help), param.is_flag or param.count)
                meanings.setdefault(name, {}).setdefault(kind, []).append(" ".join(words))
    split = {name: kinds for name, kinds in meanings.items() if len(kinds) > 1}
    assert split == {}
    assert len([name for name, kinds in meanings.items() if len(next(iter(kinds.values()))) > 1]) > 10  # it looked


def test_every_help_lists_the_exit_codes_once_as_its_last_paragraph():
    """Every command's, every group's (`hook`, `venv`, ...) and the root's."""
    import click

    groups = [(name,) for name in app.list_commands(click.Context(app))
              if isinstance(app.get_command(click.Context(app), name), click.Group)]
    assert ("venv",) in groups
    for words in [(), *groups, *(words for words, _command in every_command())]:
        text = run(*words, "--help").stdout
        assert text.count("Exit codes:") == 1, words  # no second, hand-written list in a docstring to drift
        assert text.strip().split("\n\n")[-1].lstrip().startswith("Exit codes:"), words


def test_venv_create_takes_the_version_to_install_as_install_vllm(monkeypatch, tmp_path):
    """--install-vllm X installs X; the old spelling --vllm X still does, with one line saying it is deprecated."""
    from gptoss_patch import provision
    from gptoss_patch.errors import TargetError

    plans: list[provision.Plan] = []

    def stop(plan, step, echo=None, announce=None):  # noqa: ANN001, ANN202, ARG001
        plans.append(plan)
        raise TargetError("stopped here")

    monkeypatch.setattr(provision, "create", stop)
    new = run("venv", "create", str(tmp_path / "a"), "--install-vllm", "0.17.1")
    assert new.exit_code == 4 and new.stderr.splitlines() == ["error: stopped here"]
    old = run("venv", "create", str(tmp_path / "b"), "--vllm", "0.22.1")
    assert old.exit_code == 4 and old.stderr.splitlines() == [
        "warning: venv create --vllm is deprecated (every other command's --vllm asserts the installed version): "
        "use --install-vllm 0.22.1",
        "error: stopped here",
    ]
    assert [p.vllm for p in plans] == ["0.17.1", "0.22.1"]
    assert "--vllm" not in run("venv", "create", "--help").stdout.replace("--install-vllm", "")


@pytest.mark.parametrize(
    "args, line",
    [
        pytest.param((), "error: venv create needs --install-vllm VERSION: the vLLM release to install, e.g. --install-vllm 0.17.1",
                     id="neither"),
        pytest.param(("--install-vllm", "0.17.1", "--vllm", "0.22.1"),
                     "error: --install-vllm 0.17.1 and --vllm 0.22.1 disagree; pass --install-vllm alone", id="both"),
    ],
)
def test_venv_create_without_one_version_is_one_usage_line_and_creates_nothing(tmp_path, args, line):
    result = run("venv", "create", str(tmp_path / "v"), *args)
    assert result.exit_code == 2 and result.stderr.splitlines() == [line]
    assert not (tmp_path / "v").exists()


def test_list_joins_adjacent_bands_into_one_range_and_says_which_versions_each_target_is_for():
    from gptoss_patch.commands import patches
    from gptoss_patch.spec import Band

    class Spec:  # just the bands `list` reads
        def __init__(self, *bands: tuple[str, str]) -> None:
            self.bands = tuple(Band(v, t) for v, t in bands)
            self.versions = " | ".join(b.versions for b in self.bands)

    same = Spec((">=0.15.1,<0.22", "a.py"), (">=0.22,<0.24", "a.py"))
    assert (patches._versions(same), patches._targets(same)) == ("0.15.1–0.23.x", "vllm/a.py")
    moved = Spec((">=0.15.1,<0.22", "a.py"), (">=0.22,<0.24", "b.py"), (">=0.24", "b.py"))
    assert patches._versions(moved) == "0.15.1+"
    assert patches._targets(moved) == "vllm/a.py (0.15.1–0.21.x)\nvllm/b.py (0.22+)"
    gap = Spec((">=0.15.1,<0.18", "a.py"), (">=0.20,<0.25.1", "a.py"))
    assert patches._versions(gap) == "0.15.1–0.17.x, 0.20–<0.25.1"
    shown = run("list", "--wide", "--only", "harmony_instructions").stdout
    assert "0.15.1–0.22.x" in shown and "|" not in shown.split("\n", 3)[3].split("│")[2]
    assert "vllm/entrypoints/openai/chat_completion/serving.py (0.15.1–0.17.x)" in shown


# -- clikit.Group: options declared once that reach a command as one value ---------------------------------


def test_an_option_group_is_listed_where_it_stands_and_reaches_the_command_as_one_value() -> None:
    got = []
    group = clikit.App()

    @group.command("measure")
    def measure(first: Annotated[int, clikit.Option("--first")] = 1, *, run: RunOptions,
                last: Annotated[str, clikit.Option("--last")] = "x") -> None:  # fmt: skip
        got.append((first, run, last))

    given = run("measure", "--log-dir", "/l", "--json", "-vv", "--first", "2", command=group)
    assert given.exit_code == 0, given.output
    assert got == [(2, ServerRun(start_timeout=900.0, log_dir=Path("/l"), json=True, verbose=2), "x")]
    assert run("measure", command=group).exit_code == 0
    assert got[-1] == (1, ServerRun(start_timeout=900.0, log_dir=None, json=False, verbose=0), "x")
    shown = run("measure", "--help", columns=200, command=group).stdout
    places = [shown.index(option) for option in ("--first", "--start-timeout", "--log-dir", "--json", "--verbose", "--last")]
    assert places == sorted(places)


def test_the_launch_group_takes_model_and_the_words_after_dashes_and_fixes_what_measuring_commands_never_ask() -> None:
    got = []
    group = clikit.App()

    @group.command("serves")
    def serves(launch: LaunchGroup, json: Annotated[bool, clikit.Option("--json")] = False) -> None:
        got.append((launch, json))

    @group.command("measures")
    def measures(launch: ServersLaunchGroup) -> None:
        got.append((launch, None))

    given = run("serves", "m", "--port", "9", "--no-tuned", "--json", "--", "-tp", "2", command=group)
    assert given.exit_code == 0, given.output
    assert got == [(LaunchRequest("m", extra_args=("-tp", "2"), port=9, tuned=False), True)]
    assert run("measures", "m", command=group).exit_code == 0
    assert got[-1] == (LaunchRequest("m", expect_reasoning=True, tuned=False), None)
    refused = run("measures", "m", "--tuned", command=group)  # bench, numerics, tune measure the built-in profile
    assert refused.exit_code == 2 and "--tuned" in refused.output
    assert "MODEL" in run("serves", command=group).output  # MODEL is required: a usage error names it
