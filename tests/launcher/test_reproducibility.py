"""launcher/reproducibility.py on real plans (0.33.0's recorded facts, tests/launcher/recorded.py): the sm90 profile
leaves the MoE kernel to vLLM and has no row; --fast-moe pins Marlin and warns; on SM12x Marlin stays pinned, warns,
and --fast-moe changes nothing."""

from __future__ import annotations

from gptoss_patch.launcher import profiles, reproducibility
from gptoss_patch.launcher.results import Status
from tests.launcher.conftest import resolve
from tests.support.servers import free_port

MODEL_120B = "openai/gpt-oss-120b"


def test_the_sm90_profile_runs_the_experts_on_vllms_kernel_and_has_no_row(recorded) -> None:
    plan = resolve(recorded["0.33.0"], model=MODEL_120B, gpu="sm90")
    assert "--moe-backend" not in plan.argv and profiles.SM90_MOE_NOTE in plan.notes
    assert reproducibility.check_reproducibility(plan) == ()


def test_fast_moe_pins_marlin_on_sm90_and_warns_what_it_gives_up(recorded) -> None:
    plan = resolve(recorded["0.33.0"], model=MODEL_120B, gpu="sm90", fast_moe=True)
    assert plan.argv[plan.argv.index("--moe-backend") + 1] == "marlin" and profiles.SM90_MOE_NOTE not in plan.notes
    (check,) = reproducibility.check_reproducibility(plan)
    assert check.status is Status.WARN
    assert check.message.startswith(f"--fast-moe (Marlin's MoE kernel) gives up accuracy ({profiles.MARLIN_ERROR})")
    assert "and run-to-run reproducibility of the prompt pass" in check.message
    assert check.fix == "drop --fast-moe (vLLM's Triton MXFP4 kernel on Hopper), or -- --moe-backend triton"


def test_fast_moe_on_sm121_changes_nothing_but_a_note_and_the_row_still_warns(recorded) -> None:
    port = free_port()
    plain = resolve(recorded["0.33.0"], model=MODEL_120B, gpu="sm121", port=port)
    fast = resolve(recorded["0.33.0"], model=MODEL_120B, gpu="sm121", port=port, fast_moe=True)
    assert fast.argv == plain.argv and fast.env_additions == plain.env_additions and fast.expected_moe == "MARLIN"
    assert set(fast.notes) - set(plain.notes) == {
        "--fast-moe changes nothing on sm121: Marlin is already pinned, the only MXFP4 MoE kernel stock vLLM has on SM12x"
    }
    (check,) = reproducibility.check_reproducibility(fast)
    assert check.status is Status.WARN and check.message.startswith("the sm121 profile's Marlin MoE kernel gives up accuracy")
    assert check.fix.startswith("-- --max-num-seqs 1 (one request at a time")


# -- G46: --enable-lora puts the experts on Marlin, by vLLM's own choice ---------------------------------------

LORA = ("--enable-lora",)


def test_enable_lora_makes_vllm_pick_marlin_and_the_row_fires(recorded) -> None:
    plan = resolve(recorded["0.33.0"], model=MODEL_120B, gpu="sm90", extra_args=LORA, allow_unpatched=True)
    assert "--moe-backend" not in plan.argv  # nothing in the plan names Marlin: vLLM chooses it for LoRA
    (check,) = reproducibility.check_reproducibility(plan)
    assert (check.status, check.issue) == (Status.WARN, "G46")
    assert check.message.startswith("--enable-lora puts gpt-oss's experts on Marlin (vLLM's choice for LoRA, "
                                     f"vllm#30598) and gives up accuracy ({profiles.MARLIN_ERROR})")
    assert check.fix == ("drop --enable-lora (vLLM's Triton MXFP4 experts again), or -- --max-num-seqs 1 (one "
                         "request at a time, every prompt pass a batch of one)")
    dropped = resolve(recorded["0.33.0"], model=MODEL_120B, gpu="sm90", allow_unpatched=True)
    assert reproducibility.check_reproducibility(dropped) == ()  # the fix followed


def test_the_last_lora_switch_wins_as_in_argparse(recorded) -> None:
    switched = (*LORA, "--no-enable-lora")
    plan = resolve(recorded["0.33.0"], model=MODEL_120B, gpu="sm90", extra_args=switched, allow_unpatched=True)
    assert reproducibility.check_reproducibility(plan) == ()


def test_before_0210_a_false_marlin_switch_keeps_lora_on_triton_on_hopper(recorded) -> None:
    # 0.17.1's LoRA branch (get_mxfp4_backend_with_lora): Triton only when VLLM_MXFP4_USE_MARLIN is False, else Marlin
    lora = resolve(recorded["0.17.1"], model=MODEL_120B, gpu="sm90", extra_args=LORA)
    (check,) = reproducibility.check_reproducibility(lora)
    assert check.issue == "G46"
    off = resolve(recorded["0.17.1"], {"VLLM_MXFP4_USE_MARLIN": "0"}, model=MODEL_120B, gpu="sm90", extra_args=LORA)
    assert reproducibility.check_reproducibility(off) == ()


def test_lora_on_sm121_keeps_the_profiles_own_row(recorded) -> None:
    plan = resolve(recorded["0.33.0"], model=MODEL_120B, gpu="sm121", extra_args=LORA, allow_unpatched=True)
    (check,) = reproducibility.check_reproducibility(plan)
    assert check.message.startswith("the sm121 profile's Marlin MoE kernel") and check.issue == ""


def _fixes(recorded, version: str) -> dict[str, str]:
    """The row's fix on `version` for --fast-moe and for the user's VLLM_MXFP4_USE_MARLIN=1 (each where it fires)."""
    fast = resolve(recorded[version], model=MODEL_120B, gpu="sm90", fast_moe=True, allow_unpatched=True)
    env = resolve(recorded[version], {"VLLM_MXFP4_USE_MARLIN": "1"}, model=MODEL_120B, gpu="sm90", allow_unpatched=True)
    return {name: check.fix for name, plan in (("fast-moe", fast), ("env", env))
            for check in reproducibility.check_reproducibility(plan)}


def test_the_fix_offers_moe_backend_triton_only_where_vllm_reads_the_flag(recorded) -> None:
    # 0.15.1-0.16.0 have no --moe-backend and 0.17-0.18's MXFP4 selector never reads it: a fix naming it would change
    # nothing there (or stop vLLM); from 0.19 the selector honours it.
    for version in ("0.16.0", "0.17.1"):
        fixes = _fixes(recorded, version)
        assert fixes and not any("--moe-backend" in fix for fix in fixes.values()), (version, fixes)
    fixes = _fixes(recorded, "0.22.1")
    assert set(fixes) == {"fast-moe", "env"} and all(f.endswith(", or -- --moe-backend triton") for f in fixes.values())
