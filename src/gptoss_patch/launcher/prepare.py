"""The one launch path of every command that starts vLLM (serve, doctor, bench, numerics, tune): `prepare()`.

resolve the target -> the plan (serve and doctor: with `tune`'s profile for this stack, unless --no-tuned) -> can it
start (executable, model, port) -> the GPU layout -> every pre-flight check, in that order. Bad input stops with one
error (its exit code, its hint) before anything starts, the same in every command; the checks come back as data for
the command to print.

Light at import (the CLI builds its options from `LaunchRequest`); the launcher is imported when prepare() runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gptoss_patch.errors import CheckFailed

if TYPE_CHECKING:
    from gptoss_patch.launcher.results import Check, LaunchPlan
    from gptoss_patch.target import Installation

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class LaunchRequest:
    """The launch options as the command line gave them, one value for every command that starts vLLM.

    Validated by prepare() (launch_options), while the target interpreter answers."""

    model: str | None
    extra_args: tuple[str, ...] = ()  # `vllm serve` arguments after --
    gpu: str | None = None  # --gpu PROFILE; None: nvidia-smi's compute capability
    concurrency: str | None = None  # --concurrency N,N,...: the CUDA-graph sizes
    host: str = LOOPBACK
    port: int = 8000
    allow_unpatched: bool = False
    allow_unauthenticated: bool = False
    expect_reasoning: bool = False
    instructions: str | None = None  # developer|system
    fast_moe: bool = False
    vocab: Path | None = None
    python: str | None = None  # the target: --python, --venv, else $VIRTUAL_ENV, else our own interpreter
    venv: str | None = None
    vllm: str | None = None  # --vllm VERSION: the version asserted
    tuned: bool = True  # serve and doctor: use `gptoss-patch tune`'s profile for this stack (--no-tuned: not)


@dataclass(frozen=True)
class Prepared:
    """A launch that may start: its plan and every pre-flight check, in the order a reader fixes things."""

    plan: LaunchPlan
    checks: tuple[Check, ...]

    @property
    def failed(self) -> tuple[str, ...]:
        from gptoss_patch.launcher.results import Status

        return tuple(dict.fromkeys(c.name for c in self.checks if c.status is Status.FAIL))

    def require_passing(self) -> None:
        """A failed check stops a command that would start vLLM (exit 1; `doctor` shows every row)."""
        if self.failed:
            raise CheckFailed(
                f"pre-flight failed ({', '.join(self.failed)}); nothing was started",
                hint="gptoss-patch doctor shows every check",
            )


def prepare(
    request: LaunchRequest, *, notify: Callable[[str], None], starts: bool = True, port: bool = True
) -> Prepared:
    """The one launch path. `notify` says which vLLM was found and, once, that another run's lock is waited for.

    Raises, one line each: a bad option (exit 2) before the target is even reported; no target or no vLLM (exit 4,
    with the hint every command gives: "no virtualenv is active" where gptoss-patch's own interpreter was taken);
    another run's lock held too long (exit 6); for a command that `starts` vLLM, a missing executable (4), model
    path or busy port (2; `port=False` for a script that runs later); GPUs that cannot run the layout (4, G33-G36).
    `doctor` (starts=False) shows the executable, model and port as rows instead.
    """
    from gptoss_patch.engine import ledger

    told = ledger.on_wait
    ledger.on_wait = notify  # a run that waits for another's lock says so once, like every other command
    try:
        plan = _plan(request, notify)
    finally:
        ledger.on_wait = told
    from gptoss_patch.launcher import checks, preflight

    if starts:
        preflight.require_launchable(plan, port=port)
    preflight.require_parallel(plan)
    return Prepared(plan, checks.run(plan))


def find_target(request: LaunchRequest) -> Installation:
    """The target interpreter's vLLM, as every command finds it (--python, --venv, $VIRTUAL_ENV, else our own)."""
    from gptoss_patch import target

    defaulted = request.python is None and request.venv is None
    return target.discover(target.interpreter_for(request.python, request.venv), request.vllm, defaulted=defaulted)


def _plan(request: LaunchRequest, notify: Callable[[str], None]) -> LaunchPlan:
    """The target lookup (a subprocess: it runs in a thread meanwhile), the validated options, then the plan.

    The options are validated while the target interpreter answers: bad input still stops before anything
    starts, and the launcher's own imports overlap the probe (time-to-exec budget: 0.3 s).
    """
    import os
    from concurrent.futures import ThreadPoolExecutor

    from gptoss_patch import target

    with ThreadPoolExecutor(max_workers=2) as pool:
        found = pool.submit(find_target, request)
        from gptoss_patch.launcher import plan as planning

        options = planning.launch_options(
            request.model, gpu=request.gpu, concurrency=request.concurrency, host=request.host, port=request.port,
            extra_args=request.extra_args, allow_unpatched=request.allow_unpatched,
            allow_unauthenticated=request.allow_unauthenticated, expect_reasoning=request.expect_reasoning,
            vocab=request.vocab, instructions=request.instructions, fast_moe=request.fast_moe,
        )  # fmt: skip
        from gptoss_patch.launcher import preflight, runner  # noqa: F401 - while the probe runs

        # hashing the 3.6 MB vocabulary costs ~15 ms: done while the target answers
        python = target.interpreter_for(request.python, request.venv)
        vocabulary = pool.submit(planning.vocabulary_choice, dict(os.environ), options.vocab, python)
        inst = found.result()
    notify(f"Detected {inst.label} at {inst.site_packages} (python {inst.python})")
    plan = planning.resolve(inst, options, vocabulary=vocabulary.result())
    if not request.tuned:
        return plan
    from gptoss_patch.tune import profile

    return planning.apply_tuned(plan, profile.lookup(plan))
