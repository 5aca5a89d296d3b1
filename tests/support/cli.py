"""The tests' one way to run the gptoss-patch CLI and to read patch states from it.

- `run(*args)`: `gptoss-patch ARGS` in this process (click's CliRunner over gptoss_patch.cli.app): no interpreter
  start-up, and the test's monkeypatches apply. `venv=` names the target, `columns=` the terminal width rich lays
  tables and help out for (conftest pins 3000), `env=` more environment for the run (None unsets a variable).
- `run_process(*args)`: `python -m gptoss_patch ARGS` in its own process, for what only a process has: plugins
  found through entry points on a PYTHONPATH, gptoss-patch installed in another interpreter.
- `states(of)`: {patch id: state} of a venv (`status --json` run here), of a `status --json` already run (here or
  in a subprocess), or of an engine Report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import click
from click.testing import CliRunner

from gptoss_patch.cli import app
from gptoss_patch.spec import Report

Venv = str | os.PathLike[str]


@dataclass(frozen=True)
class CliResult:
    """What one in-process run left."""

    exit_code: int
    stdout: str
    stderr: str
    output: str  # stdout and stderr interleaved, as a terminal shows them
    exception: BaseException | None  # what ended the run: a SystemExit for a non-zero exit, or what escaped


def run(
    *args: str,
    venv: Venv | None = None,
    by_python: bool = False,
    env: Mapping[str, str | None] | None = None,
    columns: int | None = None,
    command: click.Command = app,
) -> CliResult:
    """`gptoss-patch ARGS` in this process. `venv`: the target, as --venv VENV (`by_python`: as --python
    VENV/bin/python), after the options. `command`: another click command (the error-path tests build their own)."""
    environ = {**(env or {}), **({"COLUMNS": str(columns)} if columns is not None else {})}
    result = CliRunner().invoke(command, _with_target(args, venv, by_python), env=environ)
    return CliResult(result.exit_code, result.stdout, result.stderr, result.output, result.exception)


def _with_target(args: tuple[str, ...], venv: Venv | None, by_python: bool) -> list[str]:
    if venv is None:
        return list(args)
    target = ["--python", str(Path(venv) / "bin" / "python")] if by_python else ["--venv", str(venv)]
    end = args.index("--") if "--" in args else len(args)  # what follows `--` is vLLM's
    return [*args[:end], *target, *args[end:]]


def run_process(
    *args: str,
    python: Venv = sys.executable,
    env: Mapping[str, str] | None = None,
    cwd: Venv | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """`python -m gptoss_patch ARGS` in its own process (`env`: its whole environment, when given)."""
    argv = [str(python), "-m", "gptoss_patch", *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout, check=False)


def states(
    of: Venv | CliResult | subprocess.CompletedProcess[str] | Report, *extra: str, by_python: bool = False
) -> dict[str, str]:
    """{patch id: state}. `of`: a venv (`status --json EXTRA` run on it here, which must give a report: exit 0
    or 1), the output of a `status --json` already run, here or in a subprocess, or an engine Report."""
    if isinstance(of, Report):
        return {result.id: result.state.value for result in of.results}
    if isinstance(of, str | os.PathLike):
        of = run("status", "--json", *extra, venv=of, by_python=by_python)
        assert of.exit_code in (0, 1), of.output
    return {patch["id"]: patch["state"] for patch in json.loads(of.stdout)["patches"]}
