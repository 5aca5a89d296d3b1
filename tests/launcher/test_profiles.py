"""GPU profiles, detection and CUDA-graph capture sizes, keyed by what the real release supports (its recorded facts,
tests/launcher/recorded.py; the capture sizes against each wheel's own code)."""

from __future__ import annotations

import ast
import dataclasses
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


def vllm_gpt_oss_capture_sizes(version: str, maximum_given: int | None = None) -> tuple[int, list[int]]:
    """vLLM's own default capture sizes for gpt-oss in `version`, computed by that release's own code.

    The maximum is the constant GptOssForCausalLMConfig assigns (models/config.py); the list is what the
    default branch of VllmConfig._set_cudagraph_sizes (config/vllm.py) builds for it, run as written, with
    VllmConfig's own default performance_mode and a max_num_batched_tokens above the maximum (8192, a GPU's).
    `maximum_given`: the list for that --max-cudagraph-capture-size instead (the gpt-oss hook then stays out).
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
             "max_cudagraph_capture_size": maximum_given or maximum, "max_num_tokens": 8192, "uniform_decode_sizes": []}
    exec(compile(ast.Module(body=branch.orelse, type_ignores=[]), f"vllm-{version}/config/vllm.py", "exec"), scope)  # noqa: S102
    return maximum, scope["cudagraph_capture_sizes"]


@pytest.mark.upstream
@pytest.mark.parametrize("version", [str(v) for v in KNOWN_RELEASES])
def test_default_capture_sizes_are_vllms_own_for_gpt_oss(version):
    """The list the profile adds --concurrency to is the one the release itself would capture for gpt-oss (G20)."""
    maximum, sizes = vllm_gpt_oss_capture_sizes(version)
    assert maximum == profiles.MAX_CAPTURE_SIZE
    assert profiles.default_capture_sizes() == sizes, f"vLLM {version}: {len(sizes)} sizes {sizes}"


@pytest.mark.upstream
@pytest.mark.parametrize("version", ["0.15.1", "0.20.2", "0.33.0"])
def test_the_list_up_to_2048_is_vllms_own(version):
    """What the sm90 profile's --max-cudagraph-capture-size 2048 makes the release capture, by its own code."""
    _, sizes = vllm_gpt_oss_capture_sizes(version, profiles.PROMPT_CAPTURE_SIZE)
    assert profiles.default_capture_sizes(profiles.PROMPT_CAPTURE_SIZE) == sizes, f"vLLM {version}: {sizes}"


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


def test_detection_reads_nvidia_smi_through_the_one_gpu_reader(tmp_path, monkeypatch):
    # choose_gpu(None) asks launcher/gpus.py (tests/launcher/test_gpus.py has the cases), with this process's PATH.
    install_fake_nvidia_smi(tmp_path / "bin", "0, GPU-0000aaaa-bbbb, NVIDIA GB10, 12.1, [N/A]\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    choice = profiles.choose_gpu(None)
    assert (choice.profile, choice.detected, choice.source) == ("sm121", True, "nvidia-smi: compute capability 12.1")


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
    assert [s.argv for s in result.settings] == [("--max-cudagraph-capture-size", "2048")] and result.moe_pin is None
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
    assert [list(s.argv) for s in result.settings] == [["--moe-backend", "marlin"], ["--max-cudagraph-capture-size", "2048"]]
    assert result.notes == ()
    why = result.settings[0].why
    assert why.startswith("--fast-moe: Marlin's MXFP4 MoE kernel") and profiles.MARLIN_SPEED in why
    assert profiles.MARLIN_ERROR in why and "docs/performance.md" in why
    assert result.moe_pin is None  # a speed choice, not a correctness pin: the log is reported, not enforced


def test_fast_moe_on_hopper_leaves_the_choice_to_vllm_where_the_flag_is_ignored():
    result = profiles.profile_settings("sm90", caps_of("0.17.1"), fast_moe=True)  # --moe-backend ignored for MXFP4
    assert [s.name for s in result.settings] == ["--max-cudagraph-capture-size"]
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


# -- the prompt batches' capture sizes (the recipe's 2048) ------------------------------------------------------


def without_flag(caps: static.Capabilities, flag: str) -> static.Capabilities:
    return dataclasses.replace(caps, flags=static.FlagRegistry(caps.flags.flags - {flag}))


@pytest.mark.parametrize("version", ["0.15.1", "0.20.2", "0.33.0"])
def test_hopper_captures_prompt_batches_up_to_the_recipes_2048(version):
    """The flag every recorded release registers; the why says what it buys, what it costs and the way back."""
    (setting,) = profiles.profile_settings("sm90", caps_of(version)).settings
    assert setting.argv == ("--max-cudagraph-capture-size", "2048")
    assert "recipe" in setting.why and "start-up time" in setting.why and "graph memory" in setting.why
    assert "vLLM's choice back: --max-cudagraph-capture-size 1024 after --" in setting.why and "G20" in setting.why


def test_a_release_without_the_maximum_flag_gets_a_note_never_a_guess():
    result = profiles.profile_settings("sm90", without_flag(caps_of("0.20.2"), "--max-cudagraph-capture-size"))
    assert result.settings == ()
    assert "CUDA-graph capture sizes left to vLLM: vLLM 0.20.2 has no --max-cudagraph-capture-size" in result.notes


@pytest.mark.parametrize("profile", ["sm100", "sm120", "sm121", "cpu"])
def test_only_hopper_raises_the_capture_maximum(profile):
    """Measured on Hopper only (docs/performance.md): elsewhere vLLM's 1024 for gpt-oss stays."""
    settings = profiles.profile_settings(profile, caps_of("0.33.0")).settings
    assert not any(s.name == "--max-cudagraph-capture-size" for s in settings)
    assert profiles.capture_ceiling(settings) == profiles.MAX_CAPTURE_SIZE


def test_vllms_list_up_to_2048_and_cut_at_the_batched_tokens():
    """VllmConfig._set_cudagraph_sizes' default list (config/vllm.py, 0.20.2): step 16 from 256, ending on
    max_num_batched_tokens when that is below the maximum."""
    sizes = profiles.default_capture_sizes(2048)
    assert len(sizes) == 147 and sizes[-2:] == [2032, 2048]
    assert profiles.default_capture_sizes(2048, batched_tokens=8192) == sizes
    cut = profiles.default_capture_sizes(2048, batched_tokens=1500)
    assert cut[-3:] == [1472, 1488, 1500] and max(cut) == 1500


def test_concurrency_list_runs_to_the_profiles_maximum():
    caps = caps_of("0.20.2")
    setting = profiles.capture_sizes_setting((1, 5), caps, 2048)
    assert [int(v) for v in setting.values] == sorted({*profiles.default_capture_sizes(2048), 5})
    assert "up to 2048 so that prompt passes replay graphs too" in setting.why
    assert "--max-cudagraph-capture-size 1024 after --" in setting.why


def hopper_settings(version: str = "0.20.2") -> list:
    return list(profiles.profile_settings("sm90", caps_of(version)).settings)


def test_concurrency_replaces_the_maximum_with_a_list_to_2048():
    """vLLM refuses a maximum that differs from the list's last size: the list alone goes, and it carries 2048."""
    from gptoss_patch.launcher import plan as planning

    ours = hopper_settings()
    (listed,) = planning._capture_sizes((1, 5), caps_of("0.20.2"), (), 1, profiles.capture_ceiling(ours))
    assert listed.values[-1] == "2048" and "5" in listed.values
    assert planning._fit_prompt_capture(ours, True, ()) == ([], [])


def test_concurrency_list_stops_at_the_batched_tokens_given_after_dashes():
    from gptoss_patch.launcher import plan as planning

    (listed,) = planning._capture_sizes((1, 16), caps_of("0.20.2"), ("--max-num-batched-tokens", "1024"), 1, 2048)
    assert listed.values[-1] == "1024"


def test_the_way_back_caps_the_concurrency_list_at_vllms_1024():
    from gptoss_patch.launcher import plan as planning

    (listed,) = planning._capture_sizes((1, 5), caps_of("0.20.2"), ("--max-cudagraph-capture-size", "1024"), 1, 2048)
    assert listed.values[-1] == "1024"


@pytest.mark.parametrize("maximum", ["1000", "512", "1024"])
def test_a_maximum_given_after_dashes_ends_the_concurrency_list(maximum):
    # Was: --max-cudagraph-capture-size 1000 with --concurrency gave a list ending at 992 (vLLM's grid), which vLLM
    # refuses beside a maximum of 1000.
    from gptoss_patch.launcher import plan as planning

    (listed,) = planning._capture_sizes((1, 5), caps_of("0.20.2"), ("--max-cudagraph-capture-size", maximum), 1, 2048)
    assert listed.values[-1] == maximum and "5" in listed.values and len(set(listed.values)) == len(listed.values)


@pytest.mark.parametrize("given", [
    ("--cudagraph-capture-sizes", "1", "2", "4"),
    ("--compilation-config", '{"cudagraph_capture_sizes": [1, 2, 4]}'),
    ("--compilation-config", '{"max_cudagraph_capture_size": 512}'),
    ("-cc.max_cudagraph_capture_size=512",),
])  # fmt: skip
def test_capture_sizes_given_after_dashes_win_over_the_profiles_maximum(given):
    from gptoss_patch.launcher import plan as planning

    kept, notes = planning._fit_prompt_capture(hopper_settings(), False, given)
    assert kept == [] and notes == ["--max-cudagraph-capture-size 2048 left out: CUDA-graph capture sizes given after --"]


def test_unrelated_arguments_keep_the_profiles_maximum():
    from gptoss_patch.launcher import plan as planning

    ours = hopper_settings()
    assert planning._fit_prompt_capture(ours, False, ("--max-num-seqs", "8")) == (ours, [])


def test_batched_tokens_within_vllms_1024_leave_the_maximum_out():
    """The 120b at TP=1 on an 80 GB H100 plans --max-num-batched-tokens 1024 (G37): no batch reaches 2048."""
    from gptoss_patch.launcher import plan as planning

    kept, notes = planning._fit_prompt_capture(hopper_settings(), False, (), 1024)
    assert kept == [] and notes == ["--max-cudagraph-capture-size 2048 left out: --max-num-batched-tokens 1024 keeps "
                                    "every batch within vLLM's 1024 for gpt-oss"]
    assert planning._fit_prompt_capture(hopper_settings(), False, (), 8192)[0] == hopper_settings()


def test_the_120b_at_tp1_on_an_h100_keeps_vllms_maximum(tmp_path):
    """The plan's --max-num-batched-tokens 1024 there (G37) is what resolve() hands _fit_prompt_capture."""
    from gptoss_patch.launcher import plan as planning

    install_fake_nvidia_smi(tmp_path / "bin", "0, GPU-0000aaaa-bbbb, NVIDIA H100 80GB HBM3, 9.0, 81559\n")
    environ = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"}
    opts = planning.launch_options("openai/gpt-oss-120b", gpu="sm90")
    caps = caps_of("0.20.2")
    planned, _ = planning._parallel_settings(planning.parallel_context(opts, environ), opts, caps)
    batched = planning._batched_tokens([a for s in planned if s.kind == "flag" for a in s.argv])
    assert batched == 1024
    kept, notes = planning._fit_prompt_capture(hopper_settings(), False, (), batched)
    assert kept == [] and notes[0].startswith("--max-cudagraph-capture-size 2048 left out: --max-num-batched-tokens 1024")
