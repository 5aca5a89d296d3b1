"""GPU profiles, detection and CUDA-graph capture sizes, keyed by what the real release supports (its recorded facts,
tests/launcher/recorded.py; the capture sizes against each wheel's own code)."""

from __future__ import annotations

import ast
import subprocess
import types

import pytest

from gptoss_patch.errors import UsageError
from gptoss_patch.launcher import profiles, static
from gptoss_patch.versions import KNOWN_RELEASES
from tests.launcher.recorded import facts
from tests.support import measured
from tests.support.fakes import install_fake_nvidia_smi
from tests.support.upstream import read_from_wheel


def caps_of(version: str) -> static.Capabilities:
    """What the real static readers read from the `version` wheel, recorded (tests/launcher/facts/, compared with the
    wheels in the slow tier)."""
    return facts(version).capabilities


def test_default_capture_sizes_are_the_83_of_g20():
    sizes = profiles.default_capture_sizes()
    assert len(sizes) == 83
    assert sizes[:5] == [1, 2, 4, 8, 16] and sizes[-3:] == [992, 1008, 1024]
    assert 5 not in sizes and 10 not in sizes


def vllm_gpt_oss_capture_sizes(version: str) -> tuple[int, list[int]]:
    """vLLM's own default capture sizes for gpt-oss in `version`, computed by that release's own code.

    The maximum is the constant GptOssForCausalLMConfig assigns (models/config.py); the list is what the
    default branch of VllmConfig._set_cudagraph_sizes (config/vllm.py) builds for it, run as written, with
    VllmConfig's own default performance_mode and a max_num_batched_tokens above the maximum (8192, a GPU's).
    """
    models = ast.parse(read_from_wheel(version, "vllm/model_executor/models/config.py"))
    (gpt_oss,) = [n for n in ast.walk(models) if isinstance(n, ast.ClassDef) and n.name == "GptOssForCausalLMConfig"]
    (maximum,) = [n.value.value for n in ast.walk(gpt_oss) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
                  and any(isinstance(t, ast.Attribute) and t.attr == "max_cudagraph_capture_size" for t in n.targets)]
    config = ast.parse(read_from_wheel(version, "vllm/config/vllm.py"))
    (vllm_config,) = [n for n in config.body if isinstance(n, ast.ClassDef) and n.name == "VllmConfig"]
    defaults = {n.target.id: ast.literal_eval(n.value) for n in vllm_config.body
                if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and isinstance(n.value, ast.Constant)}
    (method,) = [n for n in vllm_config.body if isinstance(n, ast.FunctionDef) and n.name == "_set_cudagraph_sizes"]
    (branch,) = [n for n in ast.walk(method) if isinstance(n, ast.If)
                 and ast.unparse(n.test) == "self.compilation_config.cudagraph_capture_sizes is not None" and n.orelse
                 and "cudagraph_capture_sizes" in {t.id for s in n.orelse for t in ast.walk(s) if isinstance(t, ast.Name)}]
    scope = {"self": types.SimpleNamespace(performance_mode=defaults.get("performance_mode")),
             "max_cudagraph_capture_size": maximum, "max_num_tokens": 8192, "uniform_decode_sizes": []}
    exec(compile(ast.Module(body=branch.orelse, type_ignores=[]), f"vllm-{version}/config/vllm.py", "exec"), scope)  # noqa: S102
    return maximum, scope["cudagraph_capture_sizes"]


@pytest.mark.upstream
@pytest.mark.parametrize("version", [str(v) for v in KNOWN_RELEASES])
def test_default_capture_sizes_are_vllms_own_for_gpt_oss(version):
    """The list the profile adds --concurrency to is the one the release itself would capture for gpt-oss (G20)."""
    maximum, sizes = vllm_gpt_oss_capture_sizes(version)
    assert maximum == profiles.MAX_CAPTURE_SIZE
    assert profiles.default_capture_sizes() == sizes, f"vLLM {version}: {len(sizes)} sizes {sizes}"


def test_concurrency_adds_only_the_missing_sizes():
    setting = profiles.capture_sizes_setting((1, 5, 10), caps_of("0.17.1"))
    assert setting.name == "--cudagraph-capture-sizes"
    assert [int(v) for v in setting.values] == sorted({*profiles.default_capture_sizes(), 5, 10})
    assert "5, 10" in setting.why and "G20" in setting.why


@pytest.mark.parametrize("text", ["", "5,,10", "five", "0", "-3", "1,2000", "1.5"])
def test_bad_concurrency_is_one_usage_error(text):
    with pytest.raises(UsageError, match=r"^--concurrency .*: expected comma-separated batch sizes from 1 to 1024"):
        profiles.parse_concurrency(text)


def test_concurrency_is_sorted_and_deduplicated():
    assert profiles.parse_concurrency("10,5,5,1") == (1, 5, 10)


def test_unknown_profile_names_the_choices():
    with pytest.raises(UsageError, match=r"^unknown GPU profile 'sm999'; choose one of sm90, sm100, sm120, sm121, cpu$"):
        profiles.choose_gpu("sm999")


@pytest.mark.parametrize(("output", "profile"), [("12.1\n", "sm121"), ("9.0\n9.0\n", "sm90"), ("10.0\n", "sm100"), ("12.0\n", "sm120")])
def test_detection_reads_nvidia_smi(tmp_path, monkeypatch, output, profile):
    install_fake_nvidia_smi(tmp_path / "bin", output)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    choice = profiles.choose_gpu(None)
    assert (choice.profile, choice.detected) == (profile, True)
    assert choice.source == f"nvidia-smi: compute capability {output.split()[0]}"


@pytest.mark.parametrize(
    ("output", "code", "message"),
    [
        ("8.9\n", 0, "compute capability 8.9 has no gpt-oss profile"),
        ("9.0\n12.1\n", 0, "nvidia-smi reports 12.1, 9.0; pass --gpu"),
        ("", 9, "nvidia-smi failed: no output"),
    ],
)
def test_detection_refuses_what_it_cannot_map(tmp_path, monkeypatch, output, code, message):
    install_fake_nvidia_smi(tmp_path / "bin", output, code)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    with pytest.raises(UsageError, match=message):
        profiles.choose_gpu(None)


def test_no_nvidia_smi_means_the_cpu_profile_announced_as_a_fallback():
    choice = profiles.choose_gpu(None)
    assert (choice.profile, choice.detected, choice.source) == ("cpu", False, "no nvidia-smi on PATH")


def test_an_explicit_profile_never_runs_nvidia_smi():
    def refuse(*_args, **_kwargs) -> subprocess.CompletedProcess:
        raise AssertionError("nvidia-smi was run")

    assert profiles.choose_gpu("sm121", run=refuse).profile == "sm121"


def settings_of(result: profiles.ProfileResult) -> dict[str, tuple[str, ...]]:
    return {s.name: s.values for s in result.settings}


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("0.17.1", {"VLLM_MXFP4_USE_MARLIN": ("1",), "--kv-cache-dtype": ("fp8",), "--gpu-memory-utilization": ("0.85",)}),
        ("0.33.0", {"--moe-backend": ("marlin",), "--kv-cache-dtype": ("fp8",), "--gpu-memory-utilization": ("0.85",)}),
    ],
    ids=["vllm-0.17.1", "vllm-0.33.0"],
)
def test_sm121_pins_marlin_the_way_the_installed_version_reads_it(version, expected):
    result = profiles.profile_settings("sm121", caps_of(version))
    assert settings_of(result) == expected
    assert result.moe_pin is not None and result.moe_pin.name in expected
    assert all("G14" in s.why or "G17" in s.why or "FP8" in s.why for s in result.settings)


def test_sm120_has_no_gb10_memory_cap():
    assert "--gpu-memory-utilization" not in settings_of(profiles.profile_settings("sm120", caps_of("0.17.1")))


@pytest.mark.parametrize(
    ("version", "env_set", "note"),
    [
        ("0.17.1", True, None),
        ("0.22.1", False, "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8 not set: deprecated in vLLM 0.22.1"),
        ("0.33.0", False, "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8 not set: vLLM 0.33.0 does not read it (removed in 0.24; G15)"),
    ],
    ids=["vllm-0.17.1", "vllm-0.22.1", "vllm-0.33.0"],
)
def test_sm100_sets_the_flashinfer_mxfp4_variable_only_where_vllm_reads_it(version, env_set, note):
    result = profiles.profile_settings("sm100", caps_of(version))
    assert ("VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8" in settings_of(result)) is env_set
    if note:
        assert any(n.startswith(note) for n in result.notes)


def test_cpu_leaves_vllm_to_choose():
    result = profiles.profile_settings("cpu", caps_of("0.33.0"))
    assert result.settings == () and result.moe_pin is None


def test_hopper_leaves_the_moe_kernel_to_vllm_and_says_what_fast_moe_would_trade():
    result = profiles.profile_settings("sm90", caps_of("0.33.0"))
    assert result.settings == () and result.moe_pin is None
    (note,) = result.notes
    assert note.startswith("MXFP4 MoE kernel left to vLLM (Triton on Hopper)")
    # the figures docs/performance.md measured (its tables, not a copy of the code's constants)
    speed_20b, speed_120b, error = measured.one_stream_speedup_20b(), measured.one_stream_speedup_120b(), measured.marlin_error_ratio()
    assert f"--fast-moe pins Marlin: faster ({speed_20b}× generation at one stream on the 20b shape" in note, note
    assert f"{speed_120b}× on 120b at TP=1 on an H200" in note, note
    assert f"{error}× the kernel error against float64" in note and "not reproducible run to run" in note, note


@pytest.mark.parametrize("version", ["0.22.1", "0.33.0"])
def test_fast_moe_takes_marlin_on_hopper_where_the_mxfp4_selector_honours_the_flag(version):
    result = profiles.profile_settings("sm90", caps_of(version), fast_moe=True)
    assert [list(s.argv) for s in result.settings] == [["--moe-backend", "marlin"]] and result.notes == ()
    why = result.settings[0].why
    assert why.startswith("--fast-moe: Marlin's MXFP4 MoE kernel") and profiles.MARLIN_SPEED in why
    assert profiles.MARLIN_ERROR in why and "docs/performance.md" in why
    assert result.moe_pin is None  # a speed choice, not a correctness pin: the log is reported, not enforced


def test_fast_moe_on_hopper_leaves_the_choice_to_vllm_where_the_flag_is_ignored():
    result = profiles.profile_settings("sm90", caps_of("0.17.1"), fast_moe=True)  # --moe-backend ignored for MXFP4
    assert result.settings == ()
    assert result.notes == ("--fast-moe: MXFP4 MoE backend left to vLLM: 0.17.1's MXFP4 selector does not take --moe-backend marlin",)


@pytest.mark.parametrize("profile", ["sm120", "sm121"])
def test_fast_moe_changes_nothing_on_sm12x_and_says_so(profile):
    caps = caps_of("0.33.0")
    plain, fast = profiles.profile_settings(profile, caps), profiles.profile_settings(profile, caps, fast_moe=True)
    assert fast.settings == plain.settings and fast.moe_pin == plain.moe_pin is not None
    assert fast.notes == (*plain.notes, f"--fast-moe changes nothing on {profile}: Marlin is already pinned, "
                          "the only MXFP4 MoE kernel stock vLLM has on SM12x")  # fmt: skip


def test_fast_moe_changes_nothing_off_hopper_and_sm12x():
    result = profiles.profile_settings("cpu", caps_of("0.33.0"), fast_moe=True)
    assert result.settings == () and result.notes == ("--fast-moe changes nothing on cpu: it pins Marlin on sm90 (Hopper) only",)
