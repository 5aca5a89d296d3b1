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
from click.testing import CliRunner

from gptoss_patch import target
from gptoss_patch.cli import app
from gptoss_patch.launcher import preflight, serving_traps
from gptoss_patch.launcher.results import Status
from tests.launcher.conftest import resolve, rows
from tests.launcher.recorded import facts


def checks_for(inst, environ=None, **options):
    return preflight.run_checks(resolve(inst, environ, **options))


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
    result = CliRunner().invoke(app, ["status", "--python", installs["0.22.1"].python, "--json"])
    assert result.exit_code == 0, result.output
    patches = {p["id"]: p for p in json.loads(result.stdout)["patches"]}
    assert "bypassed while VLLM_USE_RUST_FRONTEND=1" in patches["harmony_instructions"]["reason"]
    assert "warnings" not in patches["marlin_atomic_add_sm121"]  # the engine side still runs in Python


def test_status_says_nothing_of_the_rust_frontend_where_vllm_does_not_read_it(installs, monkeypatch):
    """0.17.1 never reads the variable: status with it set is status without it, its patches applied, none bypassed."""
    command = ["status", "--python", installs["0.17.1"].python, "--json"]
    monkeypatch.delenv("VLLM_USE_RUST_FRONTEND", raising=False)
    unset = CliRunner().invoke(app, command)
    monkeypatch.setenv("VLLM_USE_RUST_FRONTEND", "1")
    result = CliRunner().invoke(app, command)
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
    assert printed == ["G11", "G26", "G27", "G28", "G29", "G30", "G31", "G32"]
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
