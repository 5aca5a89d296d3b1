"""Pre-flight checks: named pass / warn / fail verdicts with a one-line fix, all static (nothing is started)."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gptoss_patch.errors import TargetError, UsageError
from gptoss_patch.launcher import gpus, knowledge, memory, parallel, plan as planning, profiles
from gptoss_patch.launcher.options import is_loopback
from gptoss_patch.launcher.results import Check, LaunchPlan, Status
from gptoss_patch.launcher.runner import bind_problem
from gptoss_patch.launcher.static import Capabilities, FlagUse, last_value, scan_flags
from gptoss_patch.target import pip_command

if TYPE_CHECKING:
    from gptoss_patch.target import Installation

GPT_OSS_REASONING_PARSERS = ("openai_gptoss", "GptOss")  # GptOss was its name in 0.10.1.x (G15)
# Attention backends that implement gpt-oss's attention sinks, by profile (G21).
SINK_BACKENDS = {"sm90": ("FLASH_ATTN", "TRITON_ATTN"), "sm100": ("FLASHINFER", "TRITON_ATTN")}
SINK_BACKENDS_ELSEWHERE = ("TRITON_ATTN",)
GB10_MAX_UTILIZATION = 0.90


def require_launchable(plan: LaunchPlan, *, port: bool = True) -> None:
    """Bad input that must stop `serve` with one line before anything else is reported or started.

    `port=False` for --print-script: the script runs later, perhaps elsewhere.
    """
    errors = {"executable": TargetError, "model": UsageError, "port": UsageError}
    for check in check_launchability(plan):
        if check.status is Status.FAIL and (port or check.name != "port"):
            raise errors[check.name](f"{check.message}; {check.fix}")  # one line, the fix included


def require_parallel(plan: LaunchPlan) -> None:
    """GPUs that cannot run the asked layout (too few, one listed twice, mixed models, a TP that does not divide
    the model): exit 4 with one line and its fix, before anything starts (serve and bench; doctor shows the rows)."""
    for check in check_parallel(plan):
        if check.status is Status.FAIL and check.issue in BAD_PARALLEL_INPUT:
            raise TargetError(f"{check.message} ({check.issue}); {check.fix}")


# -- target and patches --------------------------------------------------------------------------


def check_gpu(plan: LaunchPlan) -> list[Check]:
    if not plan.options.gpu.detected:
        return [Check("gpu", Status.WARN, "no nvidia-smi on PATH: cpu profile, no GPU settings", fix="pass --gpu sm90|sm100|sm120|sm121 on a GPU host")]
    return [Check("gpu", Status.PASS, f"profile {plan.profile} ({plan.profile_source})")]


def check_patches(plan: LaunchPlan) -> list[Check]:
    results = plan.patch_report.results
    needing = [r for r in results if r.state.needs_action]
    if not needing:
        summary = ", ".join(f"{r.id} {r.state.value}" for r in results) or "no patches apply"
        return [Check("patches", Status.PASS, f"clean: {summary}")]
    summary = "; ".join(f"{r.id} {r.state.value}" for r in needing)
    fix = "gptoss-patch apply" if all(r.state.value == "pending" for r in needing) else "gptoss-patch status, then apply or revert"
    if plan.options.allow_unpatched:
        hook = plan.env_additions.get(planning.HOOK_MODE_ENV)
        also = f"; the installed hook is told {planning.HOOK_MODE_ENV}={hook} for this start only" if hook else ""
        return [Check("patches", Status.WARN, f"STARTING UNPATCHED ({summary}) because of --allow-unpatched{also}", fix=fix)]
    return [Check("patches", Status.FAIL, f"not clean: {summary}", fix=f"{fix} (or --allow-unpatched)")]


# What the `system` placement costs, in doctor's and serve's pre-flight row (commands/_launch.py's --instructions help says the same).
SYSTEM_PLACEMENT_DROPS = ("every developer message after the first system or developer message (e.g. a developer "
                          "message after a system message) is rendered empty: its text is lost")


def check_instructions(plan: LaunchPlan) -> list[Check]:
    """Where the server puts the client's system and developer messages (harmony_instructions, G02)."""
    placement, why = planning.instructions_placement(plan)
    if placement == "developer":
        text = f"developer ({why}): every client system and developer message becomes developer `# Instructions`"
        return [Check("instructions", Status.PASS, text)]
    if placement == "system":
        fix = (f"unset {planning.INSTRUCTIONS_ENV}" if "environment" in why else "--instructions developer (upstream's default)")
        text = f"system ({why}): the first system/developer message goes into the harmony system message; {SYSTEM_PLACEMENT_DROPS}"
        return [Check("instructions", Status.WARN, text, fix=f"{fix} keeps every message", issue="G02")]
    if placement == "invalid":
        text = f"{why}: vLLM raises ValueError reading it during start-up, at the latest once the model is loaded"
        return [Check("instructions", Status.FAIL, text, fix=f"set {planning.INSTRUCTIONS_ENV} to 0 or 1, or unset it", issue="G02")]
    if placement == "raw":
        text = f"raw ({why}): a client system message reaches the model as a raw second system message"
        fix = "gptoss-patch apply" if why.endswith(" pending") else "gptoss-patch status: harmony_instructions must be applied"
        return [Check("instructions", Status.WARN, text, fix=fix, issue="G02")]
    return []


# -- environment variables (G15) -----------------------------------------------------------------


def check_environment(plan: LaunchPlan) -> list[Check]:
    env = plan.env
    names = sorted(name for name in env if name.startswith("VLLM_"))
    findings = [check for name in names for check in _env_findings(name, env[name], plan)]
    if findings:
        return findings
    return [Check("env", Status.PASS, f"{len(names)} VLLM_* variable(s), all read by vLLM {plan.installation.version}")]


def _env_findings(name: str, value: str, plan: LaunchPlan) -> list[Check]:
    if not knowledge.reads(name, plan.capabilities):
        return [_unknown_env(name, value, plan)]
    return [*_refused_switch(name, value, plan), *_env_advice(name, value, plan)]


def _refused_switch(name: str, value: str, plan: LaunchPlan) -> list[Check]:
    """A switch this vLLM reads as bool(int(value)) set to a value int() refuses: vLLM stops with ValueError once the
    model is loaded (enable_envs_cache evaluates every registered variable), so the user learns it minutes late."""
    version = plan.installation.version
    if planning.switch_value(value) is not None or not knowledge.reads_as_switch(name, plan.capabilities):
        return []
    if name == planning.INSTRUCTIONS_ENV and planning.instructions_placement(plan)[0] == "invalid":
        return []  # the instructions row says it already
    message = (f"{name}={value!r}: vLLM {version} reads it as bool(int(value)), which refuses {value!r}: it stops with "
               "ValueError during start-up, at the latest once the model is loaded")
    return [Check("env", Status.FAIL, message, fix=f"set {name}=1 or 0, or unset it", issue="G15")]


def _env_advice(name: str, value: str, plan: LaunchPlan) -> list[Check]:
    caps = plan.capabilities
    version = plan.installation.version
    if name in caps.env.deprecated:
        text = caps.env.deprecated[name] or "see vLLM's envs.py"
        return [Check("env", Status.WARN, f"{name} is deprecated in vLLM {version}", fix=text, issue="G15")]
    if knowledge.registered_but_unread(name, caps):
        replacement = knowledge.env_replacement(name, value, caps) or "unset it"
        return [Check("env", Status.WARN, f"{name} is registered but the MXFP4 selector of vLLM {version} never reads it", fix=replacement, issue="G15")]
    if name in knowledge.NO_EFFECT_ON_GPT_OSS:
        return [Check("env", Status.WARN, f"{name} does nothing for gpt-oss: {knowledge.NO_EFFECT_ON_GPT_OSS[name]}", fix=f"unset {name}")]
    return []


def _unknown_env(name: str, value: str, plan: LaunchPlan) -> Check:
    caps = plan.capabilities
    replacement = knowledge.env_replacement(name, value, caps)
    close = [match for match in caps.env.close_matches(name) if match != name]
    origin = " (never a stock variable)" if name == "VLLM_MXFP4_BACKEND" else ""
    message = f"{name} is not a variable vLLM {plan.installation.version} reads{origin}; it would do nothing"
    if close:
        message += f"; did you mean {close[0]}?"
    fix = f"use {replacement} instead" if replacement else f"unset {name}"
    if name in knowledge.NO_EFFECT_ON_GPT_OSS:  # its replacement would not help gpt-oss either
        fix = f"unset {name}: it {knowledge.NO_EFFECT_ON_GPT_OSS[name]}"
    return Check("env", Status.FAIL, message, fix=fix, issue="G15")


# -- flags ---------------------------------------------------------------------------------------


def check_flags(plan: LaunchPlan) -> list[Check]:
    caps = plan.capabilities
    uses = scan_flags(plan.extra_args)
    findings = [_unknown_flag(use, plan) for use in uses if not caps.flags.accepts(use.name)]
    findings += _flag_advice(plan)
    if findings:
        return findings
    return [Check("flags", Status.PASS, f"{len(uses)} extra flag(s), all accepted by vLLM {plan.installation.version}")]


def _unknown_flag(use: FlagUse, plan: LaunchPlan) -> Check:
    caps = plan.capabilities
    version = plan.installation.version
    prefixed = sorted(flag for flag in caps.flags.flags if flag.startswith(use.name) and use.name.startswith("--"))
    if len(prefixed) == 1:
        return Check("flags", Status.WARN, f"{use.spelling} is an abbreviation of {prefixed[0]}", fix=f"spell it {prefixed[0]}")
    if use.name in knowledge.FOLKLORE_FLAGS:
        fix = _folklore_fix(use, caps)
        return Check("flags", Status.FAIL, f"{use.name}: {knowledge.FOLKLORE_FLAGS[use.name]}", fix=fix, issue="G15")
    close = caps.flags.close_matches(use.name)
    message = f"{use.spelling} is not a flag of vLLM {version}" + (f"; did you mean {close[0]}?" if close else "")
    return Check("flags", Status.FAIL, message, fix=f"remove {use.spelling}" + (f" or use {close[0]}" if close else ""))


def _folklore_fix(use: FlagUse, caps: Capabilities) -> str:
    if use.name == "--mxfp4-backend":
        replacement = knowledge.env_replacement("VLLM_MXFP4_BACKEND", (use.values or ("",))[0], caps)
        return f"use {replacement} instead" if replacement else f"remove {use.spelling}"
    return f"remove {use.spelling}"


def _flag_advice(plan: LaunchPlan) -> list[Check]:
    advice = [*_enforce_eager(plan), *_stream_interval(plan), *_reasoning_parser(plan)]
    return [*advice, *_attention_backend(plan), *_memory_utilization(plan)]


def _enforce_eager(plan: LaunchPlan) -> list[Check]:
    if plan.profile == "cpu":  # no CUDA graphs on the CPU path: nothing to disable
        return []
    switches = [use.name for use in scan_flags(plan.extra_args) if use.name in ("--enforce-eager", "--no-enforce-eager")]
    if not switches or switches[-1] != "--enforce-eager":  # argparse keeps the last one
        return []
    message = "--enforce-eager disables CUDA graphs: decode fell from 59 to 26 tok/s for gpt-oss-120b on GB10"
    return [Check("flags", Status.WARN, message, fix="remove --enforce-eager and fix whatever start-up problem it hid", issue="G19")]


def _stream_interval(plan: LaunchPlan) -> list[Check]:
    value = planning.effective(plan, "--stream-interval")
    if value is None or not value.isdigit() or int(value) <= 1:
        return []
    message = f"--stream-interval {value} leaks reasoning into streamed content and drops tool-call arguments"
    return [Check("flags", Status.WARN, message, fix="--stream-interval 1 (or leave it out)", issue="G10")]


def _reasoning_parser(plan: LaunchPlan) -> list[Check]:
    value = planning.effective(plan, "--reasoning-parser")
    if value == "GptOss" and plan.installation.version.release[:3] >= (0, 10, 2):
        return [Check("flags", Status.FAIL, "--reasoning-parser GptOss was renamed in 0.10.2", fix="--reasoning-parser openai_gptoss", issue="G15")]
    if value not in GPT_OSS_REASONING_PARSERS or plan.options.expect_reasoning:
        return []
    message = (
        f"--reasoning-parser {value} moves the analysis channel into `reasoning`: when max_tokens runs out there, "
        "`content` is null, and clients that read only `content` show an empty reply"
    )
    if plan.installation.version.release[:2] < (0, 13):
        message += "; before 0.13 even a lone final answer lands in `reasoning`"
    return [Check("flags", Status.WARN, message, fix="pass --expect-reasoning if your clients read `reasoning`, else drop the parser", issue="G08")]


def _attention_backend(plan: LaunchPlan) -> list[Check]:
    value = planning.effective(plan, "--attention-backend")
    if value is None or plan.profile == "cpu":
        return []
    supported = SINK_BACKENDS.get(plan.profile, SINK_BACKENDS_ELSEWHERE)
    if value.upper() in supported:
        return []
    message = f"--attention-backend {value} has no attention-sink support on {plan.profile} in stock vLLM"
    return [Check("flags", Status.WARN, message, fix=f"drop it (automatic selection handles sinks) or use {supported[-1]}", issue="G21")]


def _memory_utilization(plan: LaunchPlan) -> list[Check]:
    value = planning.effective(plan, "--gpu-memory-utilization")
    if plan.profile != "sm121" or value is None or _float(value) <= GB10_MAX_UTILIZATION:
        return []
    message = f"--gpu-memory-utilization {value} on GB10's unified memory can freeze the host or be OOM-killed at start-up"
    return [Check("flags", Status.WARN, message, fix=f"--gpu-memory-utilization {profiles.GB10_MEMORY_UTILIZATION}", issue="G17")]


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0


# -- vocabulary (G01) ----------------------------------------------------------------------------


def check_vocabulary(plan: LaunchPlan) -> list[Check]:
    inst = plan.installation
    if inst.version.release[:2] >= planning.VOCAB_BUNDLED_FROM:
        return _bundled_vocabulary(inst)

    chosen = plan.vocabulary or planning.vocabulary_choice(plan.base_env, getattr(plan.options, "vocab", None), str(inst.python))
    if chosen.ok:
        # `vocab status` prints the same verdict (it calls the same lookup)
        how = " (exported by gptoss-patch serve; a plain `vllm serve` needs the exports `vocab install` prints)" if chosen.exports else ""
        return [Check("vocab", Status.PASS, f"{chosen.status.path} (from {chosen.origin}), sha256 verified{how}")]
    return [Check("vocab", Status.FAIL, f"harmony vocabulary: {chosen.status.reason}", fix="gptoss-patch vocab install", issue="G01")]


def _bundled_vocabulary(inst: Installation) -> list[Check]:
    """From 0.31 oss-harmony embeds the vocabulary; a co-installed openai-harmony overwrites those files."""
    if any(Path(inst.site_packages).glob("openai_harmony-*.dist-info")):
        message = "openai-harmony is installed next to oss-harmony and replaces its embedded vocabulary files"
        uninstall = pip_command(inst.python, "uninstall", "-y", "openai-harmony")
        fix = f"{uninstall}, then {pip_command(inst.python, 'install', '--force-reinstall', '--no-deps', 'oss-harmony')}"
        return [Check("vocab", Status.WARN, message, fix=fix, issue="G01")]
    return [Check("vocab", Status.PASS, f"bundled: vLLM {inst.version} uses oss-harmony, which embeds the vocabulary")]


# -- security ------------------------------------------------------------------------------------


def check_security(plan: LaunchPlan) -> list[Check]:
    host = planning.effective(plan, "--host") or "0.0.0.0"  # vLLM's own default binds every interface
    if planning.effective(plan, "--uds"):
        return [Check("security", Status.PASS, "serves on a unix socket only")]
    if is_loopback(host):
        return [Check("security", Status.PASS, f"binds {host} (this machine only)")]
    if planning.effective(plan, "--api-key") or plan.env.get("VLLM_API_KEY"):
        return [Check("security", Status.PASS, f"binds {host}; requests need the API key")]
    if plan.options.allow_unauthenticated:
        return [Check("security", Status.WARN, f"binds {host} WITHOUT an API key (--allow-unauthenticated)")]
    message = f"binds {host} without an API key: anyone who reaches the port can use the model"
    return [Check("security", Status.FAIL, message, fix="export VLLM_API_KEY=..., or pass --allow-unauthenticated")]


# -- capture sizes and MoE backend ---------------------------------------------------------------


def check_capture_sizes(plan: LaunchPlan) -> list[Check]:
    if plan.profile == "cpu":  # CUDA-graph capture sizes mean nothing on the CPU path
        return []
    setting = next((s for s in plan.settings if profiles.is_capture_setting(s)), None)
    if setting is not None:
        return [Check("capture-sizes", Status.PASS, f"{setting.name}: {setting.why}", issue="G20")]
    message = "vLLM's default CUDA-graph sizes: batches of 5 and 10 pad to 8 and 16"
    return [Check("capture-sizes", Status.PASS, message, fix="--concurrency 5,10 (the batch sizes you run)", issue="G20")]


def check_moe_backend(plan: LaunchPlan) -> list[Check]:
    if plan.profile not in profiles.SM12X:
        asked = planning.moe_request(plan)  # as vLLM reads it: `auto`, or a flag its selector ignores, names nothing
        if asked is not None:
            return [Check("moe-backend", Status.PASS, f"{asked.spelling}; the startup log line is reported")]
        return [Check("moe-backend", Status.PASS, "automatic selection; the startup log line is reported")]
    if plan.expected_moe is None:
        message = "MXFP4 MoE backend not pinned to Marlin on SM12x; the startup log is the only place the choice shows"
        return [Check("moe-backend", Status.WARN, message, fix="drop your own --moe-backend / backend variables, or check the log", issue="G14")]
    checks = [Check("moe-backend", Status.PASS, "pinned to Marlin; the startup log line is checked against it", issue="G14")]
    if plan.installation.version.release[:2] < (0, 23):
        message = f"vLLM {plan.installation.version} builds the Marlin MoE kernel as sm_80 PTX only; SM12x runs it under JIT (#37030)"
        checks.append(Check("moe-backend", Status.WARN, message, fix="run with --smoke; vLLM >= 0.23 builds it for SM12x (#40923)", issue="G14"))
    return checks


# -- can it start at all --------------------------------------------------------------------------


def check_launchability(plan: LaunchPlan) -> list[Check]:
    return [*_executable(plan), *_model(plan), *_port(plan)]


def _executable(plan: LaunchPlan) -> list[Check]:
    exe = Path(plan.executable)
    fix = f"reinstall vLLM there: {plan.installation.reinstall_command}"
    if not (exe.is_file() and exe.stat().st_mode & 0o111):
        return [Check("executable", Status.FAIL, f"no vllm executable at {exe}", fix=fix)]
    interpreter = script_interpreter(exe)
    if interpreter is not None and not os.access(interpreter, os.X_OK):
        message = f"{exe} cannot run: its interpreter {interpreter} does not exist (was the venv moved or renamed?)"
        return [Check("executable", Status.FAIL, message, fix=fix)]
    if plan.server_module:
        why = f"{plan.installation.distribution}'s own `vllm` script cannot start (it looks up a distribution named vllm)"
        return [Check("executable", Status.PASS, f"{exe} -m {plan.server_module}: {why}")]
    return [Check("executable", Status.PASS, str(exe))]


TRAMPOLINE = "'''exec' "  # pip's /bin/sh wrapper for interpreter paths too long for a #! line


def script_interpreter(path: Path) -> str | None:
    """The interpreter a script names: its `#!` line, or pip's `/bin/sh` trampoline; None for binaries."""
    try:
        with path.open("rb") as handle:
            head = handle.read(1024).decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    if not head or not head[0].startswith("#!"):
        return None
    interpreter = head[0][2:].strip().split(" ")[0]
    if interpreter == "/bin/sh" and len(head) > 1 and head[1].startswith(TRAMPOLINE) and head[1].count('"') >= 2:
        return head[1].split('"')[1]
    return interpreter


def _model(plan: LaunchPlan) -> list[Check]:
    if not plan.model:
        return []
    if not looks_like_path(plan.model):
        return [Check("model", Status.PASS, f"{plan.model} (a model id: vLLM resolves it)")]
    path = Path(plan.model).expanduser()
    if path.exists():
        return [_weights(plan, path)]
    return [Check("model", Status.FAIL, f"model path {plan.model} does not exist", fix="check the path, or give a Hugging Face id such as openai/gpt-oss-20b")]


# The files vLLM's DefaultModelLoader globs for in the model directory's top level (default_loader.py,
# 0.15.1-0.33.0: *.safetensors and *.bin, *.pt as the fallback), and the --load-format values it serves.
WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt")
DIRECTORY_LOAD_FORMATS = ("auto", "hf", "safetensors", "fastsafetensors", "instanttensor", "mistral", "pt", "npcache")


def _weights(plan: LaunchPlan, path: Path) -> Check:
    """A directory with config.json and no weights (`model random --no-weights`) starts only with --load-format dummy;
    otherwise vLLM starts, then fails at the weight load with "Cannot find any model weights". A warning, not a
    failure: that failure is vLLM's, with its own last lines, as for any model that does not load."""
    if not (path / "config.json").is_file() or any(next(path.glob(pattern), None) for pattern in WEIGHT_FILES):
        return Check("model", Status.PASS, str(path))
    load_format = (last_value(plan.extra_args, "--load-format") or "auto").lower()
    if load_format == "dummy":
        return Check("model", Status.PASS, f"{path} (no weights: --load-format dummy makes random ones)")
    if load_format not in DIRECTORY_LOAD_FORMATS:
        return Check("model", Status.PASS, f"{path} (no weight files; --load-format {load_format} reads its own)")
    message = (f"{path} has a config.json but no weights ({', '.join(WEIGHT_FILES)}): vLLM will fail to load it "
               "(\"Cannot find any model weights\")")
    return Check("model", Status.WARN, message, fix="pass --load-format dummy after -- (random weights made at load, what "
                 "`model random --no-weights` writes a directory for), or write the weights into it")


def looks_like_path(model: str) -> bool:
    """Hugging Face ids are `org/name`; anything absolute, relative, home-based or deeper is a local path."""
    return model.startswith(("/", "./", "../", "~", ".")) or model.count("/") > 1 or Path(model).exists()


def _port(plan: LaunchPlan) -> list[Check]:
    if planning.effective(plan, "--uds"):
        return []
    host = planning.effective(plan, "--host") or "0.0.0.0"
    port = int(planning.effective(plan, "--port") or 8000)
    problem = bind_problem(host, port)
    if problem is None:
        return [Check("port", Status.PASS, f"{host}:{port} is free")]
    return [Check("port", Status.FAIL, f"cannot listen on {host}:{port}: {problem}", fix="pick another --port, or stop what holds it")]


# -- more than one GPU (G33-G38, G42) --------------------------------------------------------------

BAD_PARALLEL_INPUT = ("G33", "G34", "G35", "G36")  # require_parallel: exit 4, one line


def check_parallel(plan: LaunchPlan) -> list[Check]:
    """The visible GPUs against TP x PP x DP, their models, the model's heads and experts against TP, and the
    per-GPU memory estimate. Nothing here without nvidia-smi, unless more than one GPU was asked for."""
    context: parallel.Context | None = plan.parallel
    if context is None:
        return []
    layout, hardware = context.layout, context.hardware
    checks = [*_divisibility(context)]
    if hardware is None:
        if layout.total_gpus > 1 and plan.profile != "cpu":
            message = f"{layout.describe()} asks for {layout.total_gpus} GPUs; without nvidia-smi none of them is checked"
            checks.append(Check("gpus", Status.WARN, message, fix="run doctor where the GPUs are"))
        return checks
    if hardware.problem:
        checks.append(Check("gpus", Status.WARN, f"GPUs not checked: {hardware.problem}", fix="check nvidia-smi --query-gpu works"))
        return checks
    visible_checks = [*_visible_devices(hardware), *_gpu_count(context), *_same_models(context)]
    checks += visible_checks
    if not any(c.status is Status.FAIL for c in checks):
        used = context.used_gpus()
        models = ", ".join(f"{n} x {label}" for label, n in _count(g.label for g in used).items())
        checks.append(Check("gpus", Status.PASS, f"{layout.describe()}: {len(used)} of {len(hardware.visible)} visible GPU(s) used, {models}"))
        checks += _memory(plan, context)
    checks += _max_num_seqs(plan, context)
    return checks


def _count(labels: Iterable[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for label in labels:
        counts[label] = counts.get(label, 0) + 1
    return counts


def _visible_devices(hardware: gpus.Inventory) -> list[Check]:
    checks = []
    if hardware.duplicates:
        message = (f"CUDA_VISIBLE_DEVICES={hardware.visible_env} names {', '.join(hardware.duplicates)} again: two ranks on one GPU "
                   "stop NCCL (\"Duplicate GPU detected\")")
        unique = ",".join(str(g.index) for g in hardware.visible)
        checks.append(Check("gpus", Status.FAIL, message, fix=f"list each GPU once, e.g. CUDA_VISIBLE_DEVICES={unique}", issue="G34"))
    if hardware.invalid is not None:
        message = (f"CUDA_VISIBLE_DEVICES={hardware.visible_env}: {hardware.invalid!r} is no GPU nvidia-smi lists, so CUDA hides it "
                   f"and every entry after it ({len(hardware.visible)} visible)")
        checks.append(Check("gpus", Status.WARN, message, fix="use indices or UUIDs from nvidia-smi -L", issue="G33"))
    return checks


def _gpu_count(context: parallel.Context) -> list[Check]:
    layout, hardware = context.layout, context.hardware
    assert hardware is not None
    visible = len(hardware.visible)
    where = f"CUDA_VISIBLE_DEVICES={hardware.visible_env}" if hardware.visible_env is not None else "nvidia-smi"
    if layout.multi_node and layout.dp_local is None:
        message = (f"{layout.describe()} across hosts: {layout.total_gpus} GPUs in all, {visible} visible here; "
                   "Ray or --nnodes places the ranks, so this host's share is not checked")
        return [Check("gpus", Status.WARN, message, fix="give --data-parallel-size-local to check this host's share", issue="G33")]
    if visible >= layout.local_gpus:
        return []
    parts = f"TP {layout.tp}" + (f" x PP {layout.pp}" if layout.pp > 1 else "") + f" x DP {layout.dp_local or layout.dp}"
    message = f"{parts} needs {layout.local_gpus} GPUs on this host; {where} shows {visible}"
    if layout.dp > 1 and visible >= layout.model_parallel:
        fix = f"--data-parallel-size {visible // layout.model_parallel}, or make {layout.local_gpus} GPUs visible"
    else:
        largest = _largest_tp(context, visible)
        fix = f"--tensor-parallel-size {largest}, or make {layout.local_gpus} GPUs visible"
    return [Check("gpus", Status.FAIL, message, fix=fix, issue="G33")]


def _largest_tp(context: parallel.Context, visible: int) -> int:
    limit = max(1, visible // max(1, context.layout.pp))
    sizes = parallel.fitting_sizes(context.shape, limit) if context.shape else list(range(1, limit + 1))
    return max(sizes or [1])


def _same_models(context: parallel.Context) -> list[Check]:
    hardware = context.hardware
    assert hardware is not None
    used = context.used_gpus()
    kinds = _count(g.label for g in used)
    if len(kinds) > 1:
        same = max(kinds, key=lambda label: kinds[label])
        indices = ",".join(str(g.index) for g in hardware.gpus if g.label == same)
        message = f"the GPUs used are of different models: {', '.join(kinds)}; vLLM sizes and picks kernels for one model"
        fix = f"CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES={indices} (GPUs of one model)"
        return [Check("gpus", Status.FAIL, message, fix=fix, issue="G35")]
    if hardware.mixed and hardware.visible_env is not None and not hardware.pci_order and any(
        entry.strip().isdigit() for entry in hardware.visible_env.split(",")
    ):
        message = ("this host has GPUs of different models and CUDA_VISIBLE_DEVICES uses indices: CUDA numbers GPUs fastest "
                   "first unless CUDA_DEVICE_ORDER=PCI_BUS_ID, so its index may not be nvidia-smi's")
        return [Check("gpus", Status.WARN, message, fix="export CUDA_DEVICE_ORDER=PCI_BUS_ID, or name the GPUs by UUID", issue="G35")]
    return []


def _divisibility(context: parallel.Context) -> list[Check]:
    shape, layout = context.shape, context.layout
    if shape is None or layout.tp == 1 and not layout.expert_parallel:
        return []
    problems = parallel.divisibility_problems(shape, layout)
    if not problems:
        return []
    fitting = ", ".join(str(tp) for tp in parallel.fitting_sizes(shape, 8))
    message = f"--tensor-parallel-size {layout.tp} does not divide {' or '.join(problems)} of {shape.name} ({shape.source})"
    return [Check("parallel", Status.FAIL, message, fix=f"--tensor-parallel-size one of {fitting}", issue="G36")]


def _memory(plan: LaunchPlan, context: parallel.Context) -> list[Check]:
    used = context.used_gpus()
    if context.shape is None or not used:
        return []
    smallest = min(used, key=lambda g: g.memory_mib or 0)
    found = memory.estimate(context.shape, context.layout, smallest, plan.vllm_flags, default_utilization=context.default_utilization)
    if found is None:
        message = f"{smallest.name} reports no total memory: the per-GPU estimate and the sampler warm-up check (G42) are not run"
        return [Check("memory", Status.WARN, message, issue="G37")]
    g = memory.gib
    checks = []
    experts_split = f" (the experts split over {context.layout.tp * context.layout.dp} ranks: TP x DP)" if context.layout.dp > 1 else ""
    breakdown = (f"weights {g(found.weights)}{experts_split} + one {found.max_model_len}-token request's KV cache {g(found.kv_one_sequence)} "
                 f"+ activations for {found.batched_tokens} batched tokens {g(found.activations)} + runtime {g(found.runtime)}")
    budget = f"{found.utilization:g} x {g(found.total)} = {g(found.budget)}"
    if not found.fits:
        fix = _memory_fix(context)
        message = f"estimated per GPU: {breakdown} = {g(found.needed)}, more than {budget}: vLLM would run out of memory at start"
        checks.append(Check("memory", Status.FAIL, message, fix=fix, issue="G37"))
    else:
        fits = found.sequences_at_full_length()
        message = f"estimated per GPU: {breakdown} = {g(found.needed)} of {budget}; {fits} request(s) of {found.max_model_len} tokens fit at once"
        checks.append(Check("memory", Status.PASS, message, issue="G37"))
        wanted = max(getattr(plan.options, "concurrency", ()) or (1,))
        per_rank = planning.per_rank((wanted,), context.layout.dp)[0]
        if per_rank > fits and planning.effective(plan, "--max-model-len") is not None:
            message = (f"{per_rank} concurrent requests per rank at the full {found.max_model_len} tokens would not fit ({fits} do): "
                       "longer ones queue or are preempted")
            checks.append(Check("memory", Status.WARN, message, fix="--max-model-len for the context you need", issue="G37"))
    checks += _load_fragmentation(plan, context)
    if context.layout.model_parallel > 1 and not found.reserve_ok:
        guide = f" (the recipe guide: above {memory.RECIPE_TP_MAX_UTILIZATION} runs out on H100)" if gpus.is_h100_80gb(smallest) else ""
        message = (f"--gpu-memory-utilization {found.utilization:g} leaves {g(found.outside)} per GPU outside vLLM's budget; with "
                   f"TP {context.layout.tp} the CUDA context and NCCL need about {g(found.reserve)} there{guide}")
        top = min(math.floor((1 - found.reserve / found.total) * 100) / 100, memory.RECIPE_TP_MAX_UTILIZATION)
        checks.append(Check("memory", Status.FAIL, message, fix=f"--gpu-memory-utilization {top:g} or less", issue="G38"))
    return checks + _sampler_warm_up(context, smallest, plan.vllm_flags, plan.env)


def _load_fragmentation(plan: LaunchPlan, context: parallel.Context) -> list[Check]:
    """G37 as measured: 120b at TP=1 on an 80 GB H100 ran out of memory while loading unless expandable segments were on."""
    if not (context.h100_120b and context.layout.model_parallel == 1):
        return []
    if memory.expandable_segments(plan.env.get(memory.ALLOC_CONF_ENV)):
        return []
    message = ("gpt-oss-120b at TP=1 on an 80 GB H100 ran out of memory while loading its weights on vLLM 0.20.2 (72 GiB "
               f"allocated, 5.4 GiB reserved by PyTorch but unusable), whatever the utilization, unless {memory.ALLOC_CONF_ENV} "
               "had expandable segments on")
    fix = f"export {memory.ALLOC_CONF_ENV}={memory.EXPANDABLE_SEGMENTS} (the sm90 profile sets it unless you set the variable)"
    return [Check("memory", Status.WARN, message, fix=fix, issue="G37")]


def _sampler_warm_up(context: parallel.Context, gpu: gpus.Gpu, argv: Sequence[str], plan_env: Mapping[str, str]) -> list[Check]:
    """G42: the sampler warm-up's float32 logits (max_num_seqs x vocabulary) need room outside the KV cache's budget."""
    assert context.shape is not None
    room = memory.sampler_headroom(context.shape, context.layout, gpu, argv, default_utilization=context.default_utilization)
    if room is None or not room.short:
        return []
    # The warning only where it was measured to matter: gpt-oss-120b on one GPU without expandable segments (one
    # H200 stopped there). The 20b at vLLM's defaults on an H100, the 120b on an H100 with expandable segments, and
    # the 120b on two H200s (TP=2, DP=2: 141.5 of 143.8 GiB used, none ran out) warmed up 1024 sequences with less
    # room than this estimate asks for. Not even 2 copies fitting still fails everywhere.
    segments = memory.expandable_segments(plan_env.get(memory.ALLOC_CONF_ENV))
    measured = context.shape.is_120b and context.layout.total_gpus == 1 and not segments
    if not room.clearly_over and not measured:
        return []
    g = memory.gib
    message = (f"the sampler warm-up of --max-num-seqs {room.max_num_seqs} needs about {g(room.need())} per GPU "
               f"({room.max_num_seqs} x {room.vocab_size} vocabulary x 4 bytes x {memory.SAMPLER_WARN_COPIES} float32 copies) "
               f"outside the KV cache; {room.utilization:g} x {g(room.total)} leaves {g(room.outside)}, about {g(room.headroom)} "
               f"after the CUDA graph pool and the CUDA context: vLLM may stop with \"CUDA out of memory occurred when warming up sampler\"")
    fixes = [f"-- --max-num-seqs {room.fitting_seqs()}"] if room.fitting_seqs() else []
    top = room.fitting_utilization()
    fixes += [f"--gpu-memory-utilization {top:g}"] if top is not None else []
    fix = " or ".join(fixes) or "a GPU with more memory"
    status = Status.FAIL if room.clearly_over else Status.WARN
    return [Check("memory", status, message, fix=fix, issue="G42")]


def _memory_fix(context: parallel.Context) -> str:
    if context.h100_120b and context.layout.model_parallel == 1:
        return (f"--gpu-memory-utilization {memory.RECIPE_TP1_UTILIZATION} --max-num-batched-tokens {memory.RECIPE_TP1_BATCHED_TOKENS} "
                "(the recipe guide's; the profile sets them unless given after --), or --tensor-parallel-size 2")
    return "a smaller --max-model-len or --max-num-batched-tokens, a higher --gpu-memory-utilization, or a larger --tensor-parallel-size"


def _max_num_seqs(plan: LaunchPlan, context: parallel.Context) -> list[Check]:
    value = planning.effective(plan, "--max-num-seqs")
    concurrency = getattr(plan.options, "concurrency", ())
    if value is None or not value.isdigit() or not concurrency:
        return []
    largest = planning.per_rank(concurrency, context.layout.dp)[-1]
    if int(value) >= largest:
        return []
    message = f"--max-num-seqs {value} is below the {largest} concurrent sequences --concurrency asks of each rank: the rest queue"
    return [Check("flags", Status.WARN, message, fix=f"--max-num-seqs {largest}, or drop it")]
