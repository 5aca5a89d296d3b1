"""The `reproducibility` row of serve and doctor: what a plan gives up when gpt-oss's MXFP4 experts run on Marlin
(--fast-moe on sm90, the SM12x profiles' pin, the user's own --moe-backend marlin, or --enable-lora, for which vLLM
picks Marlin itself: G46), and how to get it back.

Why Marlin varies (vLLM 0.20.2's source): Marlin's MoE GEMM cuts the K dimension of its tiles
into stripes across thread blocks, and the stripes are sized from the number of token blocks in the whole batch
(`parallel` = padded tokens / moe_block_size; `iters` = k_tiles * n_tiles * parallel / grid size, with the grid
and moe_block_size themselves chosen from the batch's token count). The fp32 partial sums of a token are
therefore added in an order that depends on the other tokens in the same forward pass. A fixed batch gives
bitwise the same result (the cross-block reduction is serialized; the MoE path passes use_atomic_add=False, so
VLLM_MARLIN_USE_ATOMIC_ADD plays no part), but a server batches each prompt with whatever else is scheduled in
that step, so the prompt pass varies from run to run; decode at one stream, always a batch of one, does not.
vLLM itself marks MarlinExperts as not batch-invariant (VLLM_BATCH_INVARIANT=1 refuses it when it is named, and
gpt-oss's MXFP4 Triton experts too; left to choose, vLLM then runs other experts: G45), so there is no setting that
makes Marlin reproducible.

LoRA (read on the wheels): with --enable-lora and no backend named, vLLM runs gpt-oss's experts on Marlin. On
0.15.1-0.20.x its LoRA branch picks Marlin unless VLLM_MXFP4_USE_MARLIN is set to a false value on SM90-SM10x
(then the unfused Triton experts); from 0.21.0 the automatic order skips every expert class without LoRA support
(gpt-oss's OAI Triton and FlashInfer experts) and stops at MarlinExperts (vllm#30598: "Triton has accuracy issues").

What was measured (issue #24; the kernel figures and the speed are profiles.MARLIN_*, the one place for them):
Marlin's MoE output is further from float64 than that of vLLM's Triton kernel, and its reruns of one 512-token
batch on an H200 were not even bitwise equal; Triton's were, at every batch size, and batch-invariant. So the
sm90 profile leaves the experts to vLLM (Triton on Hopper) and pins Marlin only with --fast-moe; on SM12x Marlin
is the only MXFP4 MoE kernel stock vLLM has, and one request at a time (--max-num-seqs 1, every prompt pass a
batch of one) is the way to reproducible outputs there. Triton is batch-invariant in the MoE, not end to end:
the dense cuBLAS GEMMs and attention still change with the batch (the kernel check's o-projection: batch delta
3.9e-3 at 64 and 512 tokens), so stock vLLM is not bitwise reproducible under concurrent load either. With 8
prompts in flight at once on the H200, vanilla (Triton) against itself agreed on 91.8 % of top-1 tokens (median
|delta logprob| 0, 3 of 8 greedy continuations identical); the profile with Marlin against itself on 22.7 %
(median 0.32, 0 of 8). Full bitwise reproducibility under load is not something stock vLLM offers gpt-oss.
"""

from __future__ import annotations

from gptoss_patch.launcher import plan as planning, profiles, static
from gptoss_patch.launcher.plan import MoeRequest
from gptoss_patch.launcher.results import Check, LaunchPlan, Status

NAME = "reproducibility"
WHY_NOT = (
    "Marlin's MoE kernel sums a token's partial products in an order set by the rest of its batch, so the prompt "
    "pass varies from run to run under concurrent load; decode at one stream does not"
)
GIVEN_UP = f"gives up accuracy ({profiles.MARLIN_ERROR}) and run-to-run reproducibility of the prompt pass: {WHY_NOT}"
ONE_AT_A_TIME = (
    "-- --max-num-seqs 1 (one request at a time, every prompt pass a batch of one): Marlin is the only MXFP4 MoE "
    "kernel stock vLLM has on SM12x"
)


LORA_FLAG = "--enable-lora"
LORA_AUTO_FROM = (0, 21)  # from here the automatic order picks the first LoRA-capable experts: Marlin
LORA_TRITON_PROFILES = ("sm90", "sm100")  # the LoRA branch of 0.15.1-0.20.x takes Triton on SM90-SM10x only


def asked_marlin(plan: LaunchPlan) -> MoeRequest | None:
    """What names Marlin in this launch (the flag, --kernel-config, VLLM_MXFP4_USE_MARLIN; the profile's or yours),
    as vLLM decides among them (plan.moe_request)."""
    request = planning.moe_request(plan)
    return request if request is not None and request.backend == "marlin" else None


def uses_marlin(plan: LaunchPlan) -> bool:
    return lora_marlin(plan) or asked_marlin(plan) is not None


def lora_enabled(plan: LaunchPlan) -> bool:
    """--enable-lora in force (argparse keeps the last of --enable-lora / --no-enable-lora)."""
    switches = [use.name for use in static.scan_flags(plan.extra_args) if use.name in (LORA_FLAG, "--no-enable-lora")]
    return bool(switches) and switches[-1] == LORA_FLAG


def lora_marlin(plan: LaunchPlan) -> bool:
    """--enable-lora puts the experts on Marlin (G46). From 0.21.0 when no backend is named; on 0.15.1-0.20.x the
    selector's LoRA branch runs before any named backend, and takes the unfused Triton experts instead only where
    VLLM_MXFP4_USE_MARLIN is false (bool(int(value))) on SM90-SM10x."""
    if not lora_enabled(plan) or plan.profile == "cpu":
        return False
    if plan.installation.version.release[:2] < LORA_AUTO_FROM:
        marlin_off = planning.env_switch(plan.env, planning.MARLIN_ENV) is False
        return not (plan.profile in LORA_TRITON_PROFILES and marlin_off)
    return planning.moe_request(plan) is None


def check_reproducibility(plan: LaunchPlan) -> tuple[Check, ...]:
    """One row where the experts run on Marlin: a warning that names both properties given up and the fix.
    No row otherwise: the experts then run on the kernel vLLM chose, and stock vLLM gives up nothing more."""
    if not uses_marlin(plan):
        return ()
    issue = "G46" if _lora_only(plan) else ""
    return (Check(NAME, Status.WARN, f"{_source(plan)} {GIVEN_UP}", fix=_fix(plan), issue=issue),)


def _lora_only(plan: LaunchPlan) -> bool:
    """Marlin because of --enable-lora alone: nothing in the plan names it."""
    return lora_marlin(plan) and asked_marlin(plan) is None


def _source(plan: LaunchPlan) -> str:
    asked = asked_marlin(plan)
    if asked is None:  # _lora_only
        return f"{LORA_FLAG} puts gpt-oss's experts on Marlin (vLLM's choice for LoRA, vllm#30598) and"
    if not asked.ours:
        return f"your {asked.spelling}"
    if plan.profile in profiles.SM12X:
        return f"the {plan.profile} profile's Marlin MoE kernel"
    return "--fast-moe (Marlin's MoE kernel)"


def _fix(plan: LaunchPlan) -> str:
    asked = asked_marlin(plan)
    if asked is None:  # _lora_only
        return (f"drop {LORA_FLAG} (vLLM's Triton MXFP4 experts again), or -- --max-num-seqs 1 (one request at a time, "
                "every prompt pass a batch of one)")
    if plan.profile in profiles.SM12X:
        return ONE_AT_A_TIME
    # `--moe-backend triton` only where the MXFP4 selector honours the flag (0.19+): 0.15.1-0.16.0 lack it and
    # 0.17-0.18 ignore it, so offering it there would be a hint that changes nothing
    triton = f", or -- {planning.MOE_FLAG} triton" if profiles.moe_flag_selects(plan.capabilities, "triton") else ""
    if asked.ours:
        return f"drop --fast-moe (vLLM's Triton MXFP4 kernel on Hopper){triton}"
    if asked.how == "env":
        return f"{asked.undo}{triton}"
    return f"-- {planning.MOE_FLAG} triton (vLLM's Triton MXFP4 kernel) instead of marlin"  # the user's flag: read here
