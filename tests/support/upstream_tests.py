"""vLLM's own tests of each backported fix, run against the patched releases (issue #23, "upstream parity").

Each `Suite` names a patch with an upstream fix, the release whose source distribution holds the tests
(the fixing release, or a later one that still has them) and the test files that check the fix. At test
time (tests/test_upstream_parity.py):

1. the sdist comes through tests/support/artefacts.py (`artefacts.sdist`: cached with the wheels, file-locked,
   never committed; missing or corrupt, the test fails in one line that says how to fetch it);
2. `extract` copies only the named files (and the `__init__.py` of their packages) into a temporary
   directory, byte for byte, and writes beside them a conftest.py of our own (SHIM, below);
3. `run` runs pytest on them with the interpreter of a clone of a CPU harness venv (tests/support/harness.py),
   stock or with gptoss-patch's default set applied, and returns every test's outcome.

The rule (test_upstream_parity.py): every upstream test that passes on the stock release of the pass set
(the fixing release, or the next one built) passes on each patched release. What is not run, or not expected
to pass yet, is in one place, LISTED below, each row with its reason; review it with each new release.
Nothing is deselected anywhere else.

The shim only sets things up: offline vocabulary and Hugging Face cache, and, for a name a test file
imports that an older release lacks, a placeholder that raises when called (so the module imports;
the tests that need the name are LISTED with `needs`, and not run there). It never edits an upstream
file or assertion. Four more pieces of set-up, each declared on its Suite:

- `hub_models`: the Hugging Face repos whose tokenizer and generation config the files load
  (`AutoTokenizer.from_pretrained("openai/gpt-oss-20b")`). run() puts the files of the tiny random gpt-oss
  (gptoss_patch.model: its tokenizer is o200k_base with harmony's special tokens at harmony's ids, as in the
  published checkpoints; its generation config has their stop ids) into the offline Hugging Face cache under
  that name, so they load without a network. A test that needs more of the real checkpoint fails on the
  stock release too, and is no part of the pass set.
- `settings`: where a patch reads an option from another place than the fixing release (an environment
  variable instead of an attribute that a later server flag sets), the shim gives the class a property of
  that name on the releases older than the setting's `before`: assigning to it sets the variable for
  that test (restored after it). The test configures the patched release through its own option, and its
  assertions stay as they are.
- `moved`: a name a file imports from the module where a later release moved it, which an older release defines
  elsewhere: on a release that lacks it there, the shim binds that release's own object under the new name (the
  module an empty stand-in where the release has none), so the tests that use it run against the real thing.
- `keywords`: a keyword a file passes to a constructor whose older releases lack that parameter because they
  have no such switch, and behave as the file's value asks: where the release's `__init__` has no parameter of
  that name, the shim drops the keyword when its value is that one (any other value raises TypeError, since the
  release cannot do it). The object is the release's own, built with every other argument as the file passes it.

pytest and pytest-asyncio are not in the harness recipe (adding them to harness-requirements.txt would
rebuild every harness venv): `install_pytest` puts the PYTEST_STACK wheels, from the wheel cache,
into the clone with `pip install --no-deps` (about 3 s).
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from gptoss_patch import engine, model, target
from gptoss_patch.patches import harmony_reasoning_effort
from gptoss_patch.spec import Selection
from tests.support import artefacts, harness, installers, tiny_model

RUN_TIMEOUT = 900  # seconds for one upstream pytest run (importing vLLM's API layer alone takes 8-20 s)
RESULTS_ENV = "GPTOSS_PATCH_UPSTREAM_RESULTS"  # where the shim writes {nodeid: [outcome, last line]}
PLAN_ENV = "GPTOSS_PATCH_UPSTREAM_PLAN"  # LISTED rows the shim acts on: names it checks, tests it keeps out
PYTEST_STACK = ("pytest==9.2.0", "pluggy==1.7.0", "iniconfig==2.3.1", "pygments==2.21.0", "pytest-asyncio==1.5.0",
                *(("backports-asyncio-runner==1.2.0",) if sys.version_info < (3, 11) else ()))


@dataclass(frozen=True)
class Setting:
    """An option the patch reads from `env` where the fixing release has `attribute` (module:Class.name)."""

    attribute: str
    env: str
    before: str  # only on patched releases older than this one (from there the release has the attribute)
    why: str


@dataclass(frozen=True)
class Moved:
    """A name the files import from `name` (module:name) that older releases define at `source` (module:name)."""

    name: str
    source: str  # bound under `name` on a release that lacks `name` (never where it has it)
    why: str


@dataclass(frozen=True)
class Keyword:
    """A keyword the files pass to `owner` (module:Class) that older releases' __init__ lacks, being without the switch.

    Those releases always behave as `keyword=value` does on the release that has it (`why` says how that was checked
    on the wheels), so the shim drops it there when the value is `value`, and only then.
    """

    owner: str
    keyword: str
    value: bool | str | int | None  # the value whose behaviour releases without the parameter have
    why: str


@dataclass(frozen=True)
class Suite:
    """Upstream's tests of one patch's fix: which release they come from, which files, where they run."""

    patch: str  # the patch id (its dossier names these tests)
    release: str  # whose sdist holds the tests: the fixing release, or a later one that still has them (one download)
    files: tuple[str, ...]  # test files, relative to the sdist's root
    support: tuple[str, ...]  # upstream helper modules the files import (extracted beside them, unchanged)
    patched: tuple[str, ...]  # releases run with the default set applied (each has a harness venv in the suite)
    stock_run: str  # the release whose stock harness gives the pass set: the fixing release, or the next one built
    hub_models: tuple[str, ...] = ()  # Hugging Face repos the files load a tokenizer from: the tiny gpt-oss's, offline
    settings: tuple[Setting, ...] = ()  # the patch's own option, set where the test sets the fixing release's
    moved: tuple[Moved, ...] = ()  # names the files import from where a later release moved them
    keywords: tuple[Keyword, ...] = ()  # constructor keywords of a later switch, dropped where the release lacks it


@dataclass(frozen=True)
class Listed:
    """Upstream tests (a node id, or an fnmatch pattern of them) not run, or not required to pass, and why.

    At most one of the conditions applies; `why` is what the dossiers repeat.
    """

    pattern: str
    why: str
    needs: str = ""  # "module:name": not run on a release that lacks it (the shim binds a placeholder there)
    before: str = ""  # a later, unrelated change: not required on patched releases older than this one
    pending: str = ""  # fails on patched releases until this lands (a pass there says: drop the row)
    departs: str = ""  # the patch named here departs from the fixing release on purpose: not required when patched
    suite: str = "harmony_instructions"  # the SUITES key; a row of a suite that is not in SUITES is never run
    everywhere: bool = False  # not run at all (network, a device, a served model)


HARMONY_UTILS = "vllm.entrypoints.openai.parser.harmony_utils"
PARSER_TESTS = "tests/entrypoints/openai/parser/test_harmony_utils.py"
PARITY_TESTS = "tests/entrypoints/openai/parser/test_harmony_render_parity.py"
RESPONSES_TESTS = "tests/entrypoints/openai/responses/test_response_input_to_harmony.py"
RESPONSES_HARMONY = "vllm.entrypoints.openai.responses.harmony"

HARMONY_TESTS = "tests/parser/test_harmony.py"
RENDER_PARITY_TESTS = "tests/entrypoints/openai/test_render_parity.py"
ONLINE_RENDERER = "vllm.renderers.online_renderer"
EFFORT_MAP_ENV = harmony_reasoning_effort.ENV  # where both reasoning-effort patches read the map

SUITES = {
    "harmony_instructions": Suite(
        patch="harmony_instructions",
        release="0.23.0",
        files=(PARSER_TESTS, PARITY_TESTS, RESPONSES_TESTS),
        support=("tests/entrypoints/openai/utils.py",),
        patched=("0.15.1", "0.17.1", "0.18.0", "0.22.1"),  # both ends of both bands
        stock_run="0.23.0",
    ),
    # 0.32.0's fix, tested by 0.33.0's copy of the file (one sdist for both suites below), on both ends of the
    # HarmonyParser band (0.24.0-0.31.x; on 0.24.0 the HarmonyParser changes of 0.25.0 and 0.31.0 are LISTED); the
    # chat-generator band (0.15.1-0.23.x) has no vllm.parser.harmony, which the file imports at the top, so nothing
    # of it could run there.
    "harmony_stream_guard": Suite(
        patch="harmony_stream_guard",
        release="0.33.0",
        files=(HARMONY_TESTS,),
        support=(),
        patched=("0.24.0", "0.31.0"),
        stock_run="0.33.0",
        hub_models=("openai/gpt-oss-20b",),
        moved=(Moved(
            "vllm.entrypoints.generate.base.protocol:FunctionCall",
            "vllm.entrypoints.openai.engine.protocol:FunctionCall",
            why="the file imports FunctionCall (only to annotate its helper tool_call_tuples) from where 0.29.0 moved "
                "it; 0.24.0-0.28.0 define the same model in vllm.entrypoints.openai.engine.protocol",
        ),),
    ),
    # 0.27.0's own copy of the file (the tag and TestAdjustRequest's cases changed after 0.27.0: 0.33.0's copy adds a
    # case and fixtures), on 0.25.0, of the HarmonyParser band 0.24.0-0.26.x the release whose other parser tests
    # pass unchanged (0.24.0 predates flush() and _normalize_recipient: the harmony_stream_guard rows below). The six
    # `tool_*` cases are the fix; TestAdjustRequest needs no VllmConfig in this copy, so it runs on the CPU harness.
    "harmony_tool_choice_structural": Suite(
        patch="harmony_tool_choice_structural",
        release="0.27.0",
        files=(HARMONY_TESTS,),
        support=(),
        patched=("0.25.0",),
        stock_run="0.27.0",
        hub_models=("openai/gpt-oss-20b",),
    ),
    # 0.33.0's --reasoning-effort-map tests drive OnlineRenderer (0.25.0 on), on 0.25.0, the oldest release of the
    # OnlineRenderer band of harmony_reasoning_effort_none (0.25.0-0.32.x; harmony_reasoning_effort maps on all of
    # 0.18.0-0.32.x), and on 0.32.0, its newest: on 0.25.0
    # the Chat/Responses parity tests need OnlineRenderer.render_responses (0.30.0) and the `none` rejection test
    # 0.30.0's VLLMValidationError (LISTED below); the effort-map test itself runs there. 0.18.0-0.24.x build the harmony
    # request in OpenAIServingRender, which the file never calls (the `needs` row below).
    "harmony_reasoning_effort": Suite(
        patch="harmony_reasoning_effort",
        release="0.33.0",
        files=(RENDER_PARITY_TESTS,),
        support=(),
        patched=("0.25.0", "0.32.0"),
        stock_run="0.33.0",
        settings=(Setting(
            f"{ONLINE_RENDERER}:OnlineRenderer.reasoning_effort_map", EFFORT_MAP_ENV, before="0.33.0",
            why=f"0.33.0's --reasoning-effort-map sets this attribute; the patches read the same JSON from {EFFORT_MAP_ENV}",
        ),),
        moved=(Moved(
            "vllm.entrypoints.serve.engine.protocol:ErrorResponse",
            "vllm.entrypoints.openai.engine.protocol:ErrorResponse",
            why="the file imports ErrorResponse (for `assert not isinstance(result, ErrorResponse)` in its capture helpers) "
                "from where 0.29.0 moved it; 0.25.0-0.28.0 define it in vllm.entrypoints.openai.engine.protocol, which "
                "their OnlineRenderer returns",
        ),),
        keywords=(Keyword(
            f"{ONLINE_RENDERER}:OnlineRenderer", "trust_request_mm_kwargs", True,
            why="the fixture passes trust_request_mm_kwargs=True (--trust-request-mm-kwargs, 0.31.0); in 0.31.0-0.33.0 it "
                "gates only validate_request_mm_kwargs, which returns at once when it is True and otherwise rejects a "
                "request's mm_processor_kwargs/media_io_kwargs. 0.25.0-0.30.0 have no such check anywhere (the name is "
                "in none of their files): they always take those kwargs, as True does. No test sends multimodal content",
        ),),
    ),
}

# The one list of upstream tests not run, or not required to pass, with why. Review it with each new release.
LISTED = (
    Listed(f"{PARSER_TESTS}::TestIsFunctionRecipient*",
           "bare-name function recipients (is_function_recipient), a later, unrelated feature",
           needs=f"{HARMONY_UTILS}:is_function_recipient"),
    Listed(f"{PARSER_TESTS}::TestExtractFunctionFromRecipient::*",
           "extract_function_from_recipient comes with is_function_recipient, a later, unrelated feature",
           needs=f"{HARMONY_UTILS}:extract_function_from_recipient"),
    Listed(f"{PARSER_TESTS}::TestGetSystemMessage::test_unsupported_reasoning_effort_raises_clear_error",
           "0.23.0 rejects reasoning_effort='max'; the default set's harmony_reasoning_effort maps it to high on "
           "purpose from 0.18.0 (G11), and before 0.18.0 the clear ValueError itself is later (a KeyError there)",
           departs="harmony_reasoning_effort"),
    *(Listed(pattern, "the Responses input conversion of 0.17.0 on (0.15.1-0.16.x convert in harmony_utils, other names)",
             needs=f"{RESPONSES_HARMONY}:{name}")
      for name, pattern in (
        ("response_input_to_harmony", f"{RESPONSES_TESTS}::*"),
        ("response_input_to_harmony", f"{PARITY_TESTS}::*"),
        ("response_input_to_harmony", f"{PARSER_TESTS}::TestResponseInputToHarmonyReasoningItem::*"),
        ("response_previous_input_to_harmony", f"{PARSER_TESTS}::TestCommonParseInputToHarmonyMessage::*[[]response_previous_input_to_harmony]"),
    )),
    *(Listed(f"{PARSER_TESTS}::TestGetSystemMessage::{name}",
             "0.15.1-0.16.x leave `commentary` out of tool-less requests; vllm#32114 (0.17.0) made it valid (G04)",
             before="0.17.0") for name in ("test_commentary_channel_present_without_custom_tools", "test_all_standard_channels_present")),
    Listed(f"{PARSER_TESTS}::TestParseChatOutput::test_parse_chat_output_commentary_with_recipient_excluded",
           "parse_chat_output as later releases changed it, unrelated to #44330; passes stock from 0.17.1, the suite's "
           "next harness after 0.15.1", before="0.17.1"),
    Listed(f"{HARMONY_TESTS}::TestAdjustRequest::*",
           "structured output for harmony requests (xgrammar), unrelated to the stream guard; its fixture builds a "
           "VllmConfig, which needs a device: the CPU harness runs vLLM's CUDA build without a GPU (G25)",
           suite="harmony_stream_guard", everywhere=True),
    *(Listed(f"{HARMONY_TESTS}::TestAdjustRequest::test_adjust_request[[]{kind}_*]",
             "0.27.0 also rewrites response_format and structured_outputs constraints into a harmony structural tag, "
             "together with its global change of the reasoning gate (the grammar from the first token for every "
             "gpt-oss request); the patch constrains only the tool_choice requests that need a call, through the "
             "per-request flag, and leaves other output constraints on the stock final-channel gate",
             departs="harmony_tool_choice_structural", suite="harmony_tool_choice_structural")
      for kind in ("response_format", "structured_outputs")),
    # 0.24.0, the oldest release of the HarmonyParser band, predates these HarmonyParser changes (each checked on the
    # 0.24.0-0.31.0 wheels). Stock 0.24.0 fails the same tests the same way: the guard changes none of them.
    *(Listed(f"{HARMONY_TESTS}::{name}", why, before=before, suite="harmony_stream_guard")
      for before, why, names in (
        ("0.25.0", "HarmonyParser.flush() (process_eos(), then a parser reset: vllm#46437) comes with 0.25.0, "
                   "unrelated to the guard: 0.24.0 has no such method",
         ("TestFlush::test_flush",)),
        ("0.25.0", "the parser reset after parse() and a finished parse_delta() (flush(), vllm#46437) comes with "
                   "0.25.0, unrelated to the guard: on 0.24.0 the test's content assertions pass and only its last "
                   "check fails, which reads the reset state (_parser, _current_message_tokens) of 0.25.0's parser",
         ("TestParse::test_interrupted_first_message", "TestParse::test_interrupted_reasoning_first_message",
          "TestParse::test_truncated_output", "TestParseDelta::test_basic")),
        ("0.25.0", "an output that ends in a non-terminal state returns its unparsed tail as final content "
                   "(flush() catching process_eos()'s HarmonyError: vllm#47062, vllm#47379) from 0.25.0; 0.24.0 drops "
                   "the tail. No token is rejected mid-stream there, so the guard is not involved",
         ("TestFlush::test_flush_recovers_invalid_output", "TestParse::test_malformed_msgs_recovers_raw_content",
          "TestParseDelta::test_malformed_msgs_recovers_raw_content")),
        ("0.25.0", "HarmonyParser._normalize_recipient (a `<|constrain|>json` that openai-harmony parses as the "
                   "recipient of a final message is dropped) comes with 0.25.0, unrelated to the guard",
         ("TestProcessChunk::test_constrained_output_segment_recipient_normalized",)),
        ("0.31.0", "HarmonyParser.count_reasoning_tokens (chat usage's reasoning-token count) comes with 0.31.0, a "
                   "later feature: 0.24.0-0.30.0 have no such method",
         tuple(f"TestCountReasoningTokens::{test}" for test in (
             "test_matches_process_chunk", "test_excludes_harmony_control_tokens", "test_final_only_has_no_reasoning",
             "test_streaming_reuses_running_total", "test_does_not_disturb_stream_state"))),
      ) for name in names),
    # 0.25.0, the oldest release of the OnlineRenderer band, predates these (each checked on the 0.25.0-0.33.0 wheels);
    # stock 0.25.0 fails them the same way. The effort-map test (test_effort_map_applies_to_harmony) is not among them.
    *(Listed(f"{RENDER_PARITY_TESTS}::{name}",
             "Chat/Responses render-input parity through OnlineRenderer.render_responses, which comes with 0.30.0 (the "
             "Responses request rendered by the shared OnlineRenderer); 0.25.0-0.29.0 render it in OpenAIServingResponses, "
             "so the file's _capture_responses fails (AttributeError) after the Chat side rendered. The template path of "
             "a llama config, not harmony: unrelated to the effort map",
             before="0.30.0", suite="harmony_reasoning_effort")
      for name in (
        "TestConversationRenderParity::test_multiturn_tool_calling",
        *(f"TestToolsRenderParity::test_tools_with_tool_choice[[]{choice}]" for choice in ("auto", "required", "named")),
        *(f"TestToolsRenderParity::test_tools_with_tool_choice_none[[]{tools}]" for tools in ("include_tools", "exclude_tools")),
        "TestToolsRenderParity::test_function_tool_optional_fields",
        *(f"TestReasoningRenderParity::test_reasoning_effort[[]{effort}]"
          for effort in ("none", "minimal", "low", "medium", "high", "xhigh")),
        "TestReasoningRenderParity::test_explicit_enable_thinking_not_overridden",
        "TestTemplateKwargsRenderParity::test_unset_template_values_preserve_defaults",
        "TestTemplateKwargsRenderParity::test_passthrough_fields",
    )),
    Listed(f"{RENDER_PARITY_TESTS}::TestReasoningRenderParity::test_reasoning_effort_none_rejected_by_harmony",
           "0.25.0-0.29.0 reject reasoning_effort='none' with a plain ValueError (same message); VLLMValidationError with "
           "parameter='reasoning_effort', which the test expects, comes with 0.30.0. Patched 0.25.0 without a map still "
           "rejects `none`, with stock's ValueError",
           before="0.30.0", suite="harmony_reasoning_effort"),
    Listed(f"{RENDER_PARITY_TESTS}::*",
           "OnlineRenderer comes with 0.25.0; 0.18.0-0.24.x build the harmony request in OpenAIServingRender, "
           "checked with {\"none\": \"low\"} through the real builder of 0.18.0 and 0.22.1 by "
           "tests/patches/test_harmony_reasoning_effort_none.py",
           needs=f"{ONLINE_RENDERER}:OnlineRenderer", suite="harmony_reasoning_effort"),
)


def listed(nodeid: str, suite: str) -> list[Listed]:
    """`suite`'s rows for `nodeid` (two suites may run the same path from different sdists: tests/parser/test_harmony.py)."""
    return [row for row in LISTED if row.suite == suite and fnmatch.fnmatchcase(nodeid, row.pattern)]


def excused(nodeid: str, version: str, suite: str) -> list[Listed]:
    """The rows that excuse `nodeid` from passing on patched `version` (a `needs` row excuses only by deselecting)."""
    return [row for row in listed(nodeid, suite)
            if row.departs or row.everywhere or (row.before and Version(version) < Version(row.before))]


# -- the sdist ---------------------------------------------------------------------------------------


def extract(suites: Sequence[Suite], dest: Path) -> Path:
    """The suites' files (and their packages' `__init__.py`) from their one sdist, unchanged, plus our conftest.py.

    Read once per sdist and module (tests/test_upstream_parity.py): pytest writes nothing there (no bytecode, no cache),
    so every run of those suites shares the tree."""
    (release,) = {suite.release for suite in suites}  # one sdist: suites of different releases are extracted apart
    sdist = artefacts.sdist(f"vllm=={release}")
    prefix = f"vllm-{release}/"
    named = {rel for suite in suites for rel in (*suite.files, *suite.support)}
    wanted = set(named)
    for rel in list(wanted):
        parts = Path(rel).parent.parts
        wanted.update(str(Path(*parts[: i + 1], "__init__.py")) for i in range(len(parts)))
    found = set()
    with tarfile.open(sdist, "r:gz") as archive:
        for member in archive:
            rel = member.name.removeprefix(prefix)
            if member.isfile() and rel in wanted:
                out = dest / rel
                out.parent.mkdir(parents=True, exist_ok=True)
                source = archive.extractfile(member)
                assert source is not None
                out.write_bytes(source.read())
                found.add(rel)
    missing = sorted(named - found)
    if missing:
        owners = ", ".join(suite.patch for suite in suites)
        raise artefacts.MissingArtefact(f"{sdist.name} has no {', '.join(missing)}: "
                                        f"the {owners} suite in tests/support/upstream_tests.py names files it lacks")
    shutil.copyfile(Path(__file__).with_name("upstream_shim.py"), dest / "conftest.py")
    return dest


# -- a venv to run them in ---------------------------------------------------------------------------


def venv(version: str, dest: Path, *, patched: bool) -> Path:
    """A clone of the release's harness venv with pytest, and gptoss-patch's default set applied if `patched`."""
    python = harness.clone_venv(harness.cpu_venv(version), dest)
    install_pytest(python)
    if patched:
        report = engine.apply(target.discover(str(python)), Selection())
        left = [f"{r.id}: {r.state.value} {r.error or r.reason}" for r in report.results if r.state.needs_action]
        if left:
            raise harness.HarnessError(f"apply on {version} left {'; '.join(left)}")
    return python


def install_pytest(python: Path) -> None:
    """pytest and pytest-asyncio from the wheel cache into a clone, with uv where it is found (a tenth of a second,
    where pip's own start-up costs seconds in each of the suite's runs)."""
    wheels = [str(artefacts.wheel(requirement)) for requirement in PYTEST_STACK]
    uv = installers.installer()
    pip = [uv, "pip", "install", "--python", str(python), "--no-config"] if uv else [
        str(python), "-m", "pip", "install", "--no-input", "--disable-pip-version-check", "-q"]
    proc = subprocess.run([*pip, "--no-deps", "--no-index", *wheels], capture_output=True, text=True, check=False,
                          timeout=300)
    if proc.returncode != 0:
        raise harness.HarnessError(f"installing pytest into {python} failed: {proc.stderr.strip()[-300:]}")


# -- the offline Hugging Face cache --------------------------------------------------------------------

HUB_REVISION = "0" * 40  # the snapshot's name in the cache; only refs/main points at it
HUB_SKIPPED = (model.STAMP, ".safetensors")  # the weights and our stamp: a tokenizer and its configs are what is read


def offline_hub_model(python: Path, hf_home: Path, repo: str) -> Path:
    """`repo` in the Hugging Face cache at `hf_home` (HF_HUB_OFFLINE reads it), holding the tiny gpt-oss's files.

    The tiny model (tests/support/tiny_model.py, built once per recipe with `python`, in a directory of its own
    so the served model keeps its builder) has gpt-oss's tokenizer files: o200k_base with harmony's special tokens
    at harmony's ids, its generation config's stop ids, a gpt_oss config.json. Its files are linked, not copied.
    """
    source = tiny_model.tiny_model(python, prefix="upstream-")
    repo_dir = hf_home / "hub" / f"models--{repo.replace('/', '--')}"
    snapshot = repo_dir / "snapshots" / HUB_REVISION
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs").mkdir(exist_ok=True)
    (repo_dir / "refs" / "main").write_text(HUB_REVISION)
    for path in sorted(source.iterdir()):
        link = snapshot / path.name
        if path.is_file() and not path.name.endswith(HUB_SKIPPED) and not link.is_symlink():
            link.symlink_to(path)
    return snapshot


# -- a run -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    outcome: str  # passed, failed, skipped, error (collection or set-up)
    message: str  # the last line of the failure, if any


def run(python: Path, root: Path, suites: Sequence[Suite], version: str, only: Sequence[str] = ()) -> dict[str, Outcome]:
    """Run the suites' files under `python` in one pytest process (or, `only`, those node ids alone: the stock runs that
    need just the tests that must fail there); every test's outcome by node id (`deselected`: LISTED keeps it out here).

    Suites run together only where their set-up cannot meet: each LISTED row and shim entry names its own suite's
    files, and a `settings` entry in force on `version` (a property that turns the test's option into an environment
    variable) is one suite's only (`together` says whether suites may share a process on a release)."""
    if len(suites) > 1 and not together(suites, version):
        raise ValueError(f"{', '.join(s.patch for s in suites)} cannot share a pytest process on {version}")
    names = {suite.patch for suite in suites}
    handle, name = tempfile.mkstemp(prefix=f"{version}-", suffix="-results.json", dir=root.parent)
    os.close(handle)
    results = Path(name)
    results.unlink()  # the shim writes it at the session's end: its absence says the run never got there
    plan = {
        "needs": [[row.pattern, row.needs, row.why] for row in LISTED if row.needs and row.suite in names],
        "deselect": [[row.pattern, row.why] for row in LISTED if row.everywhere and row.suite in names],
        "settings": [[s.attribute, s.env] for suite in suites for s in suite.settings if Version(version) < Version(s.before)],
        "moved": [[m.name, m.source] for suite in suites for m in suite.moved],
        "keywords": [[k.owner, k.keyword, k.value] for suite in suites for k in suite.keywords],
    }
    for repo in dict.fromkeys(repo for suite in suites for repo in suite.hub_models):
        offline_hub_model(python, root / ".hf", repo)
    inherited = ("VLLM_", "TIKTOKEN_", "PYTEST_", "HF_", "GPTOSS_PATCH_")  # a developer's settings change no outcome
    env = {k: v for k, v in os.environ.items() if not k.startswith(inherited)}
    env.update(
        TIKTOKEN_ENCODINGS_BASE=str(harness.vocab_dir(python)),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HOME=str(root / ".hf"),
        PYTHONDONTWRITEBYTECODE="1",
        **{RESULTS_ENV: str(results), PLAN_ENV: json.dumps(plan)},
    )
    what = f"upstream tests of {' and '.join(s.patch for s in suites)} ({suites[0].release}) on {version}"
    command = [str(python), "-m", "pytest", "-p", "no:cacheprovider", "-q", "--rootdir", str(root),
               "-o", "addopts=", "-W", "ignore", *(only or [f for suite in suites for f in suite.files])]
    try:
        proc = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        raise harness.HarnessError(f"{what}: no answer within {RUN_TIMEOUT} s") from None
    if not results.exists():
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
        raise harness.HarnessError(f"{what} wrote no results: {' | '.join(tail)}")
    return {nodeid: Outcome(*value) for nodeid, value in json.loads(results.read_text()).items()}


def together(suites: Sequence[Suite], version: str) -> bool:
    """Whether `suites` can run in one pytest process on `version`: one sdist, and at most one of them with a `settings`
    entry in force there (the others' tests would see its property on a class they use too)."""
    settings = [suite for suite in suites if any(Version(version) < Version(s.before) for s in suite.settings)]
    return len({suite.release for suite in suites}) == 1 and len(settings) <= 1


def of_suite(outcomes: dict[str, Outcome], suite: Suite) -> dict[str, Outcome]:
    """The outcomes of `suite`'s own files in a run that may have run other suites' files beside them."""
    return {nodeid: o for nodeid, o in outcomes.items() if nodeid.partition("::")[0] in suite.files}
