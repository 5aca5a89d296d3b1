"""Pre-flight checks on the recorded facts of vLLM 0.17.1 and 0.33.0 (and 0.16.0, 0.22.1): `recorded`, laid out from
tests/launcher/facts/ (the real readers' output on the real wheels, regenerated and compared in the slow tier by
tests/launcher/test_recorded.py). The few that need an installed vocabulary or an installed hook use `installs` or
`own_install` (real wheels installed --no-deps, marker `upstream`)."""

from __future__ import annotations

import ast
import socket
import zipfile
from pathlib import Path

import pytest
from packaging.version import Version

from gptoss_patch.errors import TargetError, UsageError
from gptoss_patch.launcher import checks, knowledge, preflight, profiles
from gptoss_patch.launcher.results import Status
from tests.launcher.conftest import pending_summary, resolve, rows
from tests.launcher.recorded import facts, recorded_releases
from tests.support import artefacts

VERSIONS = ["0.17.1", "0.33.0"]
ids = [f"vllm-{v}" for v in VERSIONS]


def checks_for(inst, environ=None, **options):
    return checks.run(resolve(inst, environ, **options))


def only(checks, name):
    found = rows(checks, name)
    assert len(found) == 1, found
    return found[0]


# -- environment variables (G15) -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "replacement"), [("0.17.1", "use VLLM_MXFP4_USE_MARLIN=1 instead"), ("0.33.0", "use --moe-backend marlin instead")], ids=ids
)
def test_vllm_mxfp4_backend_fails_with_the_spelling_this_version_reads(recorded, version, replacement):
    check = only(checks_for(recorded[version], {"VLLM_MXFP4_BACKEND": "marlin"}), "env")
    assert check.status is Status.FAIL
    assert check.message == f"VLLM_MXFP4_BACKEND is not a variable vLLM {version} reads (never a stock variable); it would do nothing"
    assert (check.fix, check.issue) == (replacement, "G15")


@pytest.mark.parametrize("version", VERSIONS, ids=ids)
def test_vllm_attention_backend_points_at_the_flag(recorded, version):
    check = only(checks_for(recorded[version], {"VLLM_ATTENTION_BACKEND": "TRITON_ATTN"}), "env")
    assert (check.status, check.fix) == (Status.FAIL, "use --attention-backend TRITON_ATTN instead")


def test_vllm_mxfp4_use_marlin_is_fine_on_0171_and_removed_on_0330(recorded):
    assert only(checks_for(recorded["0.17.1"], {"VLLM_MXFP4_USE_MARLIN": "1"}), "env").status is Status.PASS
    check = only(checks_for(recorded["0.33.0"], {"VLLM_MXFP4_USE_MARLIN": "1"}), "env")
    assert (check.status, check.fix) == (Status.FAIL, "use --moe-backend marlin instead")


UNSET_MARLIN_ENV = "use nothing: unset, automatic selection is the default instead"


@pytest.mark.parametrize(
    ("value", "fix"),
    [("1", "use --moe-backend marlin instead"), (" 1 ", "use --moe-backend marlin instead"), ("2", "use --moe-backend marlin instead"),
     ("0", UNSET_MARLIN_ENV), ("00", UNSET_MARLIN_ENV),
     ("false", "unset VLLM_MXFP4_USE_MARLIN"), ("true", "unset VLLM_MXFP4_USE_MARLIN"), ("", "unset VLLM_MXFP4_USE_MARLIN"),
     ("on", "unset VLLM_MXFP4_USE_MARLIN")],
)  # fmt: skip
def test_the_removed_marlin_variable_is_read_as_the_releases_that_read_it(recorded, value, fix):
    # 0.15.1-0.23 read it with maybe_convert_bool, bool(int(value)) (envs.py); on the 0.17.1 and 0.23.0 wheels 1, " 1 ",
    # 2 were on, 0 and 00 off, and false, true, "" and on raised ValueError: none of those asked for Marlin or for off
    check = only(checks_for(recorded["0.33.0"], {"VLLM_MXFP4_USE_MARLIN": value}), "env")
    assert (check.status, check.fix, check.issue) == (Status.FAIL, fix, "G15")


def test_a_typo_gets_a_did_you_mean(recorded):
    check = only(checks_for(recorded["0.17.1"], {"VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTION": "1"}), "env")
    assert check.status is Status.FAIL
    assert check.message.endswith("did you mean VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS?")


def test_a_deprecated_variable_warns_with_vllms_replacement(recorded):
    inst = recorded.stock("0.22.1")
    check = only(checks_for(inst, {"VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8": "1"}, allow_unpatched=True), "env")
    assert check.status is Status.WARN
    assert check.message == "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8 is deprecated in vLLM 0.22.1"
    assert "--moe-backend flashinfer_trtllm" in check.fix


@pytest.mark.parametrize(("version", "status"), [("0.17.1", Status.WARN), ("0.33.0", Status.FAIL)], ids=ids)
def test_nvfp4_gemm_backend_is_called_what_it_is_for_gpt_oss(recorded, version, status):
    check = only(checks_for(recorded[version], {"VLLM_NVFP4_GEMM_BACKEND": "marlin"}), "env")
    assert check.status is status
    assert "MXFP4 MoE" in (check.message + check.fix)


def test_marlin_atomic_add_does_nothing_for_gpt_oss(recorded):
    check = only(checks_for(recorded["0.17.1"], {"VLLM_MARLIN_USE_ATOMIC_ADD": "1"}), "env")
    assert check.status is Status.WARN and "use_atomic_add=False" in check.message


# Read on the real envs.py of each release: these entries are bool(int(os.getenv(...))) or maybe_convert_bool(...), and
# the 0.17.1, 0.23.0 and 0.33.0 venvs raised ValueError for false/true/on/"" at enable_envs_cache().
@pytest.mark.parametrize(
    ("version", "name", "value"),
    [("0.17.1", "VLLM_MXFP4_USE_MARLIN", "false"), ("0.17.1", "VLLM_MXFP4_USE_MARLIN", "on"),
     ("0.17.1", "VLLM_USE_FLASHINFER_MOE_MXFP4_BF16", "true"), ("0.16.0", "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8", ""),
     ("0.22.1", "VLLM_BATCH_INVARIANT", "false"), ("0.22.1", "VLLM_ENFORCE_STRICT_TOOL_CALLING", "true"),
     ("0.33.0", "VLLM_USE_FLASHINFER_SAMPLER", "yes"), ("0.33.0", "VLLM_BATCH_INVARIANT", "on")],
)  # fmt: skip
def test_a_switch_set_to_a_value_int_refuses_fails_with_the_accepted_values(recorded, version, name, value):
    check = only(checks_for(recorded[version], {name: value}), "env")
    assert check.status is Status.FAIL
    assert check.message == (f"{name}={value!r}: vLLM {version} reads it as bool(int(value)), which refuses {value!r}: "
                             "it stops with ValueError during start-up, at the latest once the model is loaded")
    assert (check.fix, check.issue) == (f"set {name}=1 or 0, or unset it", "G15")


def test_a_deprecated_switch_with_a_refused_value_fails_before_the_deprecation_warning(recorded):
    env = rows(checks_for(recorded["0.22.1"], {"VLLM_MXFP4_USE_MARLIN": "false"}), "env")
    assert [(c.status, c.fix) for c in env][0] == (Status.FAIL, "set VLLM_MXFP4_USE_MARLIN=1 or 0, or unset it")
    assert [(c.status, c.message) for c in env][1:] == [(Status.WARN, "VLLM_MXFP4_USE_MARLIN is deprecated in vLLM 0.22.1")]


@pytest.mark.parametrize(
    ("version", "name", "value"),
    [("0.33.0", "VLLM_MXFP4_USE_MARLIN", "false"),  # removed in 0.24: the unknown-variable row, not a start-up stop
     ("0.17.1", "VLLM_BATCH_INVARIANT", "true"),  # not in 0.17.1's envs.py; batch_invariant.py reads a refused value as off
     ("0.33.0", "VLLM_ENFORCE_STRICT_TOOL_CALLING", "true"),  # 0.24 compares the lower-cased value with true and 1
     ("0.33.0", "VLLM_HUMMING_MOE_GEMM_TYPE", "fp16"),  # 0.21 made it a GEMM type's name
     ("0.17.1", "VLLM_MARLIN_USE_ATOMIC_ADD", "yes")],  # compared with "1", never int()
)  # fmt: skip
def test_no_refused_value_row_where_the_release_does_not_read_it_as_a_switch(recorded, version, name, value):
    env = rows(checks_for(recorded[version], {name: value}), "env")
    assert env and not [c for c in env if "bool(int(value))" in c.message], env


@pytest.mark.parametrize("version", ["0.16.0", "0.17.1"])
def test_batch_invariant_is_read_before_envs_py_registered_it(recorded, version):
    # 0.15.1-0.18.x read it in model_executor/layers/batch_invariant.py, not envs.py: a switch that works, never
    # "not a variable vLLM reads"
    env = rows(checks_for(recorded[version], {"VLLM_BATCH_INVARIANT": "1"}), "env")
    assert not [c for c in env if "not a variable" in c.message], env


@pytest.mark.parametrize("value", ["1", "0", " 1 ", "00", "2"])
def test_values_int_accepts_pass(recorded, value):
    check = only(checks_for(recorded["0.17.1"], {"VLLM_MXFP4_USE_MARLIN": value, "VLLM_USE_FLASHINFER_SAMPLER": value}), "env")
    assert (check.status, check.message) == (Status.PASS, "2 VLLM_* variable(s), all read by vLLM 0.17.1")


def test_a_refused_instructions_value_fails_once(recorded):
    # the patched release: the instructions row says it; the stock one (harmony_instructions pending): the env row
    patched = checks_for(recorded["0.17.1"], {"VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS": "on"})
    assert (only(patched, "instructions").status, only(patched, "env").status) == (Status.FAIL, Status.PASS)
    stock = checks_for(recorded.stock("0.17.1"), {"VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS": "on"}, allow_unpatched=True)
    assert only(stock, "instructions").status is Status.WARN
    assert only(stock, "env").fix == "set VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS=1 or 0, or unset it"


# Where each release's envs.py (the 27 wheels, 0.15.1-0.33.0) reads these as bool(int(value)); the facts say which
# variables a release registers, the knowledge which of them are switches.
SWITCH_RELEASES = {
    "VLLM_MXFP4_USE_MARLIN": ("0.15.1", "0.24.0"),
    "VLLM_USE_FLASHINFER_MOE_MXFP4_BF16": ("0.15.1", "0.24.0"),
    "VLLM_BATCH_INVARIANT": ("0.19.0", None),
    "VLLM_ENFORCE_STRICT_TOOL_CALLING": ("0.21.0", "0.24.0"),
    "VLLM_HUMMING_MOE_GEMM_TYPE": ("0.20.0", "0.21.0"),
    "VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS": ("0.15.1", None),
    "VLLM_MARLIN_USE_ATOMIC_ADD": (None, None),
}


@pytest.mark.parametrize("release", recorded_releases())
def test_which_releases_read_a_variable_as_a_switch(release):
    caps = facts(release).capabilities
    for name, (first, end) in SWITCH_RELEASES.items():
        expected = first is not None and Version(first) <= caps.version and (end is None or caps.version < Version(end))
        assert knowledge.reads_as_switch(name, caps) is expected, name


def _int_switches_in(version: str) -> set[str]:
    """The VLLM_* entries of the release's real envs.py whose reader calls bool(int(...)) or maybe_convert_bool."""
    with zipfile.ZipFile(artefacts.sources(f"vllm=={version}")) as wheel:
        tree = ast.parse(wheel.read("vllm/envs.py"))
    table = next(node.value for node in ast.walk(tree) if isinstance(node, ast.AnnAssign | ast.Assign)
                 and "environment_variables" in ast.unparse(node.target if isinstance(node, ast.AnnAssign) else node.targets[0])
                 and isinstance(node.value, ast.Dict))
    return {key.value for key, reader in zip(table.keys, table.values, strict=True)
            if isinstance(key, ast.Constant) and str(key.value).startswith("VLLM_")
            and ("bool(int(" in ast.unparse(reader) or "maybe_convert_bool" in ast.unparse(reader))}


@pytest.mark.upstream
@pytest.mark.parametrize("version", ["0.15.1", "0.17.1", "0.20.0", "0.23.0", "0.24.0", "0.33.0"])
def test_the_switch_table_matches_the_real_envs_py(version):
    caps = facts(version).capabilities
    assert {name for name in caps.env.names if knowledge.reads_as_switch(name, caps)} == _int_switches_in(version)


def test_the_profiles_own_variables_pass_the_env_check(recorded):
    check = only(checks_for(recorded["0.17.1"], gpu="sm121", instructions="system"), "env")
    assert (check.status, check.message) == (Status.PASS, "2 VLLM_* variable(s), all read by vLLM 0.17.1")


# -- flags ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("version", "fix"), [("0.17.1", "use VLLM_MXFP4_USE_MARLIN=1 instead"), ("0.33.0", "use --moe-backend marlin instead")], ids=ids)
def test_folklore_mxfp4_backend_flag_fails_with_the_real_switch(recorded, version, fix):
    check = only(checks_for(recorded[version], extra_args=("--mxfp4-backend", "marlin")), "flags")
    assert (check.status, check.message, check.fix) == (Status.FAIL, "--mxfp4-backend: no stock release has it (fork patch sets only)", fix)


def test_unknown_flag_gets_a_did_you_mean(recorded):
    check = only(checks_for(recorded["0.33.0"], extra_args=("--enable-expert-paralel",)), "flags")
    assert check.message == "--enable-expert-paralel is not a flag of vLLM 0.33.0; did you mean --enable-expert-parallel?"


def test_moe_backend_flag_does_not_exist_before_0170(recorded):
    inst = recorded.stock("0.16.0")
    check = only(checks_for(inst, extra_args=("--moe-backend", "marlin"), allow_unpatched=True), "flags")
    assert check.status is Status.FAIL and check.message.startswith("--moe-backend is not a flag of vLLM 0.16.0")


@pytest.mark.parametrize(
    "extra",
    [
        ("--kv_cache_dtype", "fp8"),
        ("--no-enable-prefix-caching",),
        ("--tool-call-parser", "openai", "--enable-auto-tool-choice"),
        ("--compilation-config.mode", "3"),
        ("--enforce-eager", "--no-enforce-eager"),
        ("--stream-interval", "1"),
    ],
)
def test_accepted_spellings_pass(recorded, extra):
    check = only(checks_for(recorded["0.17.1"], extra_args=extra), "flags")
    assert check.status is Status.PASS


def test_enforce_eager_warns_with_the_measured_cost(recorded):
    check = only(checks_for(recorded["0.17.1"], extra_args=("--enforce-eager",), gpu="sm90"), "flags")
    assert (check.status, check.issue) == (Status.WARN, "G19")
    assert "59 to 26 tok/s" in check.message


def test_the_cpu_profile_gives_no_cuda_graph_advice(recorded):
    checks = checks_for(recorded["0.33.0"], extra_args=("--enforce-eager",))  # resolve's default: --gpu cpu
    assert rows(checks, "capture-sizes") == [] and [c.status for c in rows(checks, "flags")] == [Status.PASS]
    assert not [c for c in checks if "CUDA graph" in c.message or "CUDA-graph" in c.message], checks
    gpu = checks_for(recorded["0.33.0"], extra_args=("--enforce-eager",), gpu="sm90")
    assert rows(gpu, "capture-sizes") and "disables CUDA graphs" in only(gpu, "flags").message


def test_stream_interval_above_one_warns(recorded):
    check = only(checks_for(recorded["0.33.0"], extra_args=("--stream-interval", "20")), "flags")
    assert (check.status, check.issue, check.fix) == (Status.WARN, "G10", "--stream-interval 1 (or leave it out)")


def test_reasoning_parser_warns_unless_reasoning_is_expected(recorded):
    extra = ("--reasoning-parser", "openai_gptoss")
    check = only(checks_for(recorded["0.17.1"], extra_args=extra), "flags")
    assert (check.status, check.issue) == (Status.WARN, "G08") and "`content` is null" in check.message
    assert only(checks_for(recorded["0.17.1"], extra_args=extra, expect_reasoning=True), "flags").status is Status.PASS


def test_the_pre_0102_parser_name_fails(recorded):
    check = only(checks_for(recorded["0.17.1"], extra_args=("--reasoning-parser", "GptOss")), "flags")
    assert (check.status, check.fix) == (Status.FAIL, "--reasoning-parser openai_gptoss")


def test_gb10_memory_above_090_warns(recorded):
    check = only(checks_for(recorded["0.17.1"], gpu="sm121", extra_args=("--gpu-memory-utilization", "0.95")), "flags")
    assert (check.status, check.issue) == (Status.WARN, "G17")


def test_flashinfer_attention_on_hopper_warns(recorded):
    check = only(checks_for(recorded["0.17.1"], gpu="sm90", extra_args=("--attention-backend", "FLASHINFER")), "flags")
    assert (check.status, check.issue) == (Status.WARN, "G21")


# -- vocabulary, security, patches ---------------------------------------------------------------


def test_vocabulary_passes_with_the_installed_file(installs):
    check = only(checks_for(installs["0.17.1"]), "vocab")
    assert check.status is Status.PASS and "sha256 verified" in check.message


def test_vocabulary_missing_fails_with_the_fix(recorded, tmp_path):
    check = only(checks_for(recorded["0.17.1"], {"TIKTOKEN_ENCODINGS_BASE": str(tmp_path)}), "vocab")
    assert (check.status, check.fix, check.issue) == (Status.FAIL, "gptoss-patch vocab install", "G01")


def test_vocabulary_is_bundled_from_0310(recorded):
    check = only(checks_for(recorded["0.33.0"], {"TIKTOKEN_ENCODINGS_BASE": "/nonexistent"}), "vocab")
    assert check.status is Status.PASS and "oss-harmony" in check.message


@pytest.mark.parametrize(
    ("host", "environ", "options", "status"),
    [
        ("127.0.0.1", {}, {}, Status.PASS),
        ("0.0.0.0", {}, {}, Status.FAIL),
        ("0.0.0.0", {"VLLM_API_KEY": "k"}, {}, Status.PASS),
        ("0.0.0.0", {}, {"extra_args": ("--api-key", "k")}, Status.PASS),
        ("0.0.0.0", {}, {"allow_unauthenticated": True}, Status.WARN),
        ("127.0.0.1", {}, {"extra_args": ("--host", "10.1.2.3")}, Status.FAIL),  # the last --host wins
    ],
)
def test_binding_beyond_loopback_needs_a_key_or_consent(recorded, host, environ, options, status):
    assert only(checks_for(recorded["0.17.1"], environ, host=host, **options), "security").status is status


def test_unpatched_fails_and_allow_unpatched_warns_loudly(recorded):
    inst = recorded.stock("0.17.1")
    check = only(checks_for(inst), "patches")
    assert check.status is Status.FAIL
    assert check.message == f"not clean: {pending_summary(inst)}" and "harmony_instructions pending" in check.message
    assert check.fix == "gptoss-patch apply (or --allow-unpatched)"
    loud = only(checks_for(inst, allow_unpatched=True), "patches")
    assert loud.status is Status.WARN and loud.message.startswith("STARTING UNPATCHED")


# -- what the plan sets --------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS, ids=ids)
def test_instructions_default_to_upstreams_developer_placement(recorded, version):
    # Upstream's tested default (vllm#44330): the variable unset, every system and developer message kept.
    for options in ({}, {"instructions": "developer"}):
        checks = checks_for(recorded[version], **options)
        assert "VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS" not in resolve(recorded[version], **options).env_additions
        row = only(checks, "instructions")
        assert row.status is Status.PASS and row.message.startswith("developer (VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS unset")


@pytest.mark.parametrize("version", VERSIONS, ids=ids)
def test_instructions_system_sets_the_variable_and_says_what_it_drops(recorded, version):
    plan = resolve(recorded[version], instructions="system")
    assert plan.env_additions.get("VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS") == "1"
    row = only(checks.run(plan), "instructions")
    assert (row.status, row.issue) == (Status.WARN, "G02")
    assert row.message.startswith("system (VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS=1, --instructions system)")
    assert "a developer message after a system message) is rendered empty" in row.message
    assert row.fix == "--instructions developer (upstream's default) keeps every message"


@pytest.mark.parametrize(
    ("value", "options", "placement", "status"),
    [("1", {}, "system", Status.WARN), ("0", {"instructions": "system"}, "developer", Status.PASS), ("yes", {}, None, Status.FAIL)],
    ids=["1-over-default", "0-over-system", "not-an-integer"],
)
def test_the_variable_in_the_users_environment_wins_and_doctor_says_so(recorded, value, options, placement, status):
    environ = {"VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS": value}
    plan = resolve(recorded["0.17.1"], environ, **options)
    row = only(checks.run(plan), "instructions")
    assert "VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS" not in plan.env_additions
    assert plan.env["VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS"] == value
    assert row.status is status
    if placement:
        assert row.message.startswith(f"{placement} (VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS={value} in your environment, over ")
    else:
        assert "is not an integer" in row.message and row.fix.startswith("set VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS to 0 or 1")
    if options:
        assert "VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS=1 left out: already '0' in the environment" in plan.notes


def test_instructions_option_rejects_other_placements(recorded):
    with pytest.raises(UsageError, match="--instructions user: expected one of developer, system"):
        resolve(recorded["0.17.1"], instructions="user")


def test_harmony_instructions_variable_not_set_while_pending(recorded):
    plan = resolve(recorded.stock("0.17.1"), allow_unpatched=True, instructions="system")
    assert "VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS" not in plan.env_additions
    assert any("harmony_instructions is pending" in note for note in plan.notes)
    row = only(checks.run(plan), "instructions")
    assert (row.status, row.issue) == (Status.WARN, "G02") and row.message.startswith("raw (harmony_instructions is pending)")


@pytest.mark.parametrize(
    ("options", "environ", "note"),
    [
        ({}, {}, None),  # nobody asked for the system placement nor set the variable: nothing to say
        ({"instructions": "system"}, {}, "VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS not set: harmony_instructions is pending"),
        ({}, {"VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS": "1"},
         "VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS=1 in your environment: harmony_instructions is pending"),
    ],
    ids=["unset", "asked-for", "set-by-you"],
)
def test_the_instructions_variable_note_only_when_someone_set_or_asked_for_it(options, environ, note):
    from gptoss_patch.launcher import plan as planning
    from gptoss_patch.spec import PatchResult, Report, State

    report = Report(None, (PatchResult("harmony_instructions", State.PENDING, "pending"),))
    notes = planning._patch_environment_notes(report, planning.launch_options("m", gpu="cpu", **options), environ)
    assert [n.split(",")[0] for n in notes] == ([note] if note else [])


# -- --allow-unpatched and the installed hook ----------------------------------------------------


@pytest.mark.parametrize("mode", ["fail", "apply"])
def test_allow_unpatched_tells_an_installed_hook_to_warn_for_this_start_only(tmp_path, own_install, mode):
    from gptoss_patch.hook import installer

    inst = own_install(tmp_path / "venv", "0.17.1", patched=False)
    installer.install(inst, mode=mode)
    assert "GPTOSS_PATCH_HOOK_MODE" not in resolve(inst).env_additions  # refused anyway: nothing to override
    plan = resolve(inst, allow_unpatched=True)
    assert plan.env_additions["GPTOSS_PATCH_HOOK_MODE"] == "warn"
    why = next(s.why for s in plan.settings if s.name == "GPTOSS_PATCH_HOOK_MODE")
    assert why.startswith(f"--allow-unpatched: the hook installed in this environment (mode {mode})")
    row = only(checks.run(plan), "patches")
    assert row.message.endswith("because of --allow-unpatched; the installed hook is told GPTOSS_PATCH_HOOK_MODE=warn for this start only")
    # the user's own choice of mode wins, like every variable of theirs
    theirs = resolve(inst, {"GPTOSS_PATCH_HOOK_MODE": "fail"}, allow_unpatched=True)
    assert "GPTOSS_PATCH_HOOK_MODE" not in theirs.env_additions
    assert "GPTOSS_PATCH_HOOK_MODE=warn left out: already 'fail' in the environment" in theirs.notes


def test_allow_unpatched_adds_no_override_without_a_hook_or_with_a_warn_hook(tmp_path, own_install):
    from gptoss_patch.hook import installer

    inst = own_install(tmp_path / "venv", "0.17.1", patched=False)
    assert "GPTOSS_PATCH_HOOK_MODE" not in resolve(inst, allow_unpatched=True).env_additions
    installer.install(inst, mode="warn")
    assert "GPTOSS_PATCH_HOOK_MODE" not in resolve(inst, allow_unpatched=True).env_additions


def test_vocabulary_variables_only_before_0310(installs, vocabulary):
    directory = str(vocabulary / "gptoss-patch" / "tiktoken")
    assert resolve(installs["0.17.1"]).env_additions["TIKTOKEN_ENCODINGS_BASE"] == directory
    assert not any(name.startswith("TIKTOKEN_") for name in resolve(installs["0.33.0"]).env_additions)


def test_the_users_flag_and_environment_win_over_the_profile(recorded):
    plan = resolve(recorded["0.17.1"], {"VLLM_MXFP4_USE_MARLIN": "0"}, gpu="sm121", extra_args=("--kv-cache-dtype", "auto"))
    assert "--kv-cache-dtype" not in [s.name for s in plan.settings]
    assert "VLLM_MXFP4_USE_MARLIN" not in plan.env_additions
    assert "--kv-cache-dtype fp8 left out: given after --" in plan.notes
    assert plan.expected_moe is None  # the user un-pinned Marlin: nothing to hold the log to


def test_concurrency_and_explicit_capture_sizes_conflict(recorded):
    with pytest.raises(UsageError, match="both set the CUDA-graph sizes"):
        resolve(recorded["0.17.1"], concurrency="5,10", extra_args=("--cudagraph-capture-sizes", "1", "2"))


# -- can it start --------------------------------------------------------------------------------


def test_port_in_use_stops_serve_with_one_line(recorded):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        plan = resolve(recorded["0.17.1"], port=port)
        with pytest.raises(UsageError) as info:
            preflight.require_launchable(plan)
    assert str(info.value) == f"cannot listen on 127.0.0.1:{port}: the port is in use; pick another --port, or stop what holds it"


@pytest.mark.parametrize("model", ["./no/such/model", "/no/such/model", "~/no-such-model", "a/b/c"])
def test_a_missing_local_model_path_stops_serve(recorded, model):
    with pytest.raises(UsageError, match=f"^model path {model} does not exist"):
        preflight.require_launchable(resolve(recorded["0.17.1"], model=model))


def test_a_model_id_is_left_to_vllm(recorded):
    assert only(checks_for(recorded["0.17.1"], model="openai/gpt-oss-120b"), "model").status is Status.PASS


def test_a_vllm_script_whose_interpreter_is_gone_stops_serve(recorded):
    """What a venv renamed after install looks like: the script is there, its #! names nothing."""
    inst = recorded["0.17.1"]
    script = Path(inst.python).parent / "vllm"
    script.unlink()
    script.write_text(f"#!{script.parents[2] / 'renamed-away' / 'bin' / 'python'}\nimport sys\n")
    script.chmod(0o755)
    with pytest.raises(TargetError, match=r"^.*/bin/vllm cannot run: its interpreter .*/renamed-away/bin/python does not exist"):
        preflight.require_launchable(resolve(inst))


@pytest.mark.parametrize("head, expected", [
    ("#!/venv/bin/python3.11\n", "/venv/bin/python3.11"),
    ("#!/usr/bin/env python3\n", "/usr/bin/env"),
    ("#!/bin/sh\n'''exec' \"/a/very/long/path/bin/python\" \"$0\" \"$@\"\n' '''\n", "/a/very/long/path/bin/python"),
    ("\x7fELF", None),
])
def test_script_interpreter_reads_shebangs_and_pips_trampoline(tmp_path, head, expected):
    script = tmp_path / "vllm"
    script.write_bytes(head.encode())
    assert preflight.script_interpreter(script) == expected


def test_a_missing_vllm_executable_stops_serve(recorded):
    inst = recorded["0.17.1"]
    (Path(inst.python).parent / "vllm").unlink()
    with pytest.raises(TargetError, match=r"^no vllm executable at .*/bin/vllm; reinstall vLLM there"):
        preflight.require_launchable(resolve(inst))


# -- the MXFP4 MoE backend on Hopper ------------------------------------------------------------------


def _model_dir(tmp_path, quantization: dict | None):
    config = {"model_type": "gpt_oss", **({"quantization_config": quantization} if quantization else {})}
    (tmp_path / "config.json").write_text(__import__("json").dumps(config))
    return str(tmp_path)


@pytest.mark.parametrize(
    ("quantization", "kept"),
    [({"quant_method": "mxfp4"}, True), (None, False), ({"quant_method": "fp8"}, False)],
    ids=["mxfp4", "bf16", "fp8"],
)
def test_hopper_marlin_only_for_mxfp4_checkpoints(recorded, tmp_path, quantization, kept):
    plan = resolve(recorded["0.33.0"], model=_model_dir(tmp_path, quantization), gpu="sm90", fast_moe=True)
    assert ("--moe-backend" in plan.argv) is kept
    left_out = [n for n in plan.notes if n.startswith("--moe-backend marlin left out")]
    assert bool(left_out) is not kept
    if not kept:
        assert "is not MXFP4" in left_out[0] and "no Marlin kernel" in left_out[0]
    check = only(checks.run(plan), "moe-backend")
    assert check.message.startswith("--moe-backend marlin" if kept else "automatic selection")


def test_hopper_marlin_for_a_model_id_and_yours_after_the_separator_wins(recorded):
    assert resolve(recorded["0.33.0"], model="openai/gpt-oss-120b", gpu="sm90", fast_moe=True).argv.count("--moe-backend") == 1
    extra = ("--moe-backend", "triton")
    plan = resolve(recorded["0.33.0"], model="openai/gpt-oss-120b", gpu="sm90", fast_moe=True, extra_args=extra)
    assert plan.argv[-2:] == ["--moe-backend", "triton"] and plan.argv.count("--moe-backend") == 1
    assert any(n == "--moe-backend marlin left out: given after --" for n in plan.notes)


def test_hopper_leaves_the_moe_kernel_to_vllm_by_default(recorded):
    plan = resolve(recorded["0.33.0"], model="openai/gpt-oss-120b", gpu="sm90")
    assert "--moe-backend" not in plan.argv and plan.expected_moe is None
    assert profiles.SM90_MOE_NOTE in plan.notes
    assert only(checks.run(plan), "moe-backend").message.startswith("automatic selection")


@pytest.mark.parametrize(
    ("version", "environ", "extra", "named"),
    [("0.33.0", {}, ("--moe-backend", "Triton"), "--moe-backend triton"),
     ("0.33.0", {}, ("--moe-backend", "auto"), "automatic selection"),
     ("0.33.0", {}, ("--kernel-config.moe_backend", "triton"), "--kernel-config.moe_backend triton"),
     ("0.22.1", {"VLLM_MXFP4_USE_MARLIN": "1"}, (), "VLLM_MXFP4_USE_MARLIN=1"),
     ("0.22.1", {"VLLM_MXFP4_USE_MARLIN": "true"}, (), "automatic selection"),
     ("0.17.1", {}, ("--moe-backend", "marlin"), "automatic selection")],
    ids=["flag-any-case", "flag-auto", "kernel-config", "variable", "variable-refused", "flag-ignored-before-0190"],
)  # fmt: skip
def test_the_moe_row_names_the_backend_as_vllm_reads_the_request(recorded, version, environ, extra, named):
    # plan.moe_request: lower-cased, `auto` and a flag 0.17-0.18's selector ignores name nothing, the variables count
    plan = resolve(recorded[version], environ, model="openai/gpt-oss-120b", gpu="sm90", extra_args=extra, allow_unpatched=True)
    assert only(checks.run(plan), "moe-backend").message == f"{named}; the startup log line is reported"


# -- a model directory without weights (`model random --no-weights`) ------------------------------------


def _weightless_dir(tmp_path, *files: str) -> str:
    directory = tmp_path / "m120b"
    directory.mkdir()
    (directory / "config.json").write_text('{"model_type": "gpt_oss"}')
    for name in ("tokenizer.json", *files):
        (directory / name).write_text("")
    return str(directory)


@pytest.mark.parametrize("extra", [(), ("--load-format", "auto"), ("--load_format=safetensors",)], ids=["unset", "auto", "safetensors"])
def test_a_directory_without_weights_warns_that_it_needs_load_format_dummy(recorded, tmp_path, extra):
    model = _weightless_dir(tmp_path)
    plan = resolve(recorded["0.17.1"], model=model, extra_args=extra)
    preflight.require_launchable(plan)  # a warning: vLLM's own failure, with its last lines, is what stops the start
    check = only(checks.run(plan), "model")
    assert check.status is Status.WARN
    assert check.message == (f"{model} has a config.json but no weights (*.safetensors, *.bin, *.pt): vLLM will fail to "
                             'load it ("Cannot find any model weights")')
    assert check.fix.startswith("pass --load-format dummy after --")


@pytest.mark.parametrize("extra", [("--load-format", "dummy"), ("--load-format=DUMMY",), ("--load-format", "auto", "--load-format", "dummy")])
def test_a_directory_without_weights_passes_with_load_format_dummy(recorded, tmp_path, extra):
    model = _weightless_dir(tmp_path)
    plan = resolve(recorded["0.17.1"], model=model, extra_args=extra)
    preflight.require_launchable(plan)
    check = only(checks.run(plan), "model")
    assert (check.status, check.message) == (Status.PASS, f"{model} (no weights: --load-format dummy makes random ones)")


@pytest.mark.parametrize("weights", ["model.safetensors", "pytorch_model.bin", "model.pt"])
def test_a_directory_with_weights_is_quiet_about_the_load_format(recorded, tmp_path, weights):
    model = _weightless_dir(tmp_path, weights)
    check = only(checks_for(recorded["0.17.1"], model=model), "model")
    assert (check.status, check.message) == (Status.PASS, model)


def test_a_load_format_that_reads_elsewhere_is_left_to_vllm(recorded, tmp_path):
    model = _weightless_dir(tmp_path)
    check = only(checks_for(recorded["0.17.1"], model=model, extra_args=("--load-format", "tensorizer")), "model")
    assert check.status is Status.PASS and "--load-format tensorizer reads its own" in check.message
