"""Options and presentation shared by the commands that start vLLM: serve, doctor, bench, numerics (private: cli.py registers only public modules)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from gptoss_patch import clikit
from gptoss_patch.launcher import PROFILES

if TYPE_CHECKING:  # the launcher is imported when a launcher command runs, not when the CLI starts
    from gptoss_patch.launcher.plan import LaunchOptions
    from gptoss_patch.launcher.results import Check, LaunchPlan

LOOPBACK = "127.0.0.1"

GpuOption = Annotated[
    str | None,
    clikit.Option("--gpu", metavar="PROFILE", help=f"GPU profile: {'|'.join(PROFILES)}. Default: nvidia-smi's compute capability.", show_default=False),
]
ConcurrencyOption = Annotated[
    str | None,
    clikit.Option("--concurrency", metavar="N,N,...", help="Batch sizes you run (e.g. 1,5,10): also captured as CUDA graphs (G20).", show_default=False),
]
HostOption = Annotated[str, clikit.Option("--host", help="Address vLLM binds.")]
PortOption = Annotated[int, clikit.Option("--port", help="Port vLLM listens on.")]
AllowUnpatchedOption = Annotated[bool, clikit.Option("--allow-unpatched", help="Start even when patches are pending or drifted.")]
AllowUnauthenticatedOption = Annotated[
    bool, clikit.Option("--allow-unauthenticated", help="Allow a non-loopback --host without an API key.")
]
ExpectReasoningOption = Annotated[
    bool, clikit.Option("--expect-reasoning", help="Your clients read `reasoning`: no warning for --reasoning-parser.")
]
InstructionsOption = Annotated[
    str | None,
    clikit.Option(
        "--instructions", metavar="developer|system",
        help="Where gpt-oss gets the client's system/developer messages (harmony_instructions, G02). developer "
        "(default, upstream's: VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS unset): every message kept as developer "
        "instructions. system (the variable at 1): the first goes into the harmony system message, and every later "
        "developer message, e.g. one after a system message, is rendered empty: its text is lost. "
        "The variable in your environment wins.",
        show_default=False,
    ),
]
FastMoeOption = Annotated[
    bool,
    clikit.Option(
        "--fast-moe",
        help="sm90: run the MXFP4 experts on Marlin's MoE kernel instead of vLLM's Triton one: faster, but less "
        "accurate against float64 and its prompt pass is not reproducible run to run (the plan's note and the "
        "reproducibility row give the figures). No change on SM12x, where Marlin is already the only kernel.",
    ),
]
ExtraArgs = Annotated[
    list[str] | None,
    clikit.Argument(metavar="[-- VLLM_SERVE_ARGS...]", help="Passed to `vllm serve` as they are, after --.", show_default=False),
]
# The options of the commands that start servers side by side (bench, numerics).
CompareOption = Annotated[
    str | None,
    clikit.Option(
        "--compare",
        metavar="vanilla|recipe|eager",
        help="Also run plain `vllm serve` (vanilla), vLLM's published Hopper config (recipe) and/or the profile with "
        "--enforce-eager, side by side (comma-separated).",
        show_default=False,
    ),
]
VariantOption = Annotated[
    list[str] | None,
    clikit.Option(
        "--variant",
        metavar="NAME=ARGS",
        help="Also run the profile with ARGS added (e.g. marlin='--moe-backend marlin'), side by side (repeatable).",
        show_default=False,
    ),
]
ServersPortOption = Annotated[
    int, clikit.Option("--port", help="The profile server's port; compared servers take the next ones.")
]
StartTimeoutOption = Annotated[
    float, clikit.Option("--start-timeout", metavar="SECONDS", help="How long the servers may take to become ready.")
]
LogDirOption = Annotated[
    Path | None,
    clikit.Option(
        "--log-dir",
        metavar="DIR",
        help="Server logs (default: a new directory in logs/ of `gptoss-patch cache dir`).",
        show_default=False,
    ),
]


def deferred_options(model: str | None, **given: Any) -> Callable[[], LaunchOptions]:
    """Validation of the command line, run by resolve_plan while the target probe runs."""

    def build() -> LaunchOptions:
        from gptoss_patch.launcher.plan import launch_options

        return launch_options(model, **given)

    return build


def resolve_plan(python: str | None, venv: str | None, vllm: str | None, build_options: Callable[[], LaunchOptions]) -> LaunchPlan:
    """Target lookup (a subprocess, so it runs in a thread meanwhile), the validated options, then the plan.

    The options are validated while the target interpreter answers: bad input still stops before anything
    starts, and the launcher's own imports overlap the probe (time-to-exec budget: 0.3 s).
    """
    import os
    from concurrent.futures import ThreadPoolExecutor

    from gptoss_patch import render, target

    with ThreadPoolExecutor(max_workers=2) as pool:
        found = pool.submit(lambda: target.discover(target.interpreter_for(python, venv), vllm))
        options = build_options()
        from gptoss_patch.launcher import plan as planning, preflight, runner  # noqa: F401 - while the probe runs

        # hashing the 3.6 MB vocabulary costs ~15 ms: done while the target answers
        vocabulary = pool.submit(planning.vocabulary_choice, dict(os.environ), options.vocab, target.interpreter_for(python, venv))
        inst = found.result()
    render.info(f"Detected {inst.label} at {inst.site_packages} (python {inst.python})")
    return planning.resolve(inst, options, vocabulary=vocabulary.result())


def show_checks(checks: tuple[Check, ...], *, everything: bool) -> None:
    """doctor shows every row; serve only what needs attention, on stderr so stdout stays vLLM's log."""
    from gptoss_patch import render
    from gptoss_patch.launcher.results import Status

    shown = checks if everything else tuple(c for c in checks if c.status is not Status.PASS)
    if shown:
        render.checks_table(shown, title=None if everything else "pre-flight", to_stdout=everything)
    for check in checks:
        if check.name == "patches" and check.status is Status.WARN:
            render.warn(check.message)  # --allow-unpatched: say it loudly, outside the table too
