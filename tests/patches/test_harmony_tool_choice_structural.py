"""harmony_tool_choice_structural: HarmonyParser.adjust_request constrains required/named tool_choice (G52).

Snippets are hand-written in the shape of `class HarmonyParser` (parser/harmony.py, 0.24.0-0.26.x: its last member
is `process_chunk` in 0.24.x, `_normalize_recipient` from 0.25.0) and of the registry, protocol and serving lines
the patch builds on. What the method does is checked by 0.27.0's own TestAdjustRequest on patched 0.25.0
(tests/test_upstream_parity.py); the render call that reaches it is harmony_tool_choice_render's. Hostile request
shapes (issue #37) end on patched 0.25.0 as on 0.27.0, up to the engine, except a tool schema xgrammar cannot build,
which ends as on stock 0.25.0 (taken unconstrained, where 0.27.0 answers 500): the harness test at the end.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

from gptoss_patch.patches import harmony_tool_choice_render
from gptoss_patch.patches.harmony_tool_choice_structural import (
    ADJUST,
    BUILDER,
    HELPER_SOURCE,
    MARK,
    METHOD_SOURCE,
    PROTOCOL,
    REGISTRY,
    SERVING,
    SPEC,
    TAG_KEY,
    TARGET,
    fixed_upstream,
    is_applied,
)
from gptoss_patch.versions import KNOWN_RELEASES
from tests.patches.helpers import round_trip_on_the_real_file, status_on_fake_site, wheel_source
from tests.support import chat_output, harness, tools
from tests.support.markers import needs

SUPPORT = {  # what 0.24.0-0.26.x have and the patch builds on (drift without it)
    REGISTRY: """\
        def register_vllm_structural_tag(model):
            pass
        def get_model_structural_tag(model, tools, tool_choice, reasoning):
            pass
        def _get_function_parameters(function):
            pass
    """,
    PROTOCOL: """\
        class ChatCompletionRequest:
            _grammar_from_tool_parser: bool = PrivateAttr(default=False)
    """,
    SERVING: """\
        class OpenAIServingChat:
            async def create_chat_completion(self, request):
                if request._grammar_from_tool_parser:
                    reasoning_ended = True
    """,
}
check = partial(tools.check_transformed, spec=SPEC, package_files=SUPPORT)
check_drift = partial(tools.check_drift, spec=SPEC, package_files=SUPPORT)

PARSER = """\
from vllm.parser.abstract_parser import DelegatingParser


class HarmonyParser(DelegatingParser):
    def __init__(self, tokenizer, tools=None, *args, **kwargs):
        super().__init__(tokenizer, tools, *args, **kwargs)

    def process_chunk(self, token_ids):
        return None
"""
# 0.25.0-0.26.x: a static method is the class's last member
PARSER_025 = PARSER.replace(
    "        return None\n", "        return None\n\n    @staticmethod\n    def _normalize_recipient(recipient):\n        return recipient\n"
)


def patched(source: str) -> str:
    """`source` as the codemod leaves it: the method after the class's last member, the helpers at the end."""
    method = "".join(f"    {line}\n" if line else "\n" for line in METHOD_SOURCE.splitlines())
    return source + method + "\n\n" + HELPER_SOURCE.lstrip("\n")


# What vllm#45560 makes of it (0.27.0; 0.33.0 registers with builtin_tools=True): not our MARK.
UPSTREAM_FIX = (
    PARSER
    + "\n    def adjust_request(self, request):\n        return super().adjust_request(request)\n\n\n"
    + '@register_vllm_structural_tag("harmony")\ndef get_harmony_structural_tag(tools, builtin_tools, tool_choice, '
    "reasoning):\n    pass\n"
)


@pytest.mark.parametrize("parser", [PARSER, PARSER_025], ids=["0.24-process_chunk-last", "0.25-staticmethod-last"])
def test_adds_adjust_request_and_the_registered_builder(parser, tmp_path):
    check(parser, patched(parser), tmp_path=tmp_path)


def test_the_helpers_register_a_private_key_and_set_the_per_request_flag():
    assert f'register_vllm_structural_tag("{TAG_KEY}")({BUILDER})' in HELPER_SOURCE
    assert 'register_vllm_structural_tag("harmony")' not in HELPER_SOURCE  # xgrammar's builtin stays untouched
    assert "request._grammar_from_tool_parser = True" in HELPER_SOURCE
    assert "is_reasoning_end" not in HELPER_SOURCE  # the global gate is not changed
    assert f"return {ADJUST}(request)" in METHOD_SOURCE


def test_the_helpers_compile_and_copy_nothing_but_call_vllm_by_name():
    compile(HELPER_SOURCE, "helper", "exec")
    assert "except ImportError" in HELPER_SOURCE  # fails open where xgrammar lacks a format class


@pytest.mark.parametrize(
    "source, message",
    [
        pytest.param(PARSER.replace("class HarmonyParser", "class OtherParser"), "not found", id="class-renamed"),
        pytest.param(
            PARSER.replace("    def process_chunk", "    def adjust_request(self, request):\n        pass\n\n    def x"),
            "not found",
            id="own-adjust-request",
        ),
        pytest.param(PARSER.replace("        return None\n", "        return None\n\n    X = 1\n"), "not found", id="last-member-not-a-def"),
    ],
)
def test_drift_when_the_anchor_is_gone(source, message, tmp_path):
    assert message in check_drift(source, tmp_path=tmp_path)


@pytest.mark.parametrize(
    "missing, message",
    [
        pytest.param((REGISTRY, "_get_function_parameters"), "defines no _get_function_parameters", id="no-helper"),
        pytest.param((REGISTRY, "register_vllm_structural_tag"), "defines no register_vllm_structural_tag", id="no-registry"),
        pytest.param((PROTOCOL, "_grammar_from_tool_parser"), "declares no ChatCompletionRequest", id="no-flag"),
        pytest.param((SERVING, "request._grammar_from_tool_parser"), "never reads", id="flag-unread"),
    ],
)
def test_drift_without_what_applies_the_tag_from_the_first_token(missing, message, tmp_path):
    rel, name = missing
    files = {**SUPPORT, rel: SUPPORT[rel].replace(name, "renamed")}
    assert message in tools.check_drift(PARSER, spec=SPEC, tmp_path=tmp_path, package_files=files)


def test_is_applied_needs_the_mark_the_method_and_the_registration():
    done = patched(PARSER)
    assert is_applied(done, None)
    assert not is_applied(PARSER, None)
    assert not is_applied(UPSTREAM_FIX, None)  # upstream's own fix is not our patch
    assert not is_applied(done.replace(f'register_vllm_structural_tag("{TAG_KEY}")', "x"), None)
    assert not is_applied(done.replace("    def adjust_request(", "    def adjust(", 1), None)
    assert not is_applied(done.replace(MARK, "#"), None)


@pytest.mark.parametrize(
    "parser_module, fixed",
    [
        pytest.param(UPSTREAM_FIX, True, id="0.27-shape"),
        pytest.param(UPSTREAM_FIX.replace('("harmony")', '("harmony", builtin_tools=True)'), True, id="0.33-shape"),
        pytest.param(UPSTREAM_FIX.replace("    def adjust_request", "    def adjust"), False, id="no-method"),
        pytest.param(PARSER, False, id="stock-0.24-0.26"),
        pytest.param(patched(PARSER), False, id="our-patch"),
        pytest.param(None, False, id="no-parser-module"),
    ],
)
def test_fixed_upstream_when_harmony_parser_registers_its_own_tag(parser_module, fixed, fake_package):
    reason = fixed_upstream(fake_package({TARGET: parser_module} if parser_module else {}))
    assert bool(reason) is fixed
    if fixed:
        assert "vllm#45560" in reason


def test_status_at_0_27_0_looks_for_the_upstream_fix(tmp_path):
    fixed = status_on_fake_site(tmp_path / "fixed", "0.27.0", {TARGET: UPSTREAM_FIX})[SPEC.id]
    missing = status_on_fake_site(tmp_path / "missing", "0.27.0", {TARGET: PARSER})[SPEC.id]
    assert fixed[0] == "fixed-upstream" and "vllm#45560" in fixed[1]
    assert missing[0] == "drifted"


RELEASES = [pytest.param(str(v), id=f"vllm-{v}") for v in KNOWN_RELEASES if Version("0.24") <= v]


@pytest.mark.upstream
@pytest.mark.parametrize("version", RELEASES)
def test_harmony_parser_has_no_adjust_request_of_its_own_before_0_27(version):
    source = wheel_source(version, f"vllm/{TARGET}") or ""
    has_method = "    def adjust_request(" in source
    assert has_method is (Version(version) >= Version("0.27"))
    assert ('register_vllm_structural_tag("harmony"' in source) is has_method


@pytest.mark.upstream
@pytest.mark.parametrize("version", ["0.24.0", "0.25.0", "0.26.0"])
def test_apply_is_idempotent_and_revert_restores_the_real_file(version, tmp_path):
    round_trip_on_the_real_file(SPEC, is_applied, version, tmp_path)


# Hostile request shapes (issue #37): each request goes the way the API server takes it, up to the engine, in one
# process per venv. The ChatCompletionRequest is built (FastAPI's body validation), the release's HarmonyParser
# (ParserManager, as a server with --tool-call-parser openai --reasoning-parser openai_gptoss gets it, on the tiny
# gpt-oss's tokenizer) adjusts it where the release's render_chat calls adjust_request (not stock 0.25.0's),
# to_sampling_params makes the SamplingParams, and the real
# AsyncLLM.generate runs the real InputProcessor._validate_params (SamplingParams.verify: the structured-output
# validation of the default `auto` backend) on an engine-less stand-in. The status is the release's own: its
# validation_exception_handler for a pydantic error, create_error_response for what reaches the app's handlers
# (AsyncLLM.generate re-raises validation errors and wraps anything else in EngineGenerateError: a 500).
HOSTILE_SCRIPT = r"""
import asyncio, inspect, json, os, sys
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from transformers import AutoTokenizer
from vllm.config import StructuredOutputsConfig
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.serve.utils.error_response import create_error_response
from vllm.entrypoints.serve.utils.server_utils import validation_exception_handler
from vllm.parser.parser_manager import ParserManager
from vllm.renderers.online_renderer import OnlineRenderer
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.exceptions import EngineGenerateError
from vllm.v1.engine.input_processor import InputProcessor

TOKENIZER = AutoTokenizer.from_pretrained(os.environ["GPTOSS_TINY_MODEL"])
PARSER = ParserManager.get_parser(tool_parser_name="openai", reasoning_parser_name="openai_gptoss",
                                  enable_auto_tools=True, model_name="openai/gpt-oss-20b", is_harmony=True)
# Whether render_chat's harmony branch calls the parser's adjust_request: 0.27.0 does, patched 0.25.0 does
# (harmony_tool_choice_render), stock 0.25.0 never does (G52: it constrains nothing).
RENDER_ADJUSTS = ".adjust_request(" in inspect.getsource(OnlineRenderer.render_chat)


class Anything:
    # ModelConfig, VllmConfig, the renderer, the HTTP request: what the code reads, None for the rest.
    def __init__(self, **fields):
        self.__dict__.update(fields)

    def __getattr__(self, name):
        return None


GPT_OSS = Anything(model_type="gpt_oss")
MODEL_CONFIG = Anything(is_diffusion=False, hf_config=GPT_OSS, hf_text_config=GPT_OSS)
HTTP_REQUEST = Anything(app=Anything(state=Anything(args=Anything(log_error_stack=False))), state=Anything())


class Accepted(Exception):
    # Raised where the engine would take the request: generate() wraps it in EngineGenerateError.
    pass


def failed(stage, exc, status):
    lines = str(exc).splitlines()
    return {"stage": stage, "error": type(exc).__name__, "message": lines[0] if lines else "", "status": status}


async def engine_validation(params):
    processor = object.__new__(InputProcessor)
    processor.__dict__.update(model_config=MODEL_CONFIG, speculative_config=None, vllm_config=Anything(),
                              structured_outputs_config=StructuredOutputsConfig(), use_v2_model_runner=False,
                              renderer=Anything(tokenizer=TOKENIZER))

    async def add_request(*args, **kwargs):
        InputProcessor._validate_params(processor, params, ("generate",))
        raise Accepted()

    llm = object.__new__(AsyncLLM)
    llm.__dict__.update(add_request=add_request, log_requests=False)
    async for _ in AsyncLLM.generate(llm, {"type": "token", "prompt_token_ids": [1]}, params, "r"):
        pass


def constraint(params):
    so = params.structured_outputs
    return next((key for key in ("structural_tag", "json") if so is not None and getattr(so, key)), None)


def outcome(body):
    try:
        request = ChatCompletionRequest(**body)
    except ValidationError as exc:
        response = asyncio.run(validation_exception_handler(HTTP_REQUEST, RequestValidationError(exc.errors())))
        error = exc.errors()[0]
        # The validator's own exception: pydantic wraps it where it is a ValueError (0.25.0's VLLMValidationError),
        # FastAPI lets it through to the app's handlers where it is not (0.27.0's).
        raised = (error.get("ctx") or {}).get("error")
        return failed("request", raised, response.status_code) if raised else {
            "stage": "request", "error": "ValidationError", "message": error["msg"], "status": response.status_code}
    except Exception as exc:
        return failed("request", exc, create_error_response(exc).error.code)
    try:
        if RENDER_ADJUSTS:
            PARSER(TOKENIZER, request.tools, model_config=MODEL_CONFIG).adjust_request(request=request)
        params = request.to_sampling_params(16, {})
    except Exception as exc:
        return failed("render", exc, create_error_response(exc).error.code)
    try:
        asyncio.run(engine_validation(params))
    except EngineGenerateError as exc:
        if isinstance(exc.__cause__, Accepted):
            return {"stage": "accepted", "constraint": constraint(params)}
        return {**failed("engine validation", exc.__cause__, create_error_response(exc).error.code),
                "raised": "EngineGenerateError"}
    except Exception as exc:
        return failed("engine validation", exc, create_error_response(exc).error.code)
    raise AssertionError("generate() ended without reaching the engine")


print("RESULT " + json.dumps({name: outcome(body) for name, body in json.loads(sys.stdin.read()).items()}))
"""


def hostile_tool(name: str = "get_weather", parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}} if parameters is None else parameters
    return {"type": "function", "function": {"name": name, "parameters": schema}}


def hostile_request(tools: list[dict[str, Any]], tool_choice: Any = "required") -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": tools, "tool_choice": tool_choice}


def named(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


NOT_A_SCHEMA = {"type": "nonsense"}
HOSTILE_CASES = {
    "control-required": hostile_request([hostile_tool()]),  # the patch is in force: a structural tag on both
    "named-tool-not-in-tools": hostile_request([hostile_tool()], named("nope")),
    "parameters-not-a-json-schema": hostile_request([hostile_tool(parameters=NOT_A_SCHEMA)]),
    "named-tool-with-parameters-not-a-json-schema": hostile_request(
        [hostile_tool(parameters=NOT_A_SCHEMA)], named("get_weather")
    ),
    "parameters-a-string-schema": hostile_request([hostile_tool(parameters={"type": "string"})]),
    "parameters-empty": hostile_request([hostile_tool(parameters={})]),
    "parameters-absent": hostile_request([{"type": "function", "function": {"name": "get_weather"}}]),
    "two-tools-of-one-name": hostile_request([hostile_tool(), hostile_tool(parameters={"type": "object"})]),
    "name-with-a-harmony-token": hostile_request([hostile_tool(name="get<|end|>weather")]),
    "name-with-a-space": hostile_request([hostile_tool(name="get weather")]),
}


# A tool whose parameters are no JSON schema xgrammar reads: here the patch departs from 0.27.0 on purpose. 0.27.0
# answers these with a 500 (its structural tag does not compile with xgrammar, the `auto` backend falls back to
# guidance, whose serialize_guidance_grammar reads the tag as the old structures/triggers format, KeyError
# 'triggers', which AsyncLLM.generate wraps in EngineGenerateError). Issue #37 allows no 5xx stock does not give, and
# stock 0.25.0 takes them (its harmony render never adjusts the request: no constraint, G52's own behaviour): the
# patch checks that xgrammar builds the tag and otherwise leaves the request stock, so it ends as on stock 0.25.0.
STOCK_ANSWERS = tuple(name for name in HOSTILE_CASES if "not-a-json-schema" in name)


def hostile_outcomes(python: Path, cases: dict[str, Any]) -> dict[str, Any]:
    """{case: outcome} for `cases`, all in one subprocess of `python` (one vLLM import per venv)."""
    result, _output = harness.script_result(python, HOSTILE_SCRIPT, env=chat_output.offline_env(python),
                                            stdin=json.dumps(cases))
    return result


@pytest.fixture(scope="module")
@needs("harness")
def hostile(tmp_path_factory) -> dict[str, dict[str, Any]]:
    """{"patched 0.25.0", "stock 0.27.0", "stock 0.25.0": outcomes}: 0.25.0 with both G52 patches, the fixing
    release, and the unpatched release (read-only; only the cases whose expected answer is its own)."""
    patched = harness.clone_venv(harness.cpu_venv("0.25.0"), tmp_path_factory.mktemp("hostile") / "venv")
    harness.apply_patches(patched, [SPEC.id, harmony_tool_choice_render.SPEC.id])
    return {
        "patched 0.25.0": hostile_outcomes(patched, HOSTILE_CASES),
        "stock 0.27.0": hostile_outcomes(harness.cpu_venv("0.27.0"), HOSTILE_CASES),
        "stock 0.25.0": hostile_outcomes(
            harness.cpu_venv("0.25.0"), {name: HOSTILE_CASES[name] for name in (*STOCK_ANSWERS, "control-required")}
        ),
    }


@pytest.mark.harness
@pytest.mark.parametrize("case", HOSTILE_CASES)
def test_hostile_tool_choice_requests_answer_as_0_27_0_bad_schemas_as_stock_0_25_0_never_5xx(hostile, case):
    """Every hostile request ends on patched 0.25.0 with 0.27.0's outcome (stage, error, message, status), except a
    required/named tool whose parameters xgrammar cannot build: there 0.27.0 answers 500 and patched 0.25.0 ends as
    stock 0.25.0 does (taken, unconstrained), the deliberate departure issue #37's no-new-5xx rule asks for. None is
    a 5xx."""
    patched, fixing = hostile["patched 0.25.0"][case], hostile["stock 0.27.0"][case]
    if case == "control-required":  # the comparison means something: stock 0.25.0 leaves a JSON schema here
        assert fixing == {"stage": "accepted", "constraint": "structural_tag"}
        assert hostile["stock 0.25.0"][case] == {"stage": "accepted", "constraint": None}  # G52: nothing
    if case in STOCK_ANSWERS:
        stock = hostile["stock 0.25.0"][case]
        assert fixing["status"] == 500  # the departure is from a 500: the day 0.27.0's answer changes, look again
        assert stock == {"stage": "accepted", "constraint": None}  # stock 0.25.0 takes it, unconstrained
        assert patched == stock
    else:
        assert patched == fixing
    assert patched.get("status", 200) < 500, f"{case}: {patched}"
