"""The servers of a bench run, from the launcher's plan: the profile, vanilla, recipe, eager and each --variant, each on
its own port and with its share of GPU memory; and what `--bound` compares against."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gptoss_patch.bench.recipe import DISTORTED_BY_STREAM_INTERVAL, SOURCE, RecipeArgs, hopper_args, stream_interval
from gptoss_patch.bench.spec import SHARED_MEMORY_UTILIZATION, ServerSpec
from gptoss_patch.bench.stats import BenchReport

if TYPE_CHECKING:
    from gptoss_patch.bench.bound import Bound
    from gptoss_patch.launcher.results import Check, LaunchPlan
    from gptoss_patch.model import Recipe

LOOPBACK = "127.0.0.1"  # every bench server listens here only


def memory_share(servers: int, user_args: tuple[str, ...], gpu: str | None) -> tuple[str, ...]:
    """Servers sharing one GPU each take a part of its memory, unless the user set the fraction."""
    if servers == 1 or gpu == "cpu" or any(arg.startswith("--gpu-memory-utilization") for arg in user_args):
        return ()
    share = SHARED_MEMORY_UTILIZATION if servers == 2 else f"{0.88 / servers:.2f}"
    return ("--gpu-memory-utilization", share)


def server_specs(
    plan: LaunchPlan, port: int, comparisons: Sequence[str], variants: Sequence[tuple[str, tuple[str, ...]]]
) -> list[ServerSpec]:
    """The profile on `port`, then the compared servers and the variants on the next ports, in that order."""
    specs = [profile_spec(plan, port)] + [compared_spec(plan, name, port + i) for i, name in enumerate(comparisons, 1)]
    specs += [variant_spec(plan, name, args, port + len(specs) + i) for i, (name, args) in enumerate(variants)]
    return specs


def gpu_count(argv: Sequence[str]) -> int:
    """The GPUs a server's command line takes: tensor x pipeline x data-parallel size."""
    from gptoss_patch.launcher import parallel

    return parallel.layout_of(argv).total_gpus


def profile_spec(plan: LaunchPlan, port: int) -> ServerSpec:
    from gptoss_patch.launcher import plan as planning

    return ServerSpec("profile", tuple(plan.argv), plan.env, port, planning.served_model(plan), gpu_count(plan.argv))


def variant_spec(plan: LaunchPlan, name: str, args: tuple[str, ...], port: int) -> ServerSpec:
    """The profile server again on its own port, with the variant's arguments last (so they win). A variant that sets
    the capture sizes drops the profile's maximum capture size, as `serve` does for sizes given after -- (vLLM refuses
    a maximum that differs from the list's last size)."""
    from gptoss_patch.launcher import plan as planning, profiles

    if planning.sets_capture_sizes(args):
        settings = tuple(s for s in plan.settings if not (s.kind == "flag" and s.name == profiles.MAX_CAPTURE_FLAG))
        plan = dataclasses.replace(plan, settings=settings)
    argv = list(plan.argv)
    at = argv.index("--port") + 1
    argv[at] = str(port)
    return ServerSpec(name, (*argv, *args), plan.env, port, planning.served_model(plan), gpu_count((*argv, *args)))


def compared_spec(plan: LaunchPlan, name: str, port: int) -> ServerSpec:
    """vanilla: `vllm serve MODEL --host --port` and your arguments, nothing of the profile but the local
    vocabulary (so it starts offline too); recipe: the same plus vLLM's published Hopper flags (recipe.py), yours
    after them; eager: the profile without capture sizes, plus --enforce-eager."""
    from gptoss_patch.launcher import plan as planning, profiles

    head = [str(plan.executable), *plan.entry]
    where = ["--host", LOOPBACK, "--port", str(port)]
    if name in ("vanilla", "recipe"):
        vocabulary = {s.name: s.values[0] for s in plan.settings if s.kind == "env" and s.name.startswith("TIKTOKEN")}
        own = recipe_args(plan).argv if name == "recipe" else ()
        argv = [*head, *where, *own, *plan.extra_args]
        env = {**plan.base_env, **vocabulary}
        return ServerSpec(name, tuple(argv), env, port, planning.served_model(plan), gpu_count(argv))
    kept = [
        s
        for s in plan.settings
        if s.kind == "flag" and s.name not in ("--host", "--port") and not profiles.is_capture_setting(s)
    ]
    argv = [*head, *where, *[a for s in kept for a in s.argv], *plan.extra_args, "--enforce-eager"]
    return ServerSpec(name, tuple(argv), plan.env, port, planning.served_model(plan), gpu_count(argv))


def variant_checks(base: Sequence[Check], name: str, checks: Sequence[Check]) -> tuple[Check, ...]:
    """A --variant's pre-flight rows (the same checks, prepare() over the profile's arguments plus the variant's)
    that the base launch does not already show, each message naming the variant: its layout (-tp, -dp, -ep), its
    memory estimate, its flags."""
    from dataclasses import replace

    seen = {(c.name, c.status, c.message) for c in base}
    return tuple(replace(c, message=f"--variant {name}: {c.message}") for c in checks if (c.name, c.status, c.message) not in seen)


def recipe_args(plan: LaunchPlan) -> RecipeArgs:
    """vLLM's Hopper config for this release: the flags it accepts, and the notes (left out, already defaults)."""
    from gptoss_patch.launcher import static

    defaults = static.read_serve_defaults(plan.installation.package_root)
    return hopper_args(plan.capabilities.has_flag, defaults, plan.installation.version)


def comparison_notes(plan: LaunchPlan, specs: Sequence[ServerSpec], *, one_at_a_time: bool = False) -> list[str]:
    """What the table's reader must know about the compared servers: how they shared the GPUs, the recipe's flags
    against this release, and which servers' figures --stream-interval distorts."""
    notes: list[str] = []
    if one_at_a_time and len(specs) > 1:
        notes.append(
            "servers measured one at a time (--one-at-a-time), each with all of its GPUs' memory: rounds were not "
            "interleaved between servers, so a drift of the machine over the run shows as a difference between them"
        )
    if any(spec.name == "recipe" for spec in specs):
        notes += recipe_args(plan).notes
        if plan.profile != "sm90":
            notes.append(f"recipe: {SOURCE} is Hopper's; here it runs on the {plan.profile} profile's GPU as published")
    for spec in specs:
        interval = stream_interval(spec.argv)
        if interval > 1:
            notes.append(
                f"{spec.name}: --stream-interval {interval} sends tokens {interval} at a time, so its "
                f"{' and '.join(DISTORTED_BY_STREAM_INTERVAL)} are distorted (marked *); generation tok/s and TPOT are not"
            )
    return notes


def default_log_dir() -> Path:
    """A new directory per run beside serve's logs."""
    from gptoss_patch.launcher import runner

    return runner.default_log_file().parent / time.strftime(f"bench-%Y%m%d-%H%M%S-{os.getpid()}")


def bound_recipe(model: str, sizes: tuple[int, ...]) -> Recipe:
    """--bound: the recipe of the local gpt-oss directory `model`; decode is compared at concurrency 1."""
    from gptoss_patch.bench import bound as bounds
    from gptoss_patch.errors import UsageError

    if 1 not in sizes:
        raise UsageError("--bound compares decode at concurrency 1: add 1 to --concurrency")
    return bounds.recipe_from_model(model)


def measure_bound(python: str, recipe: Recipe, context: int) -> Bound:
    """The GPU's copy bandwidth (measured in `python`) and the bytes a decode step reads at `context` tokens."""
    from gptoss_patch.bench import bound as bounds

    bandwidth = bounds.measure_bandwidth(python)
    return bounds.Bound(bounds.decode_bytes(recipe, context), bandwidth)


def fractions(report: BenchReport, limit: Bound) -> dict[str, float]:
    """Per server: the bound of all the GPUs it uses (the per-GPU bandwidth times its GPU count) over the median
    TPOT at concurrency 1."""
    gpus = server_gpus(report)
    return {
        row.server: round(limit.fraction(row.tpot_ms.median, gpus.get(row.server, 1)), 4)
        for row in report.rows
        if row.concurrency == 1
    }


def server_gpus(report: BenchReport) -> dict[str, int]:
    """Each server's GPU count, as its command line asks (TP x PP x DP)."""
    return {str(s["name"]): int(s.get("gpus") or 1) for s in report.servers}
