"""Opt-in patches: left out of the default set, applied only when named (--with, --only, the hook's selection).

On the fake 0.17.1 site, where the opt-in harmony_no_tools_channels would otherwise be pending.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gptoss_patch.registry import all_specs
from tests.support import fakesite
from tests.support.cli import run, states

OPT_IN = next(s.id for s in all_specs() if s.opt_in)
HARMONY_UTILS = fakesite.HARMONY_UTILS_REL


@pytest.fixture
def venv(tmp_path: Path) -> tuple[Path, str]:
    inst = fakesite.build(tmp_path / "venv")
    return inst.site_packages, str(tmp_path / "venv")


def test_default_apply_leaves_the_opt_in_patch_out_and_status_is_clean(venv):
    site, path = venv
    result = run("apply", "--venv", path)
    assert result.exit_code == 0, result.output
    assert OPT_IN not in result.stderr
    # harmony_utils is also a default patch's target (harmony_instructions_parser): the opt-in's rewrite is absent
    assert f"gptoss-patch {OPT_IN}" not in (site / HARMONY_UTILS).read_text()
    status = run("status", "--venv", path, "--json")
    assert status.exit_code == 0, status.output  # opt-in is not "action needed"
    assert states(status)[OPT_IN] == "opt-in"


@pytest.mark.parametrize("flag", ["--with", "--only"])
def test_naming_it_applies_it_and_a_plain_revert_undoes_it(venv, flag):
    site, path = venv
    original = (site / HARMONY_UTILS).read_bytes()
    result = run("apply", "--venv", path, flag, OPT_IN)
    assert result.exit_code == 0, result.output
    assert f"({OPT_IN})" in result.stderr
    assert states(path)[OPT_IN] == "applied"  # once applied, status shows it without being named again
    reverted = run("revert", "--venv", path)
    assert reverted.exit_code == 0, reverted.output
    assert (site / HARMONY_UTILS).read_bytes() == original


def test_with_adds_to_the_default_set(venv):
    _, path = venv
    named = states(path, "--with", OPT_IN)
    assert named[OPT_IN] == "pending"
    assert set(named) == set(states(path))  # every default patch is still there


@pytest.mark.parametrize(
    "value, message",
    [
        pytest.param("no_such_patch", "unknown patch id 'no_such_patch'", id="unknown"),
        pytest.param("marlin_atomic_add_sm121", "--with takes an opt-in patch", id="not-opt-in"),
    ],
)
def test_with_a_patch_that_is_not_opt_in_is_a_usage_error(venv, value, message):
    site, path = venv
    before = (site / HARMONY_UTILS).read_bytes()
    result = run("apply", "--venv", path, "--with", value)
    assert result.exit_code == 2, result.output
    assert message in result.stderr and len(result.stderr.strip().splitlines()) <= 2
    assert (site / HARMONY_UTILS).read_bytes() == before


def test_list_marks_opt_in_patches():
    result = run("list", "--json")
    assert result.exit_code == 0, result.output
    marked = {p["id"] for p in json.loads(result.stdout) if p["opt_in"]}
    assert marked == {OPT_IN}


def test_the_hook_remembers_with_and_its_repair_line_names_it():
    from gptoss_patch.hook.installer import _stored_selection
    from gptoss_patch.hook.plugin import _selection_args

    chosen = _stored_selection({"selection": {"only": [], "skip": ["x"], "with": [OPT_IN]}})
    assert chosen.with_ == (OPT_IN,)
    assert _selection_args({"selection": {"skip": ["x"], "with": [OPT_IN]}}) == f" --skip x --with {OPT_IN}"
