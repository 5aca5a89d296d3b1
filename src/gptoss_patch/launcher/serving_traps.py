"""Pre-flight checks for the traps of serving gpt-oss on recent vLLM (0.22-0.33), all static.

Each returns Checks with a fix and a known-issue id (docs/known-issues.md): two providers of the
`openai_harmony` package (G26), the Rust frontend bypassing the Python patches (G27), tool calls without
the gpt-oss tool parser (G28), MoE backends forced on GB10 that fail there (G29), an FP8 KV cache that also
quantizes the sliding-window layers (G30), and structured-output backends that reject harmony's
structural tags (G31), FlashInfer's SM90 MoE kernel asked for before it has been compiled (G32), and from 0.33.0
no --reasoning-effort-map where the patch used to map efforts harmony rejects (G11); VLLM_BATCH_INVARIANT=1 moving the
experts to another kernel (G45), a FlashInfer whose SM90 CUTLASS MoE computes wrong results (G47), a release where one
structured-output request can kill the engine (G48), and an NVFP4 (ModelOpt) re-quantized checkpoint (G51). A check
that cannot decide says why in a warning; it never passes by default.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shlex
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from gptoss_patch import distinfo
from gptoss_patch.launcher import plan as planning
from gptoss_patch.launcher.options import is_loopback
from gptoss_patch.launcher.plan import MoeRequest
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
    uses = scan_flags(plan.vllm_flags)
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
    asked = planning.moe_request(plan)
    if asked is None or asked.backend not in FORCED_MOE_ON_GB10:
        return []
    why, (first, end), upstream = FORCED_MOE_ON_GB10[asked.backend]
    release = plan.installation.version.release[:2]
    if release < first or (end is not None and release >= end):
        return []
    message = f"{asked.spelling} on GB10 (SM121): {why} ({upstream})"
    return [Check("moe-backend", Status.WARN, message, fix=f"{asked.undo} (automatic selection works on GB10) or use marlin", issue="G29")]


# -- G30: FP8 KV cache on the sliding-window layers --------------------------------------------------


def check_kv_cache_skip(plan: LaunchPlan) -> list[Check]:
    dtype = planning.effective(plan, "--kv-cache-dtype")
    if dtype is None or not dtype.startswith("fp8") or not plan.capabilities.flags.accepts(KV_SKIP_FLAG):
        return []
    skipped = [v for u in scan_flags(plan.vllm_flags) if u.name == KV_SKIP_FLAG for value in u.values for v in value.split(",")]
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
    backend = structured_outputs_backend(plan.vllm_flags)
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
    named = asked.spelling
    if version is None:
        message = f"{named} needs flashinfer-python, which is not installed in the target: vLLM refuses the backend at start-up"
        fix = f"{pip_command(plan.installation.python, 'check')} (vLLM requires flashinfer-python), or {asked.undo}"
        return [Check("moe-build", Status.WARN, message, fix=fix, issue="G32")]
    built = compiled_sm90_moe(site, version, plan.env)
    if built is not None:
        return [Check("moe-build", Status.PASS, f"{named}: FlashInfer {version}'s SM90 MoE kernel is compiled ({built})", issue="G32")]
    message = (
        f"{named} on Hopper: FlashInfer {version} compiles its SM90 MoE kernel ({SM90_MOE_MODULE}) on the first "
        f"start ({SM90_MOE_BUILD}): the server is not ready for about an hour"
    )
    build = "from flashinfer.fused_moe.core import get_cutlass_fused_moe_module as build; build('90')"
    fix = f"compile it once before serving: {plan.installation.python} -c \"{build}\"; or {asked.undo} (vLLM then picks its Triton kernel on Hopper)"
    return [Check("moe-build", Status.WARN, message, fix=fix, issue="G32")]


def flashinfer_moe_asked(plan: LaunchPlan) -> MoeRequest | None:
    """What asks vLLM for FlashInfer's CUTLASS MXFP4 x BF16 MoE kernel (--moe-backend flashinfer_cutlass, or
    VLLM_USE_FLASHINFER_MOE_MXFP4_BF16 on SM90), as vLLM decides among the launch's spellings; None if nothing does.
    Not the MXFP8-activation variable: another kernel."""
    asked = planning.moe_request(plan)
    if asked is None or asked.backend != FLASHINFER_MOE_CHOICE:
        return None
    return asked if asked.how != "env" or asked.name == FLASHINFER_MOE_ENV else None


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


# -- G47: FlashInfer's SM90 CUTLASS MXFP4 x BF16 MoE computes wrong results in some releases -----------

# flashinfer#3334 (GPQA 0.000 with gpt-oss-20b), #5438 (a racy TMA descriptor): the releases that have the bug.
# Their pins, read on the wheels' METADATA: vLLM 0.22.0-0.22.1 flashinfer-python 0.6.11.post2, 0.23.0-0.24.0 0.6.12,
# 0.25.x 0.6.13, 0.26.0 0.6.14; 0.27.0 pins 0.6.16.post3 (0.20.x-0.21.0: 0.6.8.post1, before the bug).
FLASHINFER_WRONG_RESULTS = (Version("0.6.10"), Version("0.6.16"))  # [first affected, first fixed)
FLASHINFER_FIXED_PIN = "0.6.16.post3"
VLLM_WITH_FIXED_FLASHINFER = "0.27.0"


def check_flashinfer_moe_accuracy(plan: LaunchPlan) -> list[Check]:
    """Refuse FlashInfer's CUTLASS MoE on Hopper with a FlashInfer release whose kernel gives wrong answers."""
    if plan.profile != "sm90" or (asked := flashinfer_moe_asked(plan)) is None:
        return []
    version = installed_version(Path(plan.installation.site_packages), "flashinfer_python")
    if version is None or not flashinfer_gives_wrong_results(version):
        return []  # not installed: G32's row says vLLM refuses the backend
    first, fixed = FLASHINFER_WRONG_RESULTS
    message = (
        f"{asked.spelling} on Hopper: FlashInfer {version}'s CUTLASS MXFP4 x BF16 MoE kernel computes wrong results "
        f"(gpt-oss-20b scored 0.000 on GPQA; flashinfer#3334, #5438): {first} up to {fixed} are affected, and "
        f"vLLM {VLLM_WITH_FIXED_FLASHINFER} and later pin {FLASHINFER_FIXED_PIN}, which is not"
    )
    upgrade = pip_command(plan.installation.python, "install", f"vllm>={VLLM_WITH_FIXED_FLASHINFER}")
    fix = (f"{asked.undo} (vLLM then runs its Triton kernel on Hopper), or {upgrade} "
           f"(flashinfer-python {FLASHINFER_FIXED_PIN})")
    return [Check("moe-backend", Status.FAIL, message, fix=fix, issue="G47")]


def flashinfer_gives_wrong_results(version: str) -> bool:
    first, fixed = FLASHINFER_WRONG_RESULTS
    try:
        return first <= Version(version) < fixed
    except InvalidVersion:
        return False


# -- G45: VLLM_BATCH_INVARIANT=1 moves gpt-oss's experts to another kernel ----------------------------

BATCH_INVARIANT_ENV = "VLLM_BATCH_INVARIANT"
BATCH_INVARIANT_GATE_FROM = (0, 20)  # from 0.20.0 the MoE oracle's is_supported_config checks batch invariance
# What vLLM's automatic MXFP4 choice runs for gpt-oss on an NVIDIA GPU with VLLM_BATCH_INVARIANT=1, read on the
# wheels: only TritonExperts (and its subclasses, such as the OCP MX emulation experts) and, from 0.28.0, the Humming
# experts declare batch invariance; gpt-oss's OAI Triton, FlashInfer and Marlin experts never do. So the automatic
# order (_get_priority_backends_for_gpt_oss) falls through to its first batch-invariant entry: EMULATION on
# 0.20.0-0.21.x and 0.25.0-0.31.x, HUMMING (before EMULATION) from 0.32.0; 0.22.0-0.24.x list neither, and vLLM stops.
BATCH_INVARIANT_EXPERTS = (  # (first, end or None, the backend vLLM runs or None)
    ((0, 20), (0, 22), "EMULATION"),
    ((0, 22), (0, 25), None),
    ((0, 25), (0, 32), "EMULATION"),
    ((0, 32), None, "HUMMING"),
)
HUMMING_DECLARES_FROM = (0, 28)  # HummingExpertsBase._supports_batch_invariance returns True from 0.28.0
EXPERTS_DESCRIBED = {
    "EMULATION": ("the EMULATION experts (the MXFP4 weights dequantized to bf16 for vLLM's generic Triton MoE, which "
                  "vLLM itself calls a research/debugging backend)"),
    "HUMMING": "the HUMMING experts (the humming-kernels package)",
}
NO_BATCH_INVARIANT_STOP = "NotImplementedError: No MXFP4 MoE backend supports the deployment configuration"


def check_batch_invariance(plan: LaunchPlan) -> list[Check]:
    """Which kernel runs gpt-oss's experts under VLLM_BATCH_INVARIANT=1: never vLLM's Triton MXFP4 kernel."""
    if plan.profile == "cpu" or not batch_invariant_on(plan.env):
        return []
    if not plan.capabilities.env.knows(BATCH_INVARIANT_ENV):
        return []
    release = plan.installation.version.release[:2]
    if release < BATCH_INVARIANT_GATE_FROM:
        return []
    named = planning.moe_request(plan)
    if named is not None:
        return _named_backend_under_batch_invariance(plan, named.backend, release)
    running = batch_invariant_experts(release, humming=_humming_installed(plan))
    version = plan.installation.version
    unset = f"unset {BATCH_INVARIANT_ENV}"
    if running is None:
        message = (f"{BATCH_INVARIANT_ENV}=1: none of vLLM {version}'s gpt-oss MoE kernels declares batch invariance, "
                   f"so it stops at start-up ({NO_BATCH_INVARIANT_STOP})")
        has_emulation = "emulation" in plan.capabilities.moe.choices
        emulation = " (or -- --moe-backend emulation: slow dequantized bf16 experts)" if has_emulation else ""
        return [Check("batch-invariance", Status.FAIL, message, fix=f"{unset}{emulation}", issue="G45")]
    message = (f"{BATCH_INVARIANT_ENV}=1: vLLM {version} runs gpt-oss's experts on {EXPERTS_DESCRIBED[running]}, not "
               "its Triton MXFP4 kernel, which does not declare batch invariance (nor do FlashInfer's and Marlin's)")
    fix = f"{unset} to keep vLLM's Triton MXFP4 experts"
    return [Check("batch-invariance", Status.WARN, message, fix=fix, issue="G45")]


def batch_invariant_on(environ: dict[str, str]) -> bool:
    """On as vLLM reads it, bool(int(value)); a value int() rejects stops vLLM, which this row does not judge."""
    value = environ.get(BATCH_INVARIANT_ENV, "").strip()
    return value.lstrip("-").isdigit() and int(value) != 0


def batch_invariant_experts(release: tuple[int, ...], *, humming: bool = True) -> str | None:
    """The MXFP4 backend vLLM's automatic choice runs for gpt-oss under VLLM_BATCH_INVARIANT=1 (None: none, it stops).
    HUMMING needs the humming package; without it the next batch-invariant entry, EMULATION, runs."""
    for first, end, running in BATCH_INVARIANT_EXPERTS:
        if first <= release[:2] and (end is None or release[:2] < end):
            return "EMULATION" if running == "HUMMING" and not humming else running
    return None


def _named_backend_under_batch_invariance(plan: LaunchPlan, named: str, release: tuple[int, ...]) -> list[Check]:
    if named == "emulation" or (named == "humming" and release >= HUMMING_DECLARES_FROM):
        return []  # experts that declare batch invariance: vLLM runs what was asked for
    message = (f"{BATCH_INVARIANT_ENV}=1 with the {named} MoE backend: its experts do not declare batch invariance, "
               f"so vLLM {plan.installation.version} stops at start-up (\"does not support the deployment "
               "configuration since batch invariance\")")
    return [Check("batch-invariance", Status.FAIL, message, fix=f"unset {BATCH_INVARIANT_ENV}", issue="G45")]


def _humming_installed(plan: LaunchPlan) -> bool:
    site = Path(plan.installation.site_packages)
    return installed_version(site, "humming_kernels") is not None or (site / "humming").is_dir()


# -- G48: one structured-output request can kill the shared engine before 0.30.0 -----------------------

STRUCTURED_OUTPUT_ADVISORY = "PYSEC-2026-4199"
STRUCTURED_OUTPUT_FIXED = (0, 30)


def check_structured_output_advisory(plan: LaunchPlan) -> list[Check]:
    """Every OpenAI-compatible server accepts structured-output requests (response_format, structured_outputs):
    no flag turns them off, so below the fixed release any client can stop the engine for every other client. A
    warning where clients from other machines reach the server; on loopback or a unix socket, a passing row that
    still says it (the clients are this machine's)."""
    version = plan.installation.version
    if version.release[:2] >= STRUCTURED_OUTPUT_FIXED:
        return []
    fixed = ".".join(str(part) for part in STRUCTURED_OUTPUT_FIXED) + ".0"
    message = (f"vLLM {version}: one structured-output request (response_format or structured_outputs, which "
               f"every client may send) can kill the engine all clients share ({STRUCTURED_OUTPUT_ADVISORY}, "
               f"fixed in {fixed})")
    host = planning.effective(plan, "--host") or "0.0.0.0"  # vLLM's own default binds every interface
    if planning.effective(plan, "--uds") or is_loopback(host):
        return [Check("advisory", Status.PASS, f"{message}; only this machine's clients reach it", issue="G48")]
    fix = f"{pip_command(plan.installation.python, 'install', f'vllm>={fixed}')}, or serve only clients you trust"
    return [Check("advisory", Status.WARN, message, fix=fix, issue="G48")]


# -- G51: NVFP4 (ModelOpt) re-quantized gpt-oss checkpoints ---------------------------------------------


def check_checkpoint_quantization(plan: LaunchPlan) -> list[Check]:
    """Refuse a gpt-oss checkpoint re-quantized to NVFP4 with ModelOpt: vLLM fails to load it or emits "!!!!"."""
    found = nvfp4_modelopt_config(plan.model, plan.env)
    if found is None:
        return []
    message = (f"{plan.model} is a ModelOpt NVFP4 re-quantization ({found}): vLLM fails to load such gpt-oss "
               "checkpoints or answers \"!!!!\" (vllm#46641, vllm#46645, open)")
    fix = "serve the original MXFP4 checkpoint: openai/gpt-oss-20b or openai/gpt-oss-120b"
    return [Check("checkpoint", Status.FAIL, message, fix=fix, issue="G51")]


def nvfp4_modelopt_config(model: str | None, environ: dict[str, str]) -> str | None:
    """Where the model says it is ModelOpt NVFP4 (config.json's quantization_config, or ModelOpt's
    hf_quant_config.json), read from a local directory or the Hugging Face cache's snapshots of a model id; None when
    it does not say so, or is not here."""
    for directory in model_directories(model, environ):
        config = _json_object(directory / "config.json").get("quantization_config")
        if isinstance(config, dict) and _is_modelopt_nvfp4(config.get("quant_method"), config.get("quant_algo")):
            described = f"{config.get('quant_method')} {config.get('quant_algo') or ''}".rstrip()
            return f"{directory / 'config.json'}: quantization_config {described}"
        exported = _json_object(directory / "hf_quant_config.json")
        producer = (exported.get("producer") or {}).get("name") if isinstance(exported.get("producer"), dict) else None
        quantization = exported.get("quantization")
        quantization = quantization if isinstance(quantization, dict) else {}
        if producer == "modelopt" and _is_modelopt_nvfp4("modelopt", quantization.get("quant_algo")):
            return f"{directory / 'hf_quant_config.json'}: {producer} {quantization.get('quant_algo')}"
    return None


def _is_modelopt_nvfp4(method: object, algorithm: object) -> bool:
    method = str(method or "").lower()
    return method == "modelopt_fp4" or (method == "modelopt" and "nvfp4" in str(algorithm or "").lower())


def model_directories(model: str | None, environ: dict[str, str]) -> list[Path]:
    """A local model directory, or the snapshots of a model id in the Hugging Face cache vLLM will read."""
    if not model:
        return []
    local = Path(model).expanduser()
    if local.is_dir():
        return [local]
    if model.count("/") != 1:
        return []
    return sorted((hub_cache(environ) / f"models--{model.replace('/', '--')}" / "snapshots").glob("*"))


def hub_cache(environ: dict[str, str]) -> Path:
    """huggingface_hub's cache: $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if environ.get("HF_HUB_CACHE"):
        return Path(environ["HF_HUB_CACHE"])
    home = environ.get("HF_HOME") or str(Path(environ.get("HOME") or Path.home()) / ".cache" / "huggingface")
    return Path(home) / "hub"


def _json_object(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
