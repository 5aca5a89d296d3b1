"""Pre-flight checks for gpt-oss on recent vLLM (G26-G32, G11), on the recorded facts of 0.17.1, 0.22.1 and 0.33.0.

What the checks read from vLLM (the harmony requirement of its METADATA, envs.py, the serve flags, the patch states)
is what the real readers and engine gave on those wheels, recorded in tests/launcher/facts/ (regenerated and
compared in the slow tier: tests/launcher/test_recorded.py); `recorded` lays out an installation from it. The
openai_harmony providers are built here in the shape both real providers install (two files under
`openai_harmony/`, listed in each RECORD). `status` through the CLI needs a real installed tree (`installs`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from pathlib import Path

import pytest
from packaging.version import Version

from gptoss_patch import target
from gptoss_patch.launcher import checks, knowledge, serving_traps
from gptoss_patch.launcher.results import Status
from tests.launcher.conftest import resolve, rows
from tests.launcher.recorded import facts
from tests.support.cli import run


def checks_for(inst, environ=None, **options):
    return checks.run(resolve(inst, environ, **options))


def one(checks, name):
    found = rows(checks, name)
    assert len(found) == 1, found
    return found[0]


# -- G26: two providers of openai_harmony ---------------------------------------------------------


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def add_provider(site: Path, name: str, version: str, so: bytes) -> None:
    """A distribution that installs the openai_harmony package, the way openai-harmony and oss-harmony both do."""
    files = {"openai_harmony/__init__.py": b"from .openai_harmony import *\n", "openai_harmony/openai_harmony.abi3.so": so}
    for rel, data in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
    dist_info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    rows_ = [f"{rel},{_digest(data)},{len(data)}" for rel, data in files.items()]
    (dist_info / "RECORD").write_text("\n".join([*rows_, f"{dist_info.name}/RECORD,,"]) + "\n")


@pytest.fixture
def install_033(recorded):
    """0.33.0 before apply, laid out from its recorded facts: a site-packages of its own for the providers added here."""
    return recorded.stock("0.33.0")


def test_one_provider_passes(install_033):
    add_provider(Path(install_033.site_packages), "oss-harmony", "0.0.11", b"embedded vocabulary")
    check = one(checks_for(install_033, allow_unpatched=True), "harmony")
    assert check.status is Status.PASS and "oss-harmony alone" in check.message


def test_two_providers_warn_naming_whose_files_won_and_the_requirement(install_033):
    site = Path(install_033.site_packages)
    add_provider(site, "oss-harmony", "0.0.11", b"embedded vocabulary")
    add_provider(site, "openai-harmony", "0.0.8", b"downloads the vocabulary")  # installed last: its files are on disk
    check = one(checks_for(install_033, allow_unpatched=True), "harmony")
    assert (check.status, check.issue) == (Status.WARN, "G26")
    assert "the files on disk are openai-harmony's" in check.message
    assert "requires oss-harmony>=0.0.11" in check.message  # read from the real 0.33.0 METADATA
    install = target.pip_command(install_033.python, "install", "--no-deps", "oss-harmony>=0.0.11")
    assert check.fix.endswith(f" openai-harmony oss-harmony && {install}")  # an installer that venv has (pip, or uv)
    assert install.endswith(" 'oss-harmony>=0.0.11'")


def test_files_matching_neither_record_are_said_so(install_033):
    site = Path(install_033.site_packages)
    add_provider(site, "oss-harmony", "0.0.11", b"embedded vocabulary")
    add_provider(site, "openai-harmony", "0.0.8", b"downloads the vocabulary")
    (site / "openai_harmony/openai_harmony.abi3.so").write_bytes(b"something else")
    assert "match neither RECORD" in one(checks_for(install_033, allow_unpatched=True), "harmony").message


def test_an_unreadable_record_is_a_warning_with_the_reason(install_033):
    site = Path(install_033.site_packages)
    add_provider(site, "oss-harmony", "0.0.11", b"embedded vocabulary")
    (site / "oss_harmony-0.0.11.dist-info" / "RECORD").unlink()
    check = one(checks_for(install_033, allow_unpatched=True), "harmony")
    assert check.status is Status.WARN and "cannot read oss_harmony-0.0.11.dist-info/RECORD" in check.message


@pytest.mark.parametrize(("version", "requirement"), [("0.22.1", "openai-harmony>=0.0.3"), ("0.33.0", "oss-harmony>=0.0.11")])
def test_the_requirement_comes_from_vllms_metadata(recorded, version, requirement):
    # required_harmony's answer on the real METADATA, recorded (and compared with the wheel in the slow tier) ...
    assert facts(version).requires_harmony == requirement
    # ... is what the check reads back from the recorded installation's METADATA
    assert serving_traps.required_harmony(Path(recorded[version].dist_info)) == requirement


# -- G27: the Rust frontend ------------------------------------------------------------------------


def test_rust_frontend_warns_naming_the_bypassed_patches(recorded):
    check = one(checks_for(recorded["0.22.1"], {"VLLM_USE_RUST_FRONTEND": "1"}), "frontend")
    assert (check.status, check.issue) == (Status.WARN, "G27")
    assert "harmony_instructions" in check.message and "marlin_atomic_add_sm121" not in check.message
    assert check.fix.startswith("unset VLLM_USE_RUST_FRONTEND")


@pytest.mark.parametrize("value", ["0", "yes"])
def test_rust_frontend_off_or_unparsable_says_nothing(recorded, value):
    assert rows(checks_for(recorded["0.33.0"], {"VLLM_USE_RUST_FRONTEND": value}), "frontend") == []


def test_status_reports_python_patches_as_bypassed_while_the_variable_is_set(installs, monkeypatch):
    monkeypatch.setenv("VLLM_USE_RUST_FRONTEND", "1")
    result = run("status", "--python", installs["0.22.1"].python, "--json")
    assert result.exit_code == 0, result.output
    patches = {p["id"]: p for p in json.loads(result.stdout)["patches"]}
    assert "bypassed while VLLM_USE_RUST_FRONTEND=1" in patches["harmony_instructions"]["reason"]
    assert "warnings" not in patches["marlin_atomic_add_sm121"]  # the engine side still runs in Python


def test_status_says_nothing_of_the_rust_frontend_where_vllm_does_not_read_it(installs, monkeypatch):
    """0.17.1 never reads the variable: status with it set is status without it, its patches applied, none bypassed."""
    command = ["status", "--python", installs["0.17.1"].python, "--json"]
    monkeypatch.delenv("VLLM_USE_RUST_FRONTEND", raising=False)
    unset = run(*command)
    monkeypatch.setenv("VLLM_USE_RUST_FRONTEND", "1")
    result = run(*command)
    assert (result.exit_code, unset.exit_code) == (0, 0), result.output
    assert result.stdout == unset.stdout
    patches = {p["id"]: p for p in json.loads(result.stdout)["patches"]}
    assert patches["harmony_instructions"]["state"] == "applied", patches["harmony_instructions"]
    assert "bypassed" not in result.stdout


# -- G28: tool calls without the gpt-oss tool parser -----------------------------------------------


@pytest.mark.parametrize(
    ("extra", "status"),
    [
        (("--enable-auto-tool-choice",), Status.WARN),
        (("--tool-call-parser", "openai"), Status.WARN),
        (("--enable-auto-tool-choice", "--tool-call-parser", "hermes"), Status.FAIL),
        (("--enable-auto-tool-choice", "--tool-call-parser", "openai"), Status.PASS),
    ],
    ids=["auto-without-parser", "parser-without-auto", "wrong-parser", "both"],
)
def test_tool_calling_needs_both_flags_and_the_openai_parser(recorded, extra, status):
    check = one(checks_for(recorded["0.33.0"], extra_args=extra), "tools")
    assert (check.status, check.issue) == (status, "G28")


def test_no_tool_flags_no_tool_check(recorded):
    assert rows(checks_for(recorded["0.33.0"]), "tools") == []


# -- G29: MoE backends forced on GB10 ----------------------------------------------------------------


def test_humming_forced_on_gb10_warns_where_vllm_pins_the_crashing_kernels(recorded):
    check = one([c for c in checks_for(recorded["0.22.1"], gpu="sm121", extra_args=("--moe-backend", "humming")) if c.issue == "G29"], "moe-backend")
    assert check.status is Status.WARN and "vllm#49554" in check.message


def test_humming_on_033_and_other_gpus_is_not_flagged(recorded):
    assert not [c for c in checks_for(recorded["0.33.0"], gpu="sm121", extra_args=("--moe-backend", "humming")) if c.issue == "G29"]
    assert not [c for c in checks_for(recorded["0.22.1"], gpu="sm90", extra_args=("--moe-backend", "humming")) if c.issue == "G29"]


def test_triton_unfused_on_gb10_warns_from_032(recorded):
    found = [c for c in checks_for(recorded["0.33.0"], gpu="sm121", extra_args=("--moe-backend", "triton_unfused")) if c.issue == "G29"]
    assert len(found) == 1 and "vllm#41477" in found[0].message


# -- G30: FP8 KV cache on the sliding-window layers --------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "status"),
    [
        (("--kv-cache-dtype", "fp8"), Status.WARN),
        (("--kv-cache-dtype", "fp8_e4m3", "--kv-cache-dtype-skip-layers", "sliding_window"), Status.PASS),
        (("--kv-cache-dtype", "fp8", "--kv-cache-dtype-skip-layers", "0", "sliding_window"), Status.PASS),
    ],
    ids=["fp8-alone", "skipped", "skipped-among-others"],
)
def test_fp8_kv_cache_wants_the_sliding_window_skip(recorded, extra, status):
    check = one(checks_for(recorded["0.33.0"], extra_args=extra), "kv-cache")
    assert (check.status, check.issue) == (status, "G30")


def test_no_kv_check_where_the_skip_flag_does_not_exist(recorded):
    assert rows(checks_for(recorded["0.17.1"], extra_args=("--kv-cache-dtype", "fp8")), "kv-cache") == []


# -- G31: structured-output backends that reject structural tags -------------------------------------


@pytest.mark.parametrize(
    "extra",
    [("--structured-outputs-config", '{"backend": "outlines"}'), ("--structured-outputs-config.backend", "lm-format-enforcer")],
    ids=["json", "dotted"],
)
def test_backends_that_reject_structural_tags_warn(recorded, extra):
    check = one(checks_for(recorded["0.33.0"], extra_args=extra), "structured-output")
    assert (check.status, check.issue) == (Status.WARN, "G31") and "fails with 400" in check.message


@pytest.mark.parametrize("backend", ["xgrammar", "guidance", "auto"])
def test_backends_that_accept_them_say_nothing(recorded, backend):
    assert rows(checks_for(recorded["0.33.0"], extra_args=("--structured-outputs-config.backend", backend)), "structured-output") == []


def test_before_0270_response_format_is_no_structural_tag(recorded):
    extra = ("--structured-outputs-config.backend", "outlines")
    assert rows(checks_for(recorded["0.22.1"], extra_args=extra), "structured-output") == []


def test_every_issue_these_checks_print_is_in_the_catalogue():
    text = (Path(__file__).resolve().parents[2] / "docs" / "known-issues.md").read_text()
    source = Path(serving_traps.__file__).read_text()
    printed = sorted(set(re.findall(r'issue="(G\d\d)"', source)))
    assert printed == ["G11", "G26", "G27", "G28", "G29", "G30", "G31", "G32", "G45", "G47", "G48", "G51"]
    assert all(f'<a id="{g.lower()}"></a>' in text for g in printed)


# -- G32: FlashInfer's SM90 MoE kernel is compiled on the first start --------------------------------

FORCED_FLASHINFER = ("--moe-backend", "flashinfer_cutlass")


def add_flashinfer(site: Path, project: str = "flashinfer_python", version: str = "0.6.8.post1") -> None:
    """A FlashInfer distribution as pip leaves it: only its .dist-info is read."""
    dist_info = site / f"{project}-{version}.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project.replace('_', '-')}\nVersion: {version}\n")


def compiled_module(base: Path, version: str = "0.6.8.post1", archs: str = "90a") -> Path:
    library = base / ".cache" / "flashinfer" / version / archs / "cached_ops" / "fused_moe_90" / "fused_moe_90.so"
    library.parent.mkdir(parents=True)
    library.write_bytes(b"\x7fELF")
    return library


def flashinfer_check(inst, environ=None, extra_args=FORCED_FLASHINFER):
    return one(checks_for(inst, environ, gpu="sm90", extra_args=extra_args, allow_unpatched=True), "moe-build")


def test_flashinfer_moe_on_hopper_warns_until_its_module_is_compiled(install_033, tmp_path):
    add_flashinfer(Path(install_033.site_packages))
    environ = {"FLASHINFER_WORKSPACE_BASE": str(tmp_path / "fi")}
    check = flashinfer_check(install_033, environ)
    assert (check.status, check.issue) == (Status.WARN, "G32")
    assert "FlashInfer 0.6.8.post1 compiles its SM90 MoE kernel" in check.message and "about an hour" in check.message
    assert check.fix.startswith(f"compile it once before serving: {install_033.python} -c ")
    built = compiled_module(tmp_path / "fi")
    check = flashinfer_check(install_033, environ)
    assert check.status is Status.PASS and str(built) in check.message


def test_a_module_compiled_for_another_flashinfer_does_not_count(install_033, tmp_path):
    add_flashinfer(Path(install_033.site_packages), version="0.6.13")
    compiled_module(tmp_path, version="0.6.8.post1")
    assert flashinfer_check(install_033, {"HOME": str(tmp_path)}).status is Status.WARN


def test_the_jit_cache_package_counts_as_compiled(install_033, tmp_path):
    site = Path(install_033.site_packages)
    add_flashinfer(site)
    add_flashinfer(site, "flashinfer_jit_cache", "0.6.8.post1+cu130")
    shipped = site / "flashinfer_jit_cache" / "jit_cache" / "fused_moe_90" / "fused_moe_90.so"
    shipped.parent.mkdir(parents=True)
    shipped.write_bytes(b"\x7fELF")
    check = flashinfer_check(install_033, {"HOME": str(tmp_path)})
    assert check.status is Status.PASS and str(shipped) in check.message


def test_flashinfer_moe_without_flashinfer_installed_warns_that_vllm_will_refuse_it(recorded):
    check = flashinfer_check(recorded["0.33.0"])
    assert (check.status, check.issue) == (Status.WARN, "G32") and "flashinfer-python, which is not installed" in check.message


def test_the_older_environment_switch_is_read_where_vllm_knows_it(recorded):
    check = flashinfer_check(recorded["0.22.1"], {"VLLM_USE_FLASHINFER_MOE_MXFP4_BF16": "1"}, extra_args=())
    assert check.issue == "G32" and check.message.startswith("VLLM_USE_FLASHINFER_MOE_MXFP4_BF16=1 needs flashinfer-python")
    off = checks_for(recorded["0.22.1"], {"VLLM_USE_FLASHINFER_MOE_MXFP4_BF16": "0"}, gpu="sm90")
    assert rows(off, "moe-build") == []


@pytest.mark.parametrize(("gpu", "extra"), [("sm90", ()), ("sm90", ("--moe-backend", "marlin")), ("sm121", FORCED_FLASHINFER)])
def test_no_flashinfer_build_check_unless_hopper_is_forced_onto_it(recorded, gpu, extra):
    assert rows(checks_for(recorded["0.33.0"], gpu=gpu, extra_args=extra), "moe-build") == []


# -- G11: from 0.33.0 the reasoning-effort map is vLLM's flag, unset by default ----------------------------


def test_0330_without_an_effort_map_warns_that_efforts_beyond_harmonys_are_rejected_and_its_fix_works(recorded):
    import shlex

    check = one(checks_for(recorded["0.33.0"]), "reasoning-effort")
    assert (check.status, check.issue) == (Status.WARN, "G11")
    assert "gets a 400" in check.message and "minimal, xhigh, max" in check.message
    assert check.fix == """pass --reasoning-effort-map '{"minimal": "low", "xhigh": "high", "max": "high"}' to vLLM (after --)"""
    flag = shlex.split(check.fix.removeprefix("pass ").removesuffix(" to vLLM (after --)"))
    assert json.loads(flag[1]) == {"minimal": "low", "xhigh": "high", "max": "high"}  # vLLM parses it with json.loads
    fixed = one(checks_for(recorded["0.33.0"], extra_args=tuple(flag)), "reasoning-effort")
    assert fixed.status is Status.PASS
    assert one(checks_for(recorded["0.33.0"], extra_args=tuple(flag)), "flags").status is Status.PASS  # a flag 0.33.0 has


def test_before_0330_the_patch_maps_efforts_and_there_is_no_effort_map_row(recorded):
    assert rows(checks_for(recorded["0.33.0"]), "reasoning-effort")
    assert not rows(checks_for(recorded["0.17.1"]), "reasoning-effort")


# -- G47: FlashInfer's SM90 CUTLASS MoE computes wrong results with FlashInfer 0.6.10-0.6.15.post1 --------------------


def accuracy_rows(inst, environ=None, extra_args=FORCED_FLASHINFER):
    checks = checks_for(inst, environ, gpu="sm90", extra_args=extra_args, allow_unpatched=True)
    return [c for c in rows(checks, "moe-backend") if c.issue == "G47"]


@pytest.mark.parametrize("version", ["0.6.10", "0.6.11.post2", "0.6.12", "0.6.14", "0.6.15.post1"])
def test_flashinfer_cutlass_moe_on_hopper_is_refused_with_an_affected_flashinfer(install_033, version):
    add_flashinfer(Path(install_033.site_packages), version=version)
    (check,) = accuracy_rows(install_033)
    assert check.status is Status.FAIL
    assert f"FlashInfer {version}'s CUTLASS MXFP4 x BF16 MoE kernel computes wrong results" in check.message
    assert "flashinfer#3334" in check.message and "pin 0.6.16.post3" in check.message
    upgrade = target.pip_command(install_033.python, "install", "vllm>=0.27.0")
    assert check.fix == (f"drop --moe-backend flashinfer_cutlass (vLLM then runs its Triton kernel on Hopper), "
                         f"or {upgrade} (flashinfer-python 0.6.16.post3)")
    assert accuracy_rows(install_033, extra_args=()) == []  # the fix followed: the backend dropped


@pytest.mark.parametrize("version", ["0.6.8.post1", "0.6.16", "0.6.16.post3", "0.7.2.post1", "not-a-version"])
def test_flashinfer_releases_outside_the_bug_are_not_refused(install_033, version):
    add_flashinfer(Path(install_033.site_packages), version=version)
    assert accuracy_rows(install_033) == []


def test_the_older_switch_to_the_same_kernel_is_refused_and_its_fix_unsets_it(recorded):
    inst = recorded["0.22.1"]
    add_flashinfer(Path(inst.site_packages), version="0.6.11.post2")  # 0.22.1's own pin (its METADATA)
    (check,) = accuracy_rows(inst, {"VLLM_USE_FLASHINFER_MOE_MXFP4_BF16": "1"}, extra_args=())
    assert check.message.startswith("VLLM_USE_FLASHINFER_MOE_MXFP4_BF16=1 on Hopper: FlashInfer 0.6.11.post2's")
    assert check.fix.startswith("unset VLLM_USE_FLASHINFER_MOE_MXFP4_BF16 (vLLM then runs its Triton kernel on Hopper)")
    assert accuracy_rows(inst, {}, extra_args=()) == []


def test_no_flashinfer_accuracy_row_off_hopper(install_033):
    add_flashinfer(Path(install_033.site_packages), version="0.6.13")
    checks = checks_for(install_033, gpu="sm100", extra_args=FORCED_FLASHINFER, allow_unpatched=True)
    assert [c for c in checks if c.issue == "G47"] == []


# -- G45: VLLM_BATCH_INVARIANT=1 moves gpt-oss's experts off Triton ---------------------------------------------------

BATCH_INVARIANT = {"VLLM_BATCH_INVARIANT": "1"}


@pytest.mark.parametrize(
    ("release", "humming", "running"),
    [((0, 20), True, "EMULATION"), ((0, 21), True, "EMULATION"), ((0, 22), True, None), ((0, 24), True, None),
     ((0, 25), True, "EMULATION"), ((0, 31), True, "EMULATION"), ((0, 32), True, "HUMMING"), ((0, 33), True, "HUMMING"),
     ((0, 33), False, "EMULATION")],
)  # fmt: skip
def test_the_experts_vllm_runs_under_batch_invariance_follow_the_wheels(release, humming, running):
    assert serving_traps.batch_invariant_experts(release, humming=humming) == running


def test_batch_invariance_on_033_says_the_humming_experts_run_not_triton(install_033):
    site = Path(install_033.site_packages)
    add_flashinfer(site, "humming_kernels", "0.1.19")  # vLLM 0.33.0 requires humming-kernels[cu13]==0.1.19
    check = one(checks_for(install_033, BATCH_INVARIANT, gpu="sm90", allow_unpatched=True), "batch-invariance")
    assert (check.status, check.issue) == (Status.WARN, "G45")
    assert "runs gpt-oss's experts on the HUMMING experts" in check.message
    assert "not its Triton MXFP4 kernel" in check.message
    assert check.fix == "unset VLLM_BATCH_INVARIANT to keep vLLM's Triton MXFP4 experts"
    assert rows(checks_for(install_033, {}, gpu="sm90", allow_unpatched=True), "batch-invariance") == []  # fix followed


def test_batch_invariance_without_humming_installed_runs_the_emulation_experts(install_033):
    check = one(checks_for(install_033, BATCH_INVARIANT, gpu="sm90", allow_unpatched=True), "batch-invariance")
    assert "on the EMULATION experts (the MXFP4 weights dequantized to bf16" in check.message


def test_batch_invariance_on_0221_stops_vllm_and_names_the_emulation_backend(recorded):
    check = one(checks_for(recorded["0.22.1"], BATCH_INVARIANT, gpu="sm90"), "batch-invariance")
    assert (check.status, check.issue) == (Status.FAIL, "G45")
    assert "No MXFP4 MoE backend supports the deployment configuration" in check.message
    assert check.fix == "unset VLLM_BATCH_INVARIANT (or -- --moe-backend emulation: slow dequantized bf16 experts)"
    assert "emulation" in facts("0.22.1").capabilities.moe.choices  # the fix names a choice 0.22.1 has
    assert rows(checks_for(recorded["0.22.1"], BATCH_INVARIANT, gpu="sm90", extra_args=("--moe-backend", "emulation")),
                "batch-invariance") == []


@pytest.mark.parametrize(("gpu", "extra"), [("sm90", ("--moe-backend", "triton")), ("sm121", ())])
def test_a_named_backend_that_is_not_batch_invariant_stops_vllm(install_033, gpu, extra):
    # sm121: the profile pins Marlin
    checks = checks_for(install_033, BATCH_INVARIANT, gpu=gpu, extra_args=extra, allow_unpatched=True)
    check = one(checks, "batch-invariance")
    assert (check.status, check.issue) == (Status.FAIL, "G45")
    assert "does not support the deployment configuration since batch invariance" in check.message
    assert check.fix == "unset VLLM_BATCH_INVARIANT"


@pytest.mark.parametrize(
    ("version", "environ"), [("0.17.1", BATCH_INVARIANT), ("0.33.0", {"VLLM_BATCH_INVARIANT": "0"})]
)
def test_no_batch_invariance_row_before_the_moe_gate_or_when_off(recorded, version, environ):
    assert rows(checks_for(recorded[version], environ, gpu="sm90", allow_unpatched=True), "batch-invariance") == []


# -- G48: one structured-output request can kill the engine before 0.30.0 ----------------------------------------------


def test_releases_before_0300_warn_that_a_structured_output_request_can_kill_the_engine(recorded):
    inst = recorded["0.22.1"]
    check = one(checks_for(inst, extra_args=("--host", "0.0.0.0", "--api-key", "k")), "advisory")
    assert (check.status, check.issue) == (Status.WARN, "G48")
    assert "PYSEC-2026-4199, fixed in 0.30.0" in check.message
    assert check.fix.startswith(target.pip_command(inst.python, "install", "vllm>=0.30.0"))


@pytest.mark.parametrize("where", [(), ("--host", "::1"), ("--uds", "/tmp/v.sock")])
def test_the_advisory_passes_where_only_this_machines_clients_reach_the_server(recorded, where):
    # Was a warning on every start below 0.30.0, loopback included: a table before every `serve` (the default host is
    # loopback), a warning users learn to skip.
    check = one(checks_for(recorded["0.22.1"], extra_args=where), "advisory")
    assert (check.status, check.issue) == (Status.PASS, "G48") and check.message.endswith("only this machine's clients reach it")


def test_no_advisory_row_from_0300(recorded):
    assert rows(checks_for(recorded["0.33.0"]), "advisory") == []


# -- G51: NVFP4 (ModelOpt) re-quantized checkpoints ---------------------------------------------------------------


def write_model(directory: Path, config: dict, extra: dict[str, dict] | None = None) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps({"model_type": "gpt_oss", **config}))
    for name, data in (extra or {}).items():
        (directory / name).write_text(json.dumps(data))
    return directory


@pytest.mark.parametrize(
    ("config", "extra"),
    [({"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}}, None),
     ({"quantization_config": {"quant_method": "modelopt_fp4"}}, None),
     ({}, {"hf_quant_config.json": {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4"}}})],
)  # fmt: skip
def test_a_modelopt_nvfp4_checkpoint_is_refused(recorded, tmp_path, config, extra):
    model = write_model(tmp_path / "gpt-oss-20b-nvfp4", config, extra)
    check = one(checks_for(recorded["0.33.0"], model=str(model)), "checkpoint")
    assert (check.status, check.issue) == (Status.FAIL, "G51")
    assert "ModelOpt NVFP4 re-quantization" in check.message and "vllm#46641" in check.message
    assert check.fix == "serve the original MXFP4 checkpoint: openai/gpt-oss-20b or openai/gpt-oss-120b"
    assert rows(checks_for(recorded["0.33.0"], model="openai/gpt-oss-20b"), "checkpoint") == []  # the fix followed


def test_a_model_id_is_read_from_the_hugging_face_cache(recorded, tmp_path):
    hub = tmp_path / "hf" / "hub" / "models--someone--gpt-oss-120b-NVFP4" / "snapshots" / "abc123"
    write_model(hub, {"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}})
    checks = checks_for(recorded["0.33.0"], {"HF_HOME": str(tmp_path / "hf")}, model="someone/gpt-oss-120b-NVFP4")
    check = one(checks, "checkpoint")
    assert check.status is Status.FAIL and str(hub / "config.json") in check.message


@pytest.mark.parametrize("config", [{"quantization_config": {"quant_method": "mxfp4"}}, {},
                                    {"quantization_config": {"quant_method": "modelopt", "quant_algo": "FP8"}}])
def test_mxfp4_bf16_and_other_modelopt_checkpoints_pass(recorded, tmp_path, config):
    model = write_model(tmp_path / "model", config)
    assert rows(checks_for(recorded["0.33.0"], model=str(model)), "checkpoint") == []


# -- G50: the triton_kernels release beside the Triton figures ---------------------------------------------------


@pytest.mark.parametrize(
    ("vllm", "tag"),
    [("0.16.0", "3.5.0"), ("0.17.0", "3.6.0"), ("0.20.2", "3.6.0"), ("0.21.0", "3.6.0"), ("0.22.0", "3.5.1"),
     ("0.33.0", "3.5.1"), ("0.15.1", None), (None, None)],
)  # fmt: skip
def test_the_vendored_triton_kernels_tag_follows_each_releases_cmake(vllm, tag):
    assert knowledge.vendored_triton_kernels(vllm) == tag


def test_the_slow_triton_kernels_release_is_named_beside_the_figures():
    vendored = {"triton": "3.6.0", "triton_kernels": "vendored in vLLM", "flashinfer": "0.6.8.post1"}
    first, warning = knowledge.kernel_library_notes(vendored, "0.20.2")
    assert first == "triton_kernels: vLLM 0.20.2 vendors triton's v3.6.0 copy (its sdist's triton_kernels.cmake)"
    assert warning.startswith("triton_kernels 3.6.0 is the release that lost more than 30 % at batch size 1")
    assert "G50" in warning
    assert knowledge.kernel_library_notes(vendored, "0.22.1") == [
        "triton_kernels: vLLM 0.22.1 vendors triton's v3.5.1 copy (its sdist's triton_kernels.cmake)"]
    installed = {**vendored, "triton_kernels": "3.6.1"}
    assert len(knowledge.kernel_library_notes(installed, "0.22.1")) == 1  # an installed one wins over the vendored copy
    assert knowledge.kernel_library_notes({**vendored, "triton_kernels": "not installed"}, "0.20.2") == []


# -- the version tables above, against the real wheels (slow tier: each release's files by range requests) -----------


def _listed_backends(source: str, function: str) -> list[str]:
    import ast

    tree = ast.parse(source)
    body = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == function)
    lists = [node for node in ast.walk(body) if isinstance(node, ast.List)]
    return [ast.unparse(element).rsplit(".", 1)[-1] for node in lists for element in node.elts]


def _first_file(version: str, *paths: str) -> str:
    """The first of `paths` the release's wheel has (modules move between releases); "" when none."""
    import zipfile

    from tests.support.upstream import read_from_wheel, sources_path

    with zipfile.ZipFile(sources_path(version)) as archive:
        present = set(archive.namelist())
    return next((read_from_wheel(version, path).decode() for path in paths if path in present), "")


@pytest.mark.upstream
@pytest.mark.parametrize(
    "version",
    ["0.20.0", "0.21.0", "0.22.0", "0.24.0", "0.25.0", "0.27.0", "0.28.0", "0.29.0", "0.31.0", "0.32.0", "0.33.0"],
)
def test_the_batch_invariant_experts_table_is_what_each_wheels_oracle_does(version):
    from tests.support.upstream import read_from_wheel

    moe = "vllm/model_executor/layers/fused_moe"
    gate = read_from_wheel(version, f"{moe}/modular_kernel.py").decode()
    assert "envs.VLLM_BATCH_INVARIANT and not cls._supports_batch_invariance()" in gate
    oai = _first_file(version, f"{moe}/experts/gpt_oss_triton_kernels_moe.py", f"{moe}/gpt_oss_triton_kernels_moe.py")
    assert "_supports_batch_invariance" not in oai  # gpt-oss's Triton experts never declare it
    oracle = read_from_wheel(version, f"{moe}/oracle/mxfp4.py").decode()
    order = _listed_backends(oracle, "_get_priority_backends_for_gpt_oss")
    humming = _first_file(version, f"{moe}/experts/fused_humming_moe.py")
    humming_declares = "def _supports_batch_invariance() -> bool:\n        return True" in humming
    assert humming_declares == (Version(version).release[:2] >= serving_traps.HUMMING_DECLARES_FROM)
    invariant = [b for b in order if b == "EMULATION" or (b == "HUMMING" and humming_declares)]
    expected = invariant[0] if invariant else None
    assert serving_traps.batch_invariant_experts(Version(version).release) == expected


@pytest.mark.upstream
@pytest.mark.parametrize(
    "version", ["0.21.0", "0.22.0", "0.22.1", "0.23.0", "0.24.0", "0.25.0", "0.26.0", "0.27.0", "0.33.0"]
)
def test_the_flashinfer_pins_named_in_g47_are_each_wheels_metadata(version):
    from tests.support.upstream import read_from_wheel

    metadata = read_from_wheel(version, f"vllm-{version}.dist-info/METADATA").decode()
    (pin,) = re.findall(r"^Requires-Dist: flashinfer-python==(\S+)$", metadata, re.MULTILINE)
    affected = (0, 22) <= Version(version).release[:2] < (0, 27)  # docs/known-issues.md G47
    assert serving_traps.flashinfer_gives_wrong_results(pin) == affected
    if version == serving_traps.VLLM_WITH_FIXED_FLASHINFER:
        assert pin == serving_traps.FLASHINFER_FIXED_PIN
