"""Expected-output builders and command runs shared by the patch unit tests."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable
from pathlib import Path

from click.testing import CliRunner
from packaging.version import Version

from gptoss_patch import engine
from gptoss_patch.cli import app
from gptoss_patch.spec import PatchSpec, Selection
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


def round_trip_on_the_real_file(spec: PatchSpec, is_applied: Callable[[str, object], bool], version: str, tmp_path: Path) -> None:
    """One patch alone on the real file of the vllm==version wheel: apply changes it and leaves it applied (by the
    patch's own detector and by `status`) and compilable, a second apply changes nothing, revert restores the wheel's
    bytes."""
    from tests.support.golden import extracted

    inst = extracted(Version(version), tmp_path)
    only = Selection(only=(spec.id,))
    band = spec.band_for(Version(version))
    assert band is not None, f"{spec.id} has no band for {version}"
    path = inst.site_packages / "vllm" / band.target
    stock = path.read_bytes()
    assert engine.apply(inst, only).results[0].changed
    assert is_applied(path.read_text(), None)
    compile(path.read_text(), str(path), "exec")  # the patched file is still Python
    assert not engine.apply(inst, only).results[0].changed
    assert engine.status(inst, only).results[0].state.value == "applied"
    engine.revert(inst, only)
    assert path.read_bytes() == stock
