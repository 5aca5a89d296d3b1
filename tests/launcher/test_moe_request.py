"""plan.moe_request, the one reader of "which MoE backend did this launch ask for", on real plans (the recorded facts
of the wheels, tests/launcher/recorded.py), and the rows that read it: reproducibility (G46), G29, G32/G47, G45.

What vLLM does, read on the wheels (0.17.1, 0.19.1-0.24.0, 0.33.0): `--moe-backend` is lower-cased with - read as _
(arg_utils' `type`), as is `--kernel-config`'s moe_backend (KernelConfig's validator); a flag other than `auto`
overrides the kernel config; only then does the MXFP4 selector read its variables (up to 0.23), in its order
(VLLM_USE_FLASHINFER_MOE_MXFP4_BF16 before VLLM_MXFP4_USE_MARLIN), each as bool(int(value)); 0.17-0.18 have the
flag and ignore it; before 0.21 the LoRA branch comes before any named backend. Each case here was read another
way by one of the four copies this function replaced.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from packaging.version import Version

from gptoss_patch.launcher import checks, plan as planning, reproducibility
from gptoss_patch.launcher.results import LaunchPlan, Status
from tests.launcher.conftest import resolve, rows
from tests.launcher.recorded import facts

MODEL_120B = "openai/gpt-oss-120b"
BATCH_INVARIANT = {"VLLM_BATCH_INVARIANT": "1"}


def request(inst, environ=None, **options) -> planning.MoeRequest | None:
    return planning.moe_request(resolve(inst, environ, model=MODEL_120B, **options))


def reproducibility_row(inst, environ=None, **options):
    return reproducibility.check_reproducibility(resolve(inst, environ, model=MODEL_120B, **options))


def as_release(plan: LaunchPlan, version: str) -> LaunchPlan:
    """`plan` as another release reads it: its version and its recorded capabilities (releases whose patch states are
    not laid out; the settings stay those of the plan's own release)."""
    inst = dataclasses.replace(plan.installation, version=Version(version))
    return dataclasses.replace(plan, installation=inst, capabilities=facts(version).capabilities)


# -- spellings ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [("--moe-backend", "MARLIN"), ("--moe_backend=Marlin",), ("--moe-backend", "marlin")])
def test_the_flag_is_read_as_vllm_reads_it_in_any_case(recorded, args):
    asked = request(recorded["0.33.0"], gpu="sm90", extra_args=args)
    assert asked is not None and (asked.backend, asked.how, asked.ours) == ("marlin", "flag", False)
    (row,) = reproducibility_row(recorded["0.33.0"], gpu="sm90", extra_args=args)
    assert row.message.startswith("your --moe-backend marlin gives up accuracy")


def test_a_mixed_case_marlin_replacing_the_sm121_pin_is_still_checked_in_the_log(recorded):
    plan = resolve(recorded["0.33.0"], model=MODEL_120B, gpu="sm121", extra_args=("--moe-backend", "Marlin"))
    assert "--moe-backend Marlin" in plan.command_line and plan.expected_moe == "MARLIN"


@pytest.mark.parametrize(
    "args",
    [
        ("--kernel-config.moe_backend", "marlin"),
        ("--kernel_config.moe_backend=MARLIN",),
        ("--kernel-config", json.dumps({"moe_backend": "marlin"})),
    ],
)
def test_the_kernel_config_names_the_backend_too(recorded, args):
    asked = request(recorded["0.33.0"], gpu="sm90", extra_args=args)
    assert asked is not None and (asked.backend, asked.how) == ("marlin", "kernel-config")
    (row,) = reproducibility_row(recorded["0.33.0"], gpu="sm90", extra_args=args)
    assert row.status is Status.WARN and row.message.startswith("your --kernel-config")


def test_dotted_kernel_config_keys_replace_a_json_one_as_in_vllms_parser(recorded):
    # FlexibleArgumentParser merges the dotted keys into one --kernel-config it appends last: the JSON one is gone
    args = ("--kernel-config", json.dumps({"moe_backend": "marlin"}), "--kernel-config.enable_flashinfer_autotune", "true")
    assert request(recorded["0.33.0"], gpu="sm90", extra_args=args) is None


def test_a_flag_other_than_auto_wins_over_the_kernel_config(recorded):
    args = ("--kernel-config.moe_backend", "marlin", "--moe-backend", "triton")
    asked = request(recorded["0.33.0"], gpu="sm90", extra_args=args)
    assert asked is not None and (asked.backend, asked.how) == ("triton", "flag")
    assert reproducibility_row(recorded["0.33.0"], gpu="sm90", extra_args=args) == ()


@pytest.mark.parametrize(("value", "on"), [("1", True), (" 1", True), ("2", True), ("0", False), ("true", False), ("", False)])
def test_the_marlin_variable_is_on_as_vllm_reads_it_bool_of_int(recorded, value, on):
    # maybe_convert_bool: bool(int(value)); int("true") raises, so vLLM never runs Marlin for it
    asked = request(recorded["0.22.1"], {"VLLM_MXFP4_USE_MARLIN": value}, gpu="sm90")
    assert (asked is not None and asked.backend == "marlin") is on
    found = reproducibility_row(recorded["0.22.1"], {"VLLM_MXFP4_USE_MARLIN": value}, gpu="sm90")
    assert [row.message.split(" gives up")[0] for row in found] == ([f"your VLLM_MXFP4_USE_MARLIN={value}"] if on else [])


def test_the_marlin_variable_names_nothing_once_vllm_no_longer_reads_it(recorded):
    plan = resolve(recorded["0.22.1"], {"VLLM_MXFP4_USE_MARLIN": "1"}, model=MODEL_120B, gpu="sm90")
    assert planning.moe_request(plan) is not None and planning.moe_request(as_release(plan, "0.24.0")) is None


# -- precedence ------------------------------------------------------------------------------------------------


def test_moe_backend_auto_leaves_the_choice_to_the_variables(recorded):
    args = ("--moe-backend", "auto")
    asked = request(recorded["0.22.1"], {"VLLM_MXFP4_USE_MARLIN": "1"}, gpu="sm90", extra_args=args)
    assert asked is not None and (asked.backend, asked.how, asked.spelling) == ("marlin", "env", "VLLM_MXFP4_USE_MARLIN=1")
    (row,) = reproducibility_row(recorded["0.22.1"], {"VLLM_MXFP4_USE_MARLIN": "1"}, gpu="sm90", extra_args=args)
    assert row.fix == "unset VLLM_MXFP4_USE_MARLIN, or -- --moe-backend triton"


def test_flashinfers_bf16_variable_is_read_before_the_marlin_one(recorded):
    environ = {"VLLM_USE_FLASHINFER_MOE_MXFP4_BF16": "1", "VLLM_MXFP4_USE_MARLIN": "1", **BATCH_INVARIANT}
    asked = request(recorded["0.22.1"], environ, gpu="sm90")
    assert asked is not None and (asked.backend, asked.name) == ("flashinfer_cutlass", "VLLM_USE_FLASHINFER_MOE_MXFP4_BF16")
    assert reproducibility_row(recorded["0.22.1"], environ, gpu="sm90") == ()  # the experts run on FlashInfer
    (row,) = rows(checks.run(resolve(recorded["0.22.1"], environ, model=MODEL_120B, gpu="sm90")), "batch-invariance")
    assert row.status is Status.FAIL and "with the flashinfer_cutlass MoE backend" in row.message


def test_fast_moe_wins_over_the_flashinfer_variable_so_no_flashinfer_rows(recorded):
    # the profile's --moe-backend marlin is not auto: the oracle never reads the variable
    plan = resolve(recorded["0.22.1"], {"VLLM_USE_FLASHINFER_MOE_MXFP4_BF16": "1"}, model=MODEL_120B, gpu="sm90",
                   fast_moe=True, allow_unpatched=True)
    asked = planning.moe_request(plan)
    assert asked is not None and (asked.backend, asked.how, asked.ours) == ("marlin", "flag", True)
    assert rows(checks.run(plan), "moe-build") == []
    (row,) = reproducibility.check_reproducibility(plan)
    assert row.message.startswith("--fast-moe (Marlin's MoE kernel)")


def test_flashinfers_mxfp8_variable_is_a_named_backend_under_batch_invariance(recorded):
    # the sm100 profile sets it where vLLM reads it undeprecated (0.20-0.21); 0.22.1 still reads it
    environ = {"VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8": "1", **BATCH_INVARIANT}
    plan = resolve(recorded["0.22.1"], environ, model=MODEL_120B, gpu="sm100", allow_unpatched=True)
    asked = planning.moe_request(plan)
    assert asked is not None and (asked.backend, asked.ours) == ("flashinfer_trtllm", False)
    (row,) = rows(checks.run(plan), "batch-invariance")
    assert (row.status, row.issue) == (Status.FAIL, "G45") and "with the flashinfer_trtllm MoE backend" in row.message


def test_the_flag_names_nothing_where_the_selector_ignores_it(recorded):
    # 0.17.1 registers --moe-backend, but its MXFP4 selector (quantization/mxfp4.py) never reads it
    assert request(recorded["0.17.1"], gpu="sm90", extra_args=("--moe-backend", "marlin")) is None
    assert reproducibility_row(recorded["0.17.1"], gpu="sm90", extra_args=("--moe-backend", "marlin")) == ()


def test_before_021_lora_puts_the_experts_on_marlin_whatever_backend_is_named(recorded):
    # 0.20.2's select_gpt_oss_mxfp4_moe_backend returns from its LoRA branch before it reads config.moe_backend
    args = ("--enable-lora", "--moe-backend", "triton")
    plan = resolve(recorded["0.22.1"], model=MODEL_120B, gpu="sm90", extra_args=args, allow_unpatched=True)
    assert reproducibility.check_reproducibility(plan) == ()  # from 0.21 the named backend is asked (and refuses LoRA)
    (row,) = reproducibility.check_reproducibility(as_release(plan, "0.20.2"))
    assert row.issue == "G46" and row.message.startswith("--enable-lora puts gpt-oss's experts on Marlin")


def test_forced_gb10_backends_are_read_in_any_spelling(recorded):
    plan = resolve(recorded["0.22.1"], model=MODEL_120B, gpu="sm121", extra_args=("--moe-backend", "Humming"))
    (row,) = [c for c in checks.run(plan) if c.issue == "G29"]
    assert row.message.startswith("--moe-backend humming on GB10 (SM121)")
    # the sm121 profile's --moe-backend marlin is not auto, so vLLM never reads a kernel config's humming
    pinned = resolve(recorded["0.22.1"], model=MODEL_120B, gpu="sm121", extra_args=("--kernel-config.moe_backend", "humming"))
    assert [c for c in checks.run(pinned) if c.issue == "G29"] == []
