"""Default Marlin atomic-add reduce to on for SM121 (GB10) when VLLM_MARLIN_USE_ATOMIC_ADD is unset.

Only dense Marlin linear layers call `should_use_atomic_add_reduce`: stock vLLM's Marlin MoE path has
passed use_atomic_add=False since 0.12.0 (0.10.1.1-0.11.2 turned it on for capability >= 9 by themselves),
so on stock gpt-oss, whose MXFP4 weights are only the experts, this patch changes dense Marlin layers only.
The SM12x Marlin-MoE race that the folklore attributes to atomic add was fixed in the 0.23.0 build
(vllm#40923, MARLIN_MOE_ARCHS). Atomic-add reduce trades run-to-run determinism for speed. The MoE files
are watched: if upstream routes the MoE through the check (vllm#48569 proposes it), `status` says so,
because the patch would then also change gpt-oss's experts.
"""

from typing import TYPE_CHECKING

from gptoss_patch.patches import _shapes
from gptoss_patch.spec import Band, PackageView, PatchSpec, module_id

if TYPE_CHECKING:
    from gptoss_patch.patches._base import PatchCodemod

FUNCTION = "should_use_atomic_add_reduce"
# The Marlin MoE GEMM calls: fused_marlin_moe.py through 0.20.x, experts/marlin_moe.py from 0.21.0.
MOE_FILES = (
    "model_executor/layers/fused_moe/fused_marlin_moe.py",
    "model_executor/layers/fused_moe/experts/marlin_moe.py",
)
HELPER = "_gptoss_patch_sm121_atomic_add_default"
ENV = "VLLM_MARLIN_USE_ATOMIC_ADD"

HELPER_SOURCE = f'''
def {HELPER}(device) -> bool:
    """gptoss-patch marlin_atomic_add_sm121: atomic-add reduce by default on SM121 (GB10).

    Applies only while {ENV} is absent from the environment: =0 still disables it, =1 enables it
    as before. Sibling modules import {FUNCTION} by name; they share this module's function object.
    """
    import os

    import torch

    if "{ENV}" in os.environ:
        return False
    return tuple(torch.cuda.get_device_capability(device)) == (12, 1)
'''


def codemod() -> "type[PatchCodemod]":
    import libcst as cst

    from gptoss_patch.patches._base import PatchCodemod, code, defines

    env_disabled = f"notenvs.{ENV}"  # `if not envs.VLLM_MARLIN_USE_ATOMIC_ADD:`, whitespace removed

    class MarlinAtomicAddSm121(PatchCodemod):
        ANCHOR = f"{FUNCTION}: `if not envs.{ENV}:`"
        HELPER_SOURCE = HELPER_SOURCE

        def in_scope(self, statement: cst.BaseStatement) -> bool:
            return defines(statement, FUNCTION)

        def leave_If(self, original: cst.If, updated: cst.If) -> cst.If:
            if code(updated.test) != env_disabled:
                return updated
            self.hit()
            helper_call = cst.parse_expression(f"not {HELPER}(device)")
            return updated.with_changes(test=cst.BooleanOperation(left=updated.test, operator=cst.And(), right=helper_call))

    return MarlinAtomicAddSm121


def is_applied(source: str, _package: PackageView) -> bool:
    return _shapes.top_level_function(source, HELPER) and any(
        _shapes.calls(f, HELPER) for f in _shapes.functions(source, FUNCTION)
    )


def moe_uses_the_check(package: PackageView) -> str | None:
    """Whether a Marlin MoE file calls the check this patch changes (stock: never; see the module docstring)."""
    for rel in MOE_FILES:
        text = package.read_text(rel)
        if text is not None and f"{FUNCTION}(" in text:
            return (
                f"{rel} calls {FUNCTION}: on SM121 this patch now also turns atomic-add reduce on for the Marlin MoE "
                "(gpt-oss's experts), whose results then vary from run to run; set VLLM_MARLIN_USE_ATOMIC_ADD=0 to keep them deterministic"
            )
    return None


SPEC = PatchSpec(
    id=module_id(__name__),
    summary="On SM121 (GB10), Marlin uses atomic-add reduce unless VLLM_MARLIN_USE_ATOMIC_ADD is set.",
    upstream=(
        "https://github.com/vllm-project/vllm/pull/40923",
        "https://github.com/vllm-project/vllm/issues/37030",
    ),
    bands=(Band(">=0.15.1", "model_executor/layers/quantization/utils/marlin_utils.py"),),
    codemod=codemod,
    is_applied=is_applied,
    note=(
        "Stock vLLM's Marlin MoE path has passed use_atomic_add=False since 0.12.0, so on stock gpt-oss this changes "
        "dense Marlin layers only; `status` warns if a release routes the MoE through the check. Atomic-add reduce "
        "makes results vary from run to run (VLLM_MARLIN_USE_ATOMIC_ADD=0 keeps them deterministic)."
    ),
    reads=MOE_FILES,
    watch=moe_uses_the_check,
)
