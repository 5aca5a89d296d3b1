"""Run-to-run reproducibility of the MoE kernel a plan selects: the `reproducibility` row of serve and doctor, and
`--deterministic`, which gives the sm90 profile's Marlin pin back for vLLM's Triton MXFP4 kernel.

Why (docs/performance.md#numerics-does-the-faster-profile-serve-the-same-model; vLLM 0.20.2's source): Marlin's MoE GEMM cuts the K dimension of its tiles
into stripes across thread blocks, and the stripes are sized from the number of token blocks in the whole batch
(`parallel` = padded tokens / moe_block_size; `iters` = k_tiles * n_tiles * parallel / grid size, with the grid
and moe_block_size themselves chosen from the batch's token count). The fp32 partial sums of a token are
therefore added in an order that depends on the other tokens in the same forward pass. A fixed batch gives
bitwise the same result (the cross-block reduction is serialized; the MoE path passes use_atomic_add=False, so
VLLM_MARLIN_USE_ATOMIC_ADD plays no part), but a server batches each prompt with whatever else is scheduled in
that step, so the prompt pass varies from run to run; decode at one stream, always a batch of one, does not.
vLLM itself marks MarlinExperts as not batch-invariant (VLLM_BATCH_INVARIANT=1 refuses it, and gpt-oss's MXFP4
Triton experts too), so there is no setting that makes Marlin reproducible; the Triton MXFP4 kernel was
bitwise reproducible on the H100 (vanilla against itself, 344 positions).
"""

from __future__ import annotations

import dataclasses

from gptoss_patch.errors import UsageError
from gptoss_patch.launcher.results import Check, LaunchPlan, Setting, Status

NAME = "reproducibility"
WHY_NOT = (
    "Marlin's MoE kernel sums a token's partial products in an order set by the rest of its batch, so the prompt "
    "pass varies from run to run under concurrent load (decode at one stream does not)"
)
GET_IT_BACK = "gptoss-patch serve --deterministic (vLLM's Triton MXFP4 kernel), or -- --moe-backend triton"


def marlin_setting(plan: LaunchPlan) -> Setting | None:
    """The profile's setting that puts the experts on Marlin (flag or environment variable), if it is kept."""
    for setting in plan.settings:
        if setting.kind == "flag" and setting.name == "--moe-backend" and setting.values == ("marlin",):
            return setting
        if setting.kind == "env" and setting.name == "VLLM_MXFP4_USE_MARLIN" and setting.values[0].lower() in ("1", "true"):
            return setting
    return None


def user_backend(plan: LaunchPlan) -> str | None:
    """The user's own --moe-backend after -- (the last one wins, as in argparse)."""
    from gptoss_patch.launcher import static

    return static.last_value(plan.extra_args, "--moe-backend")


def uses_marlin(plan: LaunchPlan) -> bool:
    chosen = user_backend(plan)
    if chosen is not None:
        return chosen == "marlin"
    return marlin_setting(plan) is not None or plan.env.get("VLLM_MXFP4_USE_MARLIN", "").lower() in ("1", "true")


def checks(plan: LaunchPlan, *, deterministic: bool = False) -> tuple[Check, ...]:
    """One row where it matters: Marlin chosen (a warning that says what is given up and how to get it back), or
    --deterministic asked for (a pass that says what it did)."""
    if uses_marlin(plan):
        source = "your --moe-backend marlin" if user_backend(plan) == "marlin" else f"the {plan.profile} profile's Marlin MoE kernel"
        return (Check(NAME, Status.WARN, f"{source} gives up run-to-run reproducibility of the prompt pass: {WHY_NOT}", fix=GET_IT_BACK),)
    if deterministic:
        return (
            Check(NAME, Status.PASS, "--deterministic: the experts run on vLLM's Triton MXFP4 kernel (no Marlin), bitwise reproducible on an H100"),
        )
    return ()


def make_deterministic(plan: LaunchPlan) -> LaunchPlan:
    """--deterministic: the profile's Marlin pin replaced by `--moe-backend triton` where the pin is the sm90
    speed choice; refused where Marlin is the only MXFP4 kernel stock vLLM has (SM12x), or the user named it."""
    if user_backend(plan) == "marlin":
        raise UsageError("--deterministic contradicts --moe-backend marlin after --", hint=GET_IT_BACK)
    pin = marlin_setting(plan)
    if pin is None:
        return plan
    if plan.profile != "sm90":
        raise UsageError(
            f"--deterministic: on {plan.profile} stock vLLM has no MXFP4 MoE kernel but Marlin, which is not "
            "batch-invariant; serve one request at a time (-- --max-num-seqs 1) for reproducible outputs"
        )
    caps = plan.capabilities
    choices = getattr(getattr(caps, "moe", None), "choices", ()) or ()
    note = f"{' '.join(pin.argv)} left out: --deterministic ({WHY_NOT})"
    settings = [s for s in plan.settings if s is not pin]
    if "triton" in choices:
        settings.append(
            Setting.flag("--moe-backend", "triton", why="--deterministic: vLLM's Triton MXFP4 kernel, reproducible run to run")
        )
    return dataclasses.replace(plan, settings=tuple(settings), notes=(*plan.notes, note), expected_moe=None)
