"""What the tests of the user's own patches share (tests/engine/test_userpatches.py, test_userpatch_files.py,
tests/test_wheels.py): the fake site with an envs.py no built-in patch touches, the wheel it came from, edits
and snapshots of its files, a patch file refused at load, and the example plugin's environment."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

from gptoss_patch.target import Installation
from tests.support import fakesite
from tests.support.cli import run

ENVS_REL = "vllm/envs.py"
ENVS = "import os\n\nVLLM_HOST_IP = os.getenv('VLLM_HOST_IP', '')\nVLLM_PORT = None\n"
EXAMPLE = Path(__file__).parents[2] / "examples" / "gptoss-patch-example-plugin"


def build(root: Path) -> Installation:
    """The fake vllm 0.17.1 (tests/support/fakesite.py) with ENVS as its envs.py."""
    return fakesite.build(root, files={ENVS_REL: ENVS})


def wheel_of(inst: Installation, dest: Path) -> Path:
    """A wheel-shaped zip of the pristine fake install (files + its RECORD), as `--from` takes it."""
    with zipfile.ZipFile(dest, "w") as zf:
        for line in inst.record.read_text().splitlines():
            rel = line.split(",")[0]
            if (inst.site_packages / rel).is_file():
                zf.write(inst.site_packages / rel, rel)
    return dest


def edit(inst: Installation, rel: str, old: str, new: str) -> None:
    path = inst.site_packages / rel
    text = path.read_text()
    assert old in text, rel
    path.write_text(text.replace(old, new, 1))


def replace_text(path: Path, old: str, new: str) -> None:
    """Like edit(), for a file of a cloned real install: a new file, never a write through a hardlink."""
    from tests.support.upstream import replace_file

    text = path.read_text()
    assert old in text, path
    replace_file(path, text.replace(old, new, 1).encode())


def snapshot(inst: Installation) -> dict[str, bytes]:
    root = inst.site_packages
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def assert_refused_at_load(inst: Installation, venv: Path, patches: Path, body: str, why: str) -> None:
    """A patch file with `body` makes status, apply and revert exit 2 with `why` in one line, writing nothing."""
    (patches / "bad.diff").write_text("# vllm: ==0.17.1\n" + body)
    before = snapshot(inst)
    for command in ("status", "apply", "revert"):
        result = run(command, "--venv", str(venv), "--patch-dir", str(patches))
        assert result.exit_code == 2, (command, result.stderr)
        assert why in result.stderr.splitlines()[0], result.stderr
    assert snapshot(inst) == before


def plugin_env(tmp_path: Path) -> dict[str, str]:
    """The example package importable, plus a dist-info that declares it and a broken second entry point."""
    dist = tmp_path / "plugins" / "gptoss_example_patches-0.1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: gptoss-example-patches\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text(
        "[gptoss_patch.patches]\n"
        "example_envs_marker = gptoss_example_patches.example_envs_marker\n"
        "broken_one = gptoss_example_patches.no_such_module\n"
    )
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(EXAMPLE / "src"), str(tmp_path / "plugins")])}
