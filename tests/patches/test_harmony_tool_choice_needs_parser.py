"""harmony_tool_choice_needs_parser: required/named tool_choice without a tool parser is a 400 for gpt-oss too.

Snippets are hand-written in the shape of the tool-choice check of `render_chat` (OpenAIServingRender,
OnlineRenderer) and `render_chat_request` (OpenAIServingChat, 0.15.1-0.17.x). The behaviour tests call the
real method in CPU harness venvs, stock and patched.
"""

from __future__ import annotations

from functools import partial

import pytest
from packaging.version import Version

from gptoss_patch.patches.harmony_tool_choice_needs_parser import (
    MARK,
    RENDERER_TARGET,
    SPEC,
    fixed_upstream,
    is_applied,
)
from gptoss_patch.versions import KNOWN_RELEASES
from tests.patches.helpers import round_trip_on_the_real_file, status_on_fake_site, wheel_source
from tests.support import harness, tools
from tests.support.markers import needs

check = partial(tools.check_transformed, spec=SPEC)
check_drift = partial(tools.check_drift, spec=SPEC)

RENDERER = """\
class OnlineRenderer:
    async def render_chat(self, request):
        tool_parser = self.parser.tool_parser_cls if self.parser is not None else None

        # Check if tool parsing is unavailable (common condition)
        tool_parsing_unavailable = (
            tool_parser is None
            and not is_mistral_tokenizer(tokenizer)
            and not self.use_harmony
        )
        if tool_parsing_unavailable and request.tool_choice not in (None, "none"):
            if request.tool_choice != "auto":
                return self.create_error_response("requires --tool-call-parser")
        return self._make_request_with_harmony(request)
"""
NARROWED = RENDERER.replace(
    "        tool_parsing_unavailable = (\n",
    f"        {MARK}\n        tool_parsing_unavailable = (\n",
).replace(
    "            and not self.use_harmony\n",
    '            and not (self.use_harmony and request.tool_choice == "auto")\n',
)
# 0.15.1-0.17.x: the same check in OpenAIServingChat.render_chat_request, one level deeper (inside `try:`).
CHAT = """\
class OpenAIServingChat:
    async def render_chat_request(self, request):
        try:
            tool_parsing_unavailable = (
                self.tool_parser is None and not isinstance(tokenizer, MistralTokenizer) and not self.use_harmony
            )
        except Exception as exc:
            return self.create_error_response(exc)
"""
# What vllm#48672 makes of it (the shape fixed_upstream looks for): harmony exempt for "auto" only, not by us.
UPSTREAM_FIX = RENDERER.replace(
    "            and not self.use_harmony\n",
    '            and not (self.use_harmony and request.tool_choice == "auto")\n',
)


def test_narrows_the_harmony_exemption_to_auto():
    check(RENDERER, NARROWED)


def test_narrows_the_check_of_render_chat_request_before_0_18():
    check(
        CHAT,
        CHAT.replace(
            "            tool_parsing_unavailable", f"            {MARK}\n            tool_parsing_unavailable"
        ).replace("and not self.use_harmony", 'and not (self.use_harmony and request.tool_choice == "auto")'),
    )


def test_noop_when_already_patched():
    assert is_applied(NARROWED, None)
    assert "not found" in check_drift(NARROWED)


@pytest.mark.parametrize(
    "source, message",
    [
        pytest.param(RENDERER.replace("render_chat", "render"), "not found", id="method-renamed"),
        pytest.param(RENDERER.replace("tool_parsing_unavailable", "no_parser"), "not found", id="flag-renamed"),
        pytest.param(RENDERER.replace("            and not self.use_harmony\n", ""), "not found", id="no-exemption"),
        pytest.param(
            RENDERER.replace("and not self.use_harmony\n", "and not self.use_harmony\n            and True\n"),
            "not found",
            id="exemption-not-last",
        ),
        pytest.param(
            RENDERER.replace(
                "        if tool_parsing_unavailable",
                "        tool_parsing_unavailable = (\n"
                "            tool_parser is None and not self.use_harmony\n        )\n"
                "        if tool_parsing_unavailable",
            ),
            "found 2 times",
            id="flag-twice",
        ),
    ],
)
def test_drift_when_the_anchor_is_gone_or_ambiguous(source, message):
    assert message in check_drift(source)


def test_is_applied_needs_the_mark_and_the_narrowed_operand():
    assert not is_applied(RENDERER, None)
    assert not is_applied(UPSTREAM_FIX, None)  # upstream's own fix is not our patch
    assert not is_applied(RENDERER.replace("        tool_parsing_unavailable", f"        {MARK}\n        x"), None)


@pytest.mark.parametrize(
    "renderer, fixed",
    [
        pytest.param(UPSTREAM_FIX, True, id="vllm-48672-shape"),
        pytest.param(RENDERER.replace("            and not self.use_harmony\n", ""), True, id="exemption-dropped"),
        pytest.param(RENDERER, False, id="stock-0.25-0.33"),
        pytest.param(NARROWED, False, id="our-patch"),
        pytest.param(
            "class OnlineRenderer:\n    async def render_chat(self, request):\n        pass\n", False, id="no-check"
        ),
        pytest.param(None, False, id="no-renderer-before-0.25"),
    ],
)
def test_fixed_upstream_when_the_renderer_no_longer_exempts_harmony(renderer, fixed, fake_package):
    reason = fixed_upstream(fake_package({RENDERER_TARGET: renderer} if renderer else {}))
    assert bool(reason) is fixed
    if fixed:
        assert "vllm#48672" in reason


def test_status_on_a_fake_release_with_and_without_the_upstream_fix(tmp_path):
    fixed = status_on_fake_site(tmp_path / "fixed", "0.34.0", {RENDERER_TARGET: UPSTREAM_FIX})[SPEC.id]
    stock = status_on_fake_site(tmp_path / "stock", "0.34.0", {RENDERER_TARGET: RENDERER})[SPEC.id]
    assert fixed[0] == "fixed-upstream" and "vllm#48672" in fixed[1]
    assert stock[0] == "pending"


RELEASES = [pytest.param(str(v), id=f"vllm-{v}") for v in KNOWN_RELEASES]


@pytest.mark.upstream
@pytest.mark.parametrize("version", RELEASES)
def test_the_exemption_lives_in_the_bands_target(version):
    band = SPEC.band_for(Version(version))
    assert band is not None
    source = wheel_source(version, f"vllm/{band.target}") or ""
    assert source.count("tool_parsing_unavailable = (") == 1
    assert "and not self.use_harmony\n" in source


@pytest.mark.upstream
@pytest.mark.parametrize("version", ["0.15.1", "0.17.1", "0.18.0", "0.24.0", "0.25.0", "0.33.0"])
def test_apply_is_idempotent_and_revert_restores_the_real_file(version, tmp_path):
    round_trip_on_the_real_file(SPEC, is_applied, version, tmp_path)


# The harness behaviour test: the real render_chat / render_chat_request on a server object made without an
# engine (object.__new__ plus the attributes the method reads before rendering). Rendering itself is replaced by
# a sentinel: "rendered" means the request passed the tool-choice check.
BEHAVIOUR_SCRIPT = r"""
import asyncio, importlib, json
LOCATIONS = (
    ("vllm.renderers.online_renderer", "OnlineRenderer", "render_chat"),
    ("vllm.entrypoints.serve.render.serving", "OpenAIServingRender", "render_chat"),
    ("vllm.entrypoints.openai.chat_completion.serving", "OpenAIServingChat", "render_chat_request"),
)
for module_name, class_name, method in LOCATIONS:
    try:
        module = importlib.import_module(module_name)
        break
    except ImportError:
        continue
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

class Rendered(Exception):
    pass

def server(harmony, tool_parser):
    s = object.__new__(getattr(module, class_name))
    s.use_harmony, s.enable_auto_tools, s.tool_parser = harmony, False, tool_parser
    s.parser = None if tool_parser is None else type("P", (), {"tool_parser_cls": tool_parser})()
    s.renderer = type("R", (), {"tokenizer": object()})()
    s.engine_client = type("E", (), {"errored": False})()
    s.log_error_stack = False
    s.exclude_tools_when_tool_choice_none = False
    async def check_model(request):
        return None
    def rendered(*args, **kwargs):
        raise Rendered()
    s._check_model, s._make_request_with_harmony, s._preprocess_chat = check_model, rendered, rendered
    return s

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}
CHOICES = {"required": "required", "named": {"type": "function", "function": {"name": "get_weather"}},
           "auto": "auto", "none": "none", "named-unknown": {"type": "function", "function": {"name": "nope"}}}
out = {}
for label, harmony, parser in (("harmony", True, None), ("harmony+parser", True, object), ("other", False, None)):
    for name, choice in CHOICES.items():
        key = f"{label}/{name}"
        try:
            request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], tools=[TOOL],
                                            tool_choice=choice)
        except ValueError as exc:  # the request model's own validation: a 400 in the server
            out[key] = {"invalid": exc.errors()[0]["msg"] if hasattr(exc, "errors") else str(exc)}
            continue
        try:
            result = asyncio.run(getattr(server(harmony, parser), method)(request))
        except Rendered:
            out[key] = "rendered"
            continue
        except Exception as exc:  # past the check, on a path this object cannot serve (a non-harmony render)
            out[key] = "past the check: " + type(exc).__name__
            continue
        err = getattr(result, "error", result)
        out[key] = {"code": getattr(err, "code", None), "type": getattr(err, "type", None),
                    "message": getattr(err, "message", None)}
print("RESULT " + json.dumps(out))
"""


def run_behaviour(python) -> dict:
    return harness.script_result(python, BEHAVIOUR_SCRIPT, env=harness.script_env(python))[0]


# One release per band: the CPU harness venvs it builds (tests/support/prewarm.py).
HARNESS_RELEASES = ("0.17.1", "0.22.1", "0.25.0")


@pytest.fixture(scope="module", params=HARNESS_RELEASES)
@needs("harness")
def stock_and_patched(request, tmp_path_factory):
    stock = harness.cpu_venv(request.param)
    patched = harness.clone_venv(stock, tmp_path_factory.mktemp("tool-choice") / "venv")
    harness.apply_patches(patched, [SPEC.id])
    return run_behaviour(stock), run_behaviour(patched)


@pytest.mark.harness
@pytest.mark.parametrize("choice", ["required", "named"])
def test_stock_renders_and_patched_answers_the_400_other_models_get(stock_and_patched, choice):
    stock, patched = stock_and_patched
    assert stock[f"harmony/{choice}"] == "rendered"  # accepted: nothing will parse the tool call
    other = stock[f"other/{choice}"]
    assert other["code"] == 400 and "requires --tool-call-parser to be set" in other["message"]
    assert patched[f"harmony/{choice}"] == other  # the same status, type and message as a non-harmony model


@pytest.mark.harness
def test_auto_none_a_tool_parser_and_bad_input_answer_as_stock(stock_and_patched):
    stock, patched = stock_and_patched
    changed = {key for key in stock if stock[key] != patched[key]}
    assert changed == {"harmony/required", "harmony/named"}
    assert patched["harmony/auto"] == patched["harmony/none"] == "rendered"
    assert patched["harmony+parser/required"] == patched["harmony+parser/named"] == "rendered"
    # A named tool that is not among the tools: the request model rejects it before the check, stock and patched.
    assert "does not match any of the specified `tools`" in patched["harmony/named-unknown"]["invalid"]
    assert patched["harmony/named-unknown"] == stock["harmony/named-unknown"] == stock["other/named-unknown"]
