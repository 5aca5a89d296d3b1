"""Expected-output builders and command runs shared by the patch unit tests."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from click.testing import CliRunner

from gptoss_patch.cli import app
from tests.support import fakesite


def with_helper(source: str, helper_source: str) -> str:
    """`source` as a codemod leaves it: the patch's helper appended after two blank lines."""
    return textwrap.dedent(source) + "\n\n" + helper_source.lstrip("\n")


def wheel_source(version: str, relpath: str) -> str | None:
    """One file of the real vllm==version wheel (checked against its RECORD), or None if the wheel lacks it."""
    import zipfile

    from tests.support.upstream import read_from_wheel, sources_path

    with zipfile.ZipFile(sources_path(version)) as wheel:
        if relpath not in wheel.namelist():
            return None
    return read_from_wheel(version, relpath).decode()


def status_on_fake_site(
    root: Path, version: str, files: dict[str, str] | None = None, args: tuple[str, ...] = ()
) -> dict[str, tuple[str, str]]:
    """`gptoss-patch status --json` on a fake vllm `version`: {id: (state, reason)}.

    The site is tests/support/fakesite.py's (0.17.1-shaped snippets) with `files` added or replaced,
    their paths relative to the vllm package.
    """
    fakesite.build(root, version, {f"vllm/{rel}": text for rel, text in (files or {}).items()})
    result = CliRunner().invoke(app, ["status", "--venv", str(root), "--json", *args])
    assert result.exit_code in (0, 1), result.output
    return {p["id"]: (p["state"], p["reason"]) for p in json.loads(result.stdout)["patches"]}


def listed(patch_id: str) -> str:
    """The note `gptoss-patch list --json` shows users for one patch."""
    result = CliRunner().invoke(app, ["list", "--json"])
    assert result.exit_code == 0, result.output
    return next(p["note"] for p in json.loads(result.stdout) if p["id"] == patch_id)
