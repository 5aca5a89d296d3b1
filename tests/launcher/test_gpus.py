"""launcher/gpus.py, the one reader of this host's GPUs: what nvidia-smi lists, what CUDA_VISIBLE_DEVICES leaves
visible, and the profile the visible GPUs get (profiles.detect_gpu reads the same answer). Every GPU here is a fake
`nvidia-smi` on PATH (tests/support/fakes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gptoss_patch.errors import UsageError
from gptoss_patch.launcher import gpus, profiles
from tests.support.fakes import install_fake_nvidia_smi

H100 = "NVIDIA H100 80GB HBM3, 9.0, 81559"
GB10 = "NVIDIA GB10, 12.1, [N/A]"
L40S = "NVIDIA L40S, 8.9, 46068"


def smi(*models: str) -> str:
    """nvidia-smi's csv for GPUs 0..n-1 of the given models (index, uuid, name, compute_cap, memory.total)."""
    return "".join(f"{i}, GPU-{i:04d}aaaa-bbbb, {model}\n" for i, model in enumerate(models))


def host(tmp_path: Path, output: str, returncode: int = 0, **env: str) -> dict[str, str]:
    install_fake_nvidia_smi(tmp_path / "smi-bin", output, returncode)
    return {"PATH": f"{tmp_path / 'smi-bin'}:/usr/bin:/bin", **env}


def test_nvidia_smi_and_cuda_visible_devices(tmp_path):
    hardware = gpus.inventory(host(tmp_path, smi(H100, H100, H100), CUDA_VISIBLE_DEVICES="2,GPU-0000"))
    assert hardware is not None and [g.index for g in hardware.visible] == [2, 0]
    assert hardware.gpus[0].memory_mib == 81559 and hardware.gpus[0].capability == "9.0"


def test_cuda_hides_everything_after_an_entry_it_cannot_resolve(tmp_path):
    hardware = gpus.inventory(host(tmp_path, smi(H100, H100), CUDA_VISIBLE_DEVICES="1,7,0"))
    assert hardware is not None and [g.index for g in hardware.visible] == [1] and hardware.invalid == "7"


def test_no_nvidia_smi_means_nothing_to_check():
    assert gpus.inventory({"PATH": "/nonexistent"}) is None


def test_unified_memory_reports_no_total():
    listed, problem = gpus.parse_gpus(smi(GB10))
    assert problem is None and listed[0].memory_mib is None and listed[0].memory_gib is None


@pytest.mark.parametrize(
    ("models", "env", "profile", "capability"),
    [
        ((GB10,), {}, "sm121", "12.1"),
        ((H100, H100), {}, "sm90", "9.0"),
        # Was: the profile read every GPU nvidia-smi lists, the G33-G38 checks only the visible ones, so a host with an
        # L40S beside the H100 a server is given could not be served without --gpu.
        ((L40S, H100), {"CUDA_VISIBLE_DEVICES": "1"}, "sm90", "9.0"),
        # A selection that leaves no GPU falls back to what nvidia-smi lists; the `gpus` check says why none is visible.
        ((H100,), {"CUDA_VISIBLE_DEVICES": "7"}, "sm90", "9.0"),
    ],
)
def test_the_profile_is_the_visible_gpus(tmp_path, models, env, profile, capability):
    choice = profiles.detect_gpu(environ=host(tmp_path, smi(*models), **env))
    assert (choice.profile, choice.detected, choice.source) == (profile, True, f"nvidia-smi: compute capability {capability}")


@pytest.mark.parametrize(
    ("output", "code", "env", "message"),
    [
        (smi(L40S), 0, {}, r"^compute capability 8\.9 has no gpt-oss profile; pass --gpu "),
        (smi(H100, GB10), 0, {}, r"^nvidia-smi reports 12\.1, 9\.0; pass --gpu "),
        ("", 0, {}, r"^nvidia-smi reports no GPU; pass --gpu "),
        ("", 9, {}, r"^nvidia-smi failed: no output; pass --gpu to choose a profile$"),
        ("9.0\n", 0, {}, r"^unexpected nvidia-smi line '9\.0'; pass --gpu to choose a profile$"),
    ],
)
def test_detection_refuses_what_it_cannot_map_with_one_line(tmp_path, output, code, env, message):
    with pytest.raises(UsageError, match=message):
        profiles.detect_gpu(environ=host(tmp_path, output, code, **env))
