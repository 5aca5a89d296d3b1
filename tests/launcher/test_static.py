"""The static readers against the real files of the real wheels (docs/vllm-layouts.md is the oracle).

What the readers read from each release is recorded in tests/launcher/facts/ (scripts/record_launch_facts.py runs
them on the wheel's files; tests/launcher/test_recorded.py regenerates and compares in the slow tier), so the claims
about what they find are checked here on those facts, offline. The cache and the call count read the real files
(`static_installs`, marker `upstream`).
"""

from __future__ import annotations

import pytest

from gptoss_patch.launcher import static
from gptoss_patch.launcher.profiles import marlin_pin_spelling
from tests.launcher.recorded import facts, recorded_releases

# Key counts of `environment_variables` per release (docs/vllm-layouts.md#envspy-the-environment-registry).
ENV_KEY_COUNTS = {"0.15.1": 228, "0.16.0": 218, "0.17.1": 232, "0.18.0": 233, "0.22.1": 266, "0.23.0": 268, "0.33.0": 318}


def caps_of(version: str) -> static.Capabilities:
    """read_capabilities' answer on the real files of the `version` wheel, as recorded."""
    return facts(version).capabilities


@pytest.mark.parametrize("version", list(ENV_KEY_COUNTS), ids=lambda v: f"vllm-{v}")
def test_env_registry_has_every_key_of_the_dict_not_the_type_checking_subset(version):
    registry = caps_of(version).env
    assert len(registry.names) == ENV_KEY_COUNTS[version]
    assert "VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS" in registry.names


@pytest.mark.parametrize("version", recorded_releases(), ids=lambda v: f"vllm-{v}")
def test_no_release_has_the_folklore_names(version):
    """G15 and D2: VLLM_MXFP4_BACKEND and --mxfp4-backend / --mxfp4-layers are in no stock release (all 27 recorded)."""
    caps = caps_of(version)
    assert "VLLM_MXFP4_BACKEND" not in caps.env.names
    assert not caps.flags.accepts("--mxfp4-backend") and not caps.flags.accepts("--mxfp4-layers")


@pytest.mark.parametrize(
    ("version", "marlin_var", "deprecated"),
    [("0.17.1", True, 0), ("0.22.1", True, 11), ("0.23.0", True, 11), ("0.33.0", False, 0)],
    ids=lambda v: f"vllm-{v}" if isinstance(v, str) else None,
)
def test_deprecated_wrappers_are_read_with_vllms_own_replacement_text(version, marlin_var, deprecated):
    registry = caps_of(version).env
    assert ("VLLM_MXFP4_USE_MARLIN" in registry.names) is marlin_var
    assert len(registry.deprecated) == deprecated
    if deprecated:
        assert "--moe-backend marlin" in registry.deprecated["VLLM_MXFP4_USE_MARLIN"]


@pytest.mark.parametrize(
    ("version", "present", "absent"),
    [
        ("0.15.1", ("--attention-backend", "--cudagraph-capture-sizes", "--stream-interval"), ("--moe-backend", "--fail-on-environ-validation")),
        ("0.17.1", ("--moe-backend", "--fail-on-environ-validation"), ("--linear-backend", "--quantization-config")),
        ("0.22.1", ("--linear-backend", "--quantization-config"), ()),
        ("0.33.0", ("--moe-backend", "--linear-backend", "--grpc"), ()),
    ],
    ids=lambda v: f"vllm-{v}" if isinstance(v, str) else None,
)
def test_engine_flags_come_from_add_argument_calls(version, present, absent):
    flags = caps_of(version).flags
    assert all(flags.accepts(flag) for flag in present)
    assert not any(flags.accepts(flag) for flag in absent)
    assert not flags.accepts("--mxfp4-backend") and not flags.accepts("--mxfp4-layers")  # in no release (D2)


@pytest.mark.parametrize("version", ["0.17.1", "0.33.0"], ids=lambda v: f"vllm-{v}")
def test_frontend_flags_come_from_the_dataclass_fields_wherever_it_lives(version):
    expected_file = {"0.17.1": "entrypoints/openai/cli_args.py", "0.33.0": "entrypoints/common/cli_args.py"}[version]
    assert facts(version).frontend_file == expected_file
    flags = caps_of(version).flags
    for flag in ("--tool-call-parser", "--enable-auto-tool-choice", "--no-enable-auto-tool-choice", "--api-key", "--host", "--headless", "-asc"):
        assert flags.accepts(flag), flag
    assert not flags.accepts("--no-tool-call-parser")  # not a bool field


@pytest.mark.parametrize("version", ["0.17.1", "0.33.0"], ids=lambda v: f"vllm-{v}")
def test_no_forms_exist_only_for_boolean_options(version):
    flags = caps_of(version).flags
    assert flags.accepts("--no-enforce-eager")  # **model_kwargs["enforce_eager"], a bool field
    assert flags.accepts("--no-enable-prefix-caching")  # **{**cache_kwargs[...], "default": None}
    assert flags.accepts("--no-enable-lora")  # explicit BooleanOptionalAction
    assert not flags.accepts("--no-kv-cache-dtype")


@pytest.mark.parametrize(
    "spelling",
    ["--kv_cache_dtype", "--kv-cache-dtype=fp8", "--compilation-config.cudagraph_capture_sizes", "--compilation_config.mode", "-O3", "-q", "--help"],
)
def test_flexible_argument_parser_spellings_are_accepted(spelling):
    assert caps_of("0.17.1").flags.accepts(spelling)


def test_did_you_mean_for_a_misspelt_flag():
    assert caps_of("0.17.1").flags.close_matches("--enable-expert-paralel") == ["--enable-expert-parallel"]


@pytest.mark.parametrize(
    ("version", "reads_marlin_env", "honours_flag", "pin"),
    [
        ("0.15.1", True, False, ("env", "VLLM_MXFP4_USE_MARLIN", "1")),
        ("0.17.1", True, False, ("env", "VLLM_MXFP4_USE_MARLIN", "1")),  # the flag exists but MXFP4 ignores it
        ("0.18.0", True, False, ("env", "VLLM_MXFP4_USE_MARLIN", "1")),
        ("0.22.1", True, True, ("flag", "--moe-backend", "marlin")),
        ("0.33.0", False, True, ("flag", "--moe-backend", "marlin")),
    ],
    ids=lambda v: f"vllm-{v}" if isinstance(v, str) else None,
)
def test_the_mxfp4_selector_decides_how_marlin_is_pinned(version, reads_marlin_env, honours_flag, pin):
    caps = caps_of(version)
    assert ("VLLM_MXFP4_USE_MARLIN" in caps.moe.env_reads) is reads_marlin_env
    assert caps.moe.honours_moe_backend is honours_flag
    assert marlin_pin_spelling(caps) == pin


def test_moe_backend_choices_come_from_the_literal():
    assert caps_of("0.17.1").moe.choices == (
        "auto", "triton", "deep_gemm", "cutlass", "flashinfer_trtllm", "flashinfer_cutlass", "flashinfer_cutedsl", "marlin", "aiter",
    )  # fmt: skip
    assert caps_of("0.15.1").moe.choices == ()  # no --moe-backend before 0.17


def test_capabilities_are_cached_per_file_state(static_installs, tmp_path, monkeypatch):
    inst = static_installs["0.17.1"]
    first = static.read_capabilities(inst.package_root, inst.version, cache_dir=tmp_path)
    monkeypatch.setattr(static, "read_flag_registry", lambda _root: pytest.fail("parsed again despite the cache"))
    assert static.read_capabilities(inst.package_root, inst.version, cache_dir=tmp_path) == first


def test_a_changed_file_is_parsed_again(static_installs, tmp_path):
    site = tmp_path / "site-packages"
    inst = static_installs["0.17.1"]
    for rel in static.STATIC_FILES:
        source = inst.package_root / rel
        if source.exists():
            (site / "vllm" / rel).parent.mkdir(parents=True, exist_ok=True)
            (site / "vllm" / rel).write_bytes(source.read_bytes())
    envs = site / "vllm" / static.ENVS_FILE
    before = static.read_capabilities(site / "vllm", inst.version, cache_dir=tmp_path / "cache")
    envs.write_text(envs.read_text().replace('"VLLM_HOST_IP":', '"VLLM_HOST_IP_RENAMED":'))
    after = static.read_capabilities(site / "vllm", inst.version, cache_dir=tmp_path / "cache")
    assert "VLLM_HOST_IP" in before.env.names and "VLLM_HOST_IP" not in after.env.names


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--seed", "-1", "--enforce-eager"], [("--seed", ("-1",)), ("--enforce-eager", ())]),
        (["--kv_cache_dtype=fp8"], [("--kv-cache-dtype", ("fp8",))]),
        (["--cudagraph-capture-sizes", "1", "2", "-O3"], [("--cudagraph-capture-sizes", ("1", "2")), ("-O3", ())]),
    ],
)
def test_scan_flags_groups_values_with_their_flag(args, expected):
    assert [(use.name, use.values) for use in static.scan_flags(args)] == expected


def test_last_value_follows_argparse_last_one_wins():
    assert static.last_value(["--host", "0.0.0.0", "--host=127.0.0.1"], "--host") == "127.0.0.1"


@pytest.mark.parametrize(("version", "calls"), [("0.15.1", 158), ("0.17.1", 171), ("0.23.0", 204), ("0.33.0", 254)],
                         ids=lambda v: f"vllm-{v}" if isinstance(v, str) else None)
def test_every_add_argument_call_of_arg_utils_is_seen(static_installs, version, calls):
    """The call counts of docs/vllm-layouts.md#serve-flags: no `--flag` registered in arg_utils.py is missed."""
    import ast

    tree = ast.parse((static_installs[version].package_root / static.ARG_UTILS_FILE).read_text())
    with_option = [c for c in static._add_argument_calls(tree) if any(isinstance(a, ast.Constant) and str(a.value).startswith("--") for a in c.args)]
    assert len(with_option) == calls


# CacheConfig.gpu_memory_utilization per release (docs/vllm-layouts.md, "Files the launcher reads").
UTILIZATION_DEFAULTS = {"0.15.1": 0.9, "0.17.1": 0.9, "0.22.1": 0.92, "0.23.0": 0.92, "0.33.0": 0.92}


@pytest.mark.parametrize("version", list(UTILIZATION_DEFAULTS), ids=lambda v: f"vllm-{v}")
def test_the_memory_utilization_default_is_the_releases_own(version):
    # None would silently fall back to 0.9, which is wrong from 0.22 on.
    assert facts(version).default_utilization == UTILIZATION_DEFAULTS[version]


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        ("gpu_memory_utilization: float = 0.9", 0.9),
        ("gpu_memory_utilization: float = Field(default=0.92, gt=0, le=1)", 0.92),
        ("gpu_memory_utilization: float = Field(0.93)", 0.93),
        ("gpu_memory_utilization: float = some_function()", None),
        ("other_field: float = 0.5", None),
    ],
)
def test_the_utilization_default_takes_a_constant_or_a_fields_default(tmp_path, field, expected):
    config = tmp_path / "vllm" / static.CACHE_CONFIG_FILE
    config.parent.mkdir(parents=True)
    config.write_text(f"class CacheConfig:\n    block_size: int = 16\n    {field}\n")
    assert static.read_default_utilization(tmp_path / "vllm") == expected


def test_no_cache_config_file_means_no_default(tmp_path):
    assert static.read_default_utilization(tmp_path / "vllm") is None
