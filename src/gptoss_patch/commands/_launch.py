"""Options and presentation shared by the commands that start vLLM: serve, doctor, bench, numerics (private: cli.py registers only public modules).

Their launch options are one clikit.Group (`LaunchGroup` and its variants), which reaches the command as one
LaunchRequest, and launcher.prepare.prepare() is their one launch path.
"""

from __future__ import annotations

import functools
import inspect
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from gptoss_patch import clikit
from gptoss_patch.launcher import PROFILES
from gptoss_patch.launcher.prepare import LOOPBACK, LaunchRequest
from gptoss_patch.options import PythonOption, VenvOption, VllmOption, VocabOption

if TYPE_CHECKING:  # the launcher is imported when a launcher command runs, not when the CLI starts
    from gptoss_patch.launcher.prepare import Prepared
    from gptoss_patch.launcher.results import Check, LaunchPlan

ModelArgument = Annotated[str, clikit.Argument(help="Model id or local path, as for `vllm serve`.", show_default=False)]
ModelOptionalArgument = Annotated[str | None, clikit.Argument(help="Model id or path to check (optional).", show_default=False)]
GpuOption = Annotated[
    str | None,
    clikit.Option("--gpu", metavar="PROFILE", help=f"GPU profile: {'|'.join(PROFILES)}. Default: nvidia-smi's compute capability.", show_default=False),
]
ConcurrencyOption = Annotated[
    str | None,
    clikit.Option(
        "--concurrency", metavar="N,N,...", show_default=False,
        help="The concurrencies you serve at (parallel requests, e.g. 1,5,10). CUDA graphs are captured for them (G20).",
    ),
]
HostOption = Annotated[str, clikit.Option("--host", help="Address vLLM binds.")]
PortOption = Annotated[int, clikit.Option("--port", help="The port the server listens on.")]
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
TunedOption = Annotated[
    bool,
    clikit.Option(
        "--tuned/--no-tuned",
        help="Use the profile `gptoss-patch tune` measured for this GPU, vLLM and model shape, when there is one "
        "(--no-tuned: the built-in profile alone).",
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
    int, clikit.Option("--port", help="The port the server listens on. Several servers: the first one's; the others take the next ports.")
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


def _request(*, extra: list[str] | None, **given: Any) -> LaunchRequest:
    """The group's one value: the words after -- as extra_args, every other member as given."""
    return LaunchRequest(extra_args=tuple(extra or ()), **given)


def _launch_group(*, servers: bool, model_optional: bool) -> clikit.Group:
    """The launch option group, declared once; the constants below give each command its variant.

    serve and doctor: one server for clients (--concurrency, --host, --allow-unauthenticated, --expect-reasoning,
    --tuned/--no-tuned). `servers`: bench, numerics and tune, which start servers on loopback for themselves; their
    clients read no reasoning (expect_reasoning), they measure the built-in profile (no tuned one), and the port is
    the first of theirs.
    """
    model = (ModelOptionalArgument, None) if model_optional else (ModelArgument, inspect.Parameter.empty)
    serving = {"concurrency": (ConcurrencyOption, None), "host": (HostOption, LOOPBACK)}
    port = {"port": (ServersPortOption if servers else PortOption, 8000)}
    clients = {
        "allow_unauthenticated": (AllowUnauthenticatedOption, False),
        "expect_reasoning": (ExpectReasoningOption, False),
        "tuned": (TunedOption, True),
    }
    members = {
        "model": model, "extra": (ExtraArgs, None), "gpu": (GpuOption, None), **({} if servers else serving), **port,
        "allow_unpatched": (AllowUnpatchedOption, False), **({} if servers else clients),
        "instructions": (InstructionsOption, None), "fast_moe": (FastMoeOption, False), "python": (PythonOption, None),
        "venv": (VenvOption, None), "vllm": (VllmOption, None), "vocab": (VocabOption, None),
    }  # fmt: skip
    # bench, numerics and tune: fixed values, their clients read no reasoning and they measure the built-in profile
    make = functools.partial(_request, expect_reasoning=True, tuned=False) if servers else _request
    return clikit.Group(make, members)


# A command's `launch: ...LaunchGroup` parameter becomes the group's options where it stands (first: MODEL, the
# words after --, then the options) and reaches it as one LaunchRequest.
LaunchGroup = Annotated[LaunchRequest, _launch_group(servers=False, model_optional=False)]  # serve
DoctorLaunchGroup = Annotated[LaunchRequest, _launch_group(servers=False, model_optional=True)]
ServersLaunchGroup = Annotated[LaunchRequest, _launch_group(servers=True, model_optional=False)]  # bench, numerics
TuneLaunchGroup = Annotated[LaunchRequest, _launch_group(servers=True, model_optional=True)]


def show_tuned(plan: LaunchPlan) -> None:
    """serve and doctor: the tuned profile's one line (used: info; stale or corrupt: a warning, never silent)."""
    from gptoss_patch import render

    if plan.tuned is not None:
        (render.info if plan.tuned.state == "used" else render.warn)(plan.tuned.line)


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


def gate(prepared: Prepared) -> None:
    """serve, bench, numerics: the rows that need attention, then exit 1 when one failed (doctor shows every row)."""
    show_checks(prepared.checks, everything=False)
    prepared.require_passing()
