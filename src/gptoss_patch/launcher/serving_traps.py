"""Pre-flight checks for the traps of serving gpt-oss on recent vLLM (0.22-0.33), all static.

Each returns Checks with a fix and a known-issue id (docs/known-issues.md): two providers of the
`openai_harmony` package (G26), the Rust frontend bypassing the Python patches (G27), tool calls without
the gpt-oss tool parser (G28), MoE backends forced on GB10 that fail there (G29), an FP8 KV cache that also
quantizes the sliding-window layers (G30), and structured-output backends that reject harmony's
structural tags (G31), FlashInfer's SM90 MoE kernel asked for before it has been compiled (G32), and from 0.33.0
no --reasoning-effort-map where the patch used to map efforts harmony rejects (G11). A check
that cannot decide says why in a warning; it never passes by default.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shlex
from pathlib import Path

from gptoss_patch import distinfo
from gptoss_patch.launcher import plan as planning
from gptoss_patch.launcher.results import Check, LaunchPlan, Status
from gptoss_patch.launcher.static import scan_flags
from gptoss_patch.spec import RUST_FRONTEND, State, rust_frontend_on
from gptoss_patch.target import pip_command

HARMONY_PACKAGE = "openai_harmony/"
HARMONY_DISTRIBUTIONS = ("openai-harmony", "oss-harmony")
GPT_OSS_TOOL_PARSER = "openai"
TOOL_PARSER_CHECKED_FROM = (0, 28)  # where the dropped tool segments were read on the wheels
FORCED_MOE_ON_GB10 = {
    # --moe-backend value: (why it fails on SM121, the releases it applies to as (first, end) or None, upstream)
    "humming": (
        (
            "the humming-kernels release this vLLM pins queries the NVML memory clock, which GB10 does not report, "
            "and crashes at start-up"
        ),
        ((0, 21), (0, 28)),
        "vllm#49554",
    ),
    "triton_unfused": (
        "the unfused Triton MoE kernel can reach the `.tile::scatter4` store that ptxas rejects for sm_121a",
        ((0, 32), None),
        "vllm#41477",
    ),
}
KV_SKIP_FLAG = "--kv-cache-dtype-skip-layers"
STRUCTURAL_TAG_FROM = (0, 27)  # response_format becomes a structural tag on the harmony path
REJECTS_STRUCTURAL_TAGS = ("outlines", "lm-format-enforcer")
FLASHINFER_MOE_CHOICE = "flashinfer_cutlass"
FLASHINFER_MOE_ENV = "VLLM_USE_FLASHINFER_MOE_MXFP4_BF16"  # the MXFP4 selector's older switch to the same kernel
SM90_MOE_MODULE = "fused_moe_90"  # FlashInfer's JIT module for its CUTLASS MoE kernel on Hopper
# Measured on an H100 host (docs/performance.md): flashinfer-python 0.6.8.post1, the pin of vLLM 0.20.2.
SM90_MOE_BUILD = "175 CUDA sources with flashinfer 0.6.8.post1, 35 of them compiled in 11 minutes on 16 cores"


def run(plan: LaunchPlan) -> list[Check]:
    return [
        *check_harmony_providers(plan),
        *check_rust_frontend(plan),
        *check_tool_parser(plan),
        *check_forced_moe_on_gb10(plan),
        *check_kv_cache_skip(plan),
        *check_structured_outputs(plan),
        *check_flashinfer_moe_build(plan),
        *check_reasoning_effort_map(plan),
    ]


# -- G11: from 0.33.0 the effort map is vLLM's own flag, and it maps nothing by default -----------------

EFFORT_MAP_FLAG = "--reasoning-effort-map"


def check_reasoning_effort_map(plan: LaunchPlan) -> list[Check]:
    """harmony_reasoning_effort maps minimal/xhigh/max before 0.33; 0.33.0 has the flag instead, unset by default,
    so a move from patched 0.32 to 0.33 brings the 400s back unless the server is given the map."""
    if not plan.capabilities.has_flag(EFFORT_MAP_FLAG):
        return []
    from gptoss_patch.patches.harmony_reasoning_effort import DEFAULT_MAP

    given = planning.effective(plan, EFFORT_MAP_FLAG)
    if given:
        return [Check("reasoning-effort", Status.PASS, f"{EFFORT_MAP_FLAG} {given}: efforts it names are mapped before harmony",
                      issue="G11")]
    value = shlex.quote(json.dumps(DEFAULT_MAP))
    message = (f"vLLM {plan.installation.version} maps no reasoning effort by default: a request with reasoning_effort "
               f"{', '.join(DEFAULT_MAP)} (Codex, the Agents SDK) gets a 400, harmony knows only low, medium and high "
               "(before 0.33 the patch harmony_reasoning_effort mapped them)")
    return [Check("reasoning-effort", Status.WARN, message, fix=f"pass {EFFORT_MAP_FLAG} {value} to vLLM (after --)", issue="G11")]


# -- G26: two providers of openai_harmony ---------------------------------------------------------


def check_harmony_providers(plan: LaunchPlan) -> list[Check]:
    inst = plan.installation
    site = Path(inst.site_packages)
    providers: dict[str, dict[str, str]] = {}
    for dist_info in sorted(site.glob("*.dist-info")):
        if "harmony" not in dist_info.name.lower():
            continue  # reading every RECORD (torch's is megabytes) would cost more than the whole doctor budget
        try:
            rows = distinfo.record_rows(dist_info)
        except OSError as exc:
            reason = f"cannot read {dist_info.name}/RECORD ({exc.strerror or exc})"
            return [Check("harmony", Status.WARN, f"cannot tell which package provides openai_harmony: {reason}", issue="G26")]
        files = _harmony_files(rows)
        if files:
            providers[_distribution_name(dist_info)] = files
    required = required_harmony(Path(inst.dist_info))
    uninstall = pip_command(inst.python, "uninstall", "-y", *HARMONY_DISTRIBUTIONS)
    reinstall = f"{uninstall} && {pip_command(inst.python, 'install', '--no-deps', required or 'oss-harmony')}"
    if not providers:
        return []  # nothing to compare; a missing dependency is pip's and vLLM's to report
    if len(providers) == 1:
        name = next(iter(providers))
        return [Check("harmony", Status.PASS, f"openai_harmony is provided by {name} alone")]
    on_disk = [name for name, files in providers.items() if _matches_disk(site, files)]
    names = " and ".join(sorted(providers))
    if len(on_disk) == 1:
        whose = f"the files on disk are {on_disk[0]}'s"
    else:
        whose = "the files on disk match neither RECORD (they are a mix, or were changed)"
    message = f"{names} both install the openai_harmony package: {whose}, and uninstalling either removes both"
    if required:
        message += f"; vLLM {inst.version} requires {required}"
    return [Check("harmony", Status.WARN, message, fix=reinstall, issue="G26")]


def _harmony_files(rows: list[list[str]]) -> dict[str, str]:
    """{path: sha256 field} of the openai_harmony files a RECORD lists."""
    return {
        fields[0]: fields[1] if len(fields) > 1 else ""
        for fields in rows
        if fields[0].startswith(HARMONY_PACKAGE) and not fields[0].endswith(".pyc")
    }


def _matches_disk(site: Path, files: dict[str, str]) -> bool:
    for path, digest in files.items():
        if not digest.startswith("sha256="):
            continue
        try:
            data = (site / path).read_bytes()
        except OSError:
            return False
        ours = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        if ours != digest.removeprefix("sha256="):
            return False
    return True


def _distribution_name(dist_info: Path) -> str:
    """METADATA's Name; without one, the directory's name spelled as pip shows it (openai_harmony -> openai-harmony)."""
    return distinfo.header(dist_info, "Name") or distinfo.from_folder(dist_info)[0].replace("_", "-")


def required_harmony(dist_info: Path) -> str | None:
    """The harmony requirement in vLLM's METADATA (`oss-harmony>=0.0.11` from 0.31, `openai-harmony>=0.0.3` before)."""
    for value in distinfo.requires(dist_info):
        requirement = value.split(";")[0].strip()
        if requirement.replace("_", "-").lower().startswith(HARMONY_DISTRIBUTIONS):
            return requirement.replace(" ", "")
    return None


# -- G27: the Rust frontend ------------------------------------------------------------------------


def check_rust_frontend(plan: LaunchPlan) -> list[Check]:
    if not rust_frontend_on(plan.env) or not plan.capabilities.env.knows(RUST_FRONTEND):
        return []
    if plan.server_module:
        message = f"{RUST_FRONTEND} is set, but `python -m {plan.server_module}` never reads it: the Python frontend serves"
        return [Check("frontend", Status.PASS, message, issue="G27")]
    from gptoss_patch.registry import by_id

    specs = by_id()
    bypassed = [
        r.id for r in plan.patch_report.results
        if r.id in specs and specs[r.id].python_frontend and r.state in (State.APPLIED, State.PENDING)
    ]
    if not bypassed:
        return [Check("frontend", Status.PASS, f"{RUST_FRONTEND}=1: no patch of the Python chat path is in force", issue="G27")]
    message = (
        f"{RUST_FRONTEND}=1 makes `vllm serve` answer HTTP with vllm-rs and its own harmony renderer: "
        f"{', '.join(bypassed)} would do nothing"
    )
    return [Check("frontend", Status.WARN, message, fix=f"unset {RUST_FRONTEND} (or set it to 0) to serve through the patched Python frontend", issue="G27")]


# -- G28: tool calls without the gpt-oss tool parser -----------------------------------------------


def check_tool_parser(plan: LaunchPlan) -> list[Check]:
    if plan.installation.version.release[:2] < TOOL_PARSER_CHECKED_FROM:
        return []
    uses = scan_flags(plan.argv[3:])
    auto = [u.name for u in uses if u.name in ("--enable-auto-tool-choice", "--no-enable-auto-tool-choice")]
    auto_on = bool(auto) and auto[-1] == "--enable-auto-tool-choice"
    parser = planning.effective(plan, "--tool-call-parser")
    if not auto_on and parser is None:
        return []
    both = f"--enable-auto-tool-choice --tool-call-parser {GPT_OSS_TOOL_PARSER}"
    if parser is not None and parser != GPT_OSS_TOOL_PARSER:
        message = f"--tool-call-parser {parser}: gpt-oss's harmony parser accepts only the `{GPT_OSS_TOOL_PARSER}` tool parser"
        return [Check("tools", Status.FAIL, message, fix=both, issue="G28")]
    if not auto_on or parser is None:
        missing = "--tool-call-parser openai" if parser is None else "--enable-auto-tool-choice"
        message = f"tool calling is half set up (no {missing}): requests with tools get no `tool_calls`, often `content: null`"
        return [Check("tools", Status.WARN, message, fix=both, issue="G28")]
    return [Check("tools", Status.PASS, f"tool calls parsed ({both})", issue="G28")]


# -- G29: MoE backends forced on GB10 ----------------------------------------------------------------


def check_forced_moe_on_gb10(plan: LaunchPlan) -> list[Check]:
    if plan.profile != "sm121":
        return []
    value = planning.effective(plan, "--moe-backend")
    if value not in FORCED_MOE_ON_GB10:
        return []
    why, (first, end), upstream = FORCED_MOE_ON_GB10[value]
    release = plan.installation.version.release[:2]
    if release < first or (end is not None and release >= end):
        return []
    message = f"--moe-backend {value} on GB10 (SM121): {why} ({upstream})"
    return [Check("moe-backend", Status.WARN, message, fix="drop --moe-backend (automatic selection works on GB10) or use marlin", issue="G29")]


# -- G30: FP8 KV cache on the sliding-window layers --------------------------------------------------


def check_kv_cache_skip(plan: LaunchPlan) -> list[Check]:
    dtype = planning.effective(plan, "--kv-cache-dtype")
    if dtype is None or not dtype.startswith("fp8") or not plan.capabilities.flags.accepts(KV_SKIP_FLAG):
        return []
    skipped = [v for u in scan_flags(plan.argv[3:]) if u.name == KV_SKIP_FLAG for value in u.values for v in value.split(",")]
    if "sliding_window" in skipped:
        return [Check("kv-cache", Status.PASS, f"--kv-cache-dtype {dtype} with the sliding-window layers kept in the model dtype", issue="G30")]
    message = (
        f"--kv-cache-dtype {dtype} also quantizes gpt-oss's sliding-window layers (half of them): they hold only a "
        "short window, so little memory is saved, while the quantization cost and the accuracy risk remain"
    )
    return [Check("kv-cache", Status.WARN, message, fix=f"add {KV_SKIP_FLAG} sliding_window", issue="G30")]


# -- G31: structured-output backends that reject structural tags -------------------------------------


def structured_outputs_backend(args: list[str]) -> str | None:
    """The backend `--structured-outputs-config` names (JSON or the dotted `.backend` form; the last wins)."""
    backend = None
    for use in scan_flags(args):
        if use.name == "--structured-outputs-config.backend" and use.values:
            backend = use.values[0]
        elif use.name == "--structured-outputs-config" and use.values:
            try:
                config = json.loads(use.values[0])
            except ValueError:
                continue
            if isinstance(config, dict) and isinstance(config.get("backend"), str):
                backend = config["backend"]
    return backend


def check_structured_outputs(plan: LaunchPlan) -> list[Check]:
    version = plan.installation.version
    if version.release[:2] < STRUCTURAL_TAG_FROM:
        return []
    backend = structured_outputs_backend(plan.argv[3:])
    if backend not in REJECTS_STRUCTURAL_TAGS:
        return []
    outcome = "400" if version.release[:2] >= (0, 33) else "500 (Internal server error)"
    message = (
        f"structured-output backend {backend}: on the harmony path vLLM {version} turns response_format into a "
        f"structural tag, which {backend} rejects; every such request fails with {outcome}"
    )
    return [Check("structured-output", Status.WARN, message, fix="use the default backend (auto, xgrammar) or guidance", issue="G31")]


# -- G32: FlashInfer's SM90 MoE kernel is compiled on the first start --------------------------------


def check_flashinfer_moe_build(plan: LaunchPlan) -> list[Check]:
    if plan.profile != "sm90" or (asked := flashinfer_moe_asked(plan)) is None:
        return []
    site = Path(plan.installation.site_packages)
    version = installed_version(site, "flashinfer_python")
    if version is None:
        message = f"{asked} needs flashinfer-python, which is not installed in the target: vLLM refuses the backend at start-up"
        fix = f"{pip_command(plan.installation.python, 'check')} (vLLM requires flashinfer-python), or drop {asked}"
        return [Check("moe-build", Status.WARN, message, fix=fix, issue="G32")]
    built = compiled_sm90_moe(site, version, plan.env)
    if built is not None:
        return [Check("moe-build", Status.PASS, f"{asked}: FlashInfer {version}'s SM90 MoE kernel is compiled ({built})", issue="G32")]
    message = (
        f"{asked} on Hopper: FlashInfer {version} compiles its SM90 MoE kernel ({SM90_MOE_MODULE}) on the first "
        f"start ({SM90_MOE_BUILD}): the server is not ready for about an hour"
    )
    build = "from flashinfer.fused_moe.core import get_cutlass_fused_moe_module as build; build('90')"
    fix = f"compile it once before serving: {plan.installation.python} -c \"{build}\"; or drop {asked} (vLLM then picks its Triton kernel on Hopper)"
    return [Check("moe-build", Status.WARN, message, fix=fix, issue="G32")]


def flashinfer_moe_asked(plan: LaunchPlan) -> str | None:
    """How this launch asks vLLM for FlashInfer's CUTLASS MoE kernel, as the user wrote it; None if it does not."""
    caps = plan.capabilities
    if caps is None:
        return None
    if planning.effective(plan, "--moe-backend") == FLASHINFER_MOE_CHOICE and caps.moe.honours_moe_backend:
        return f"--moe-backend {FLASHINFER_MOE_CHOICE}"
    value = plan.env.get(FLASHINFER_MOE_ENV, "").strip()
    if value.isdigit() and int(value) and caps.env.knows(FLASHINFER_MOE_ENV):  # vLLM reads it as bool(int(value))
        return f"{FLASHINFER_MOE_ENV}={value}"
    return None


def installed_version(site: Path, project: str) -> str | None:
    """The version of `project` installed in `site` (`flashinfer_python`: its .dist-info's METADATA)."""
    return distinfo.installed_version(site, project)


def compiled_sm90_moe(site: Path, version: str, environ: dict[str, str]) -> Path | None:
    """FlashInfer's compiled SM90 MoE module where FlashInfer looks first: shipped ahead of time (the package's
    data/aot, or the flashinfer-jit-cache package), then its JIT cache under $FLASHINFER_WORKSPACE_BASE (or
    $HOME)/.cache/flashinfer/VERSION/ARCHS/cached_ops."""
    library = f"{SM90_MOE_MODULE}/{SM90_MOE_MODULE}.so"
    candidates = [site / "flashinfer" / "data" / "aot" / library]
    if installed_version(site, "flashinfer_jit_cache") is not None:
        candidates += sorted((site / "flashinfer_jit_cache").glob(f"**/{library}"))
    base = environ.get("FLASHINFER_WORKSPACE_BASE") or environ.get("HOME") or str(Path.home())
    candidates += sorted((Path(base) / ".cache" / "flashinfer" / version).glob(f"*/cached_ops/{library}"))
    return next((path for path in candidates if path.is_file()), None)
