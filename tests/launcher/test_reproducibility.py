"""launcher/reproducibility.py on real plans (0.33.0's recorded facts, tests/launcher/recorded.py): the sm90 profile
leaves the MoE kernel to vLLM and has no row; --fast-moe pins Marlin and warns; on SM12x Marlin stays pinned, warns,
and --fast-moe changes nothing."""

from __future__ import annotations

from gptoss_patch.launcher import profiles, reproducibility
from gptoss_patch.launcher.results import Status
from tests.launcher.conftest import free_port, resolve

MODEL_120B = "openai/gpt-oss-120b"


def test_the_sm90_profile_runs_the_experts_on_vllms_kernel_and_has_no_row(recorded) -> None:
    plan = resolve(recorded["0.33.0"], model=MODEL_120B, gpu="sm90")
    assert "--moe-backend" not in plan.argv and profiles.SM90_MOE_NOTE in plan.notes
    assert reproducibility.checks(plan) == ()


def test_fast_moe_pins_marlin_on_sm90_and_warns_what_it_gives_up(recorded) -> None:
    plan = resolve(recorded["0.33.0"], model=MODEL_120B, gpu="sm90", fast_moe=True)
    assert plan.argv[plan.argv.index("--moe-backend") + 1] == "marlin" and profiles.SM90_MOE_NOTE not in plan.notes
    (check,) = reproducibility.checks(plan)
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
    (check,) = reproducibility.checks(fast)
    assert check.status is Status.WARN and check.message.startswith("the sm121 profile's Marlin MoE kernel gives up accuracy")
    assert check.fix.startswith("-- --max-num-seqs 1 (one request at a time")
