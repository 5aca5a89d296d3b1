"""Every pre-flight check in one ordered tuple, which prepare() runs for `serve`, `doctor`, `bench`, `numerics` and
`tune` alike.

One signature: a check takes the LaunchPlan and returns its rows (a sequence of Check, empty when it has nothing to
say). The order is the order a reader fixes things in: the GPUs and the target, the patches, the environment and the
flags, what the server needs at run time, the traps of recent releases, whether it can start at all, and last what
the launch gives up (reproducibility). A check lives in the module of its concern (preflight.py: target, flags, GPUs;
serving_traps.py: the traps of recent releases; reproducibility.py: Marlin's trade) and is listed here:
tests/test_layout.py fails on a `check_*` function of the launcher that is not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gptoss_patch.launcher import preflight as pre, reproducibility, serving_traps as traps
from gptoss_patch.launcher.results import Check, LaunchPlan

CHECKS: tuple[Callable[[LaunchPlan], Sequence[Check]], ...] = (
    pre.check_gpu,
    pre.check_parallel,
    pre.check_patches,
    pre.check_instructions,
    pre.check_environment,
    pre.check_flags,
    pre.check_vocabulary,
    pre.check_security,
    pre.check_capture_sizes,
    pre.check_moe_backend,
    traps.check_harmony_providers,
    traps.check_rust_frontend,
    traps.check_tool_parser,
    traps.check_forced_moe_on_gb10,
    traps.check_kv_cache_skip,
    traps.check_structured_outputs,
    traps.check_flashinfer_moe_build,
    traps.check_flashinfer_moe_accuracy,
    traps.check_batch_invariance,
    traps.check_structured_output_advisory,
    traps.check_checkpoint_quantization,
    traps.check_reasoning_effort_map,
    pre.check_launchability,
    reproducibility.check_reproducibility,
)


def run(plan: LaunchPlan) -> tuple[Check, ...]:
    """Every check's rows, in CHECKS' order."""
    return tuple(row for check in CHECKS for row in check(plan))
