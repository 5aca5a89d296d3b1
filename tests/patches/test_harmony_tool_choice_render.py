"""harmony_tool_choice_render: the harmony branch of render_chat calls the parser's adjust_request (G52).

Snippets are hand-written in the shape of `render_chat`'s `if not self.use_harmony: ... else:` (OpenAIServingRender,
0.24.x; OnlineRenderer, 0.25.0-0.26.x). The behaviour test calls the real render_chat of both bands in CPU harness
venvs patched with this patch alone: the call reaches a parser that carries harmony_tool_choice_structural's
attribute exactly as stock 0.27.0's own call does (same arguments), and is skipped for one that does not (never
half a fix).
"""

from __future__ import annotations

from functools import partial

import pytest
from packaging.version import Version

from gptoss_patch.patches import harmony_tool_choice_structural
from gptoss_patch.patches.harmony_tool_choice_render import (
    CALL_SOURCE,
    MARK,
    RENDERER_TARGET,
    SPEC,
    fixed_upstream,
    is_applied,
    parser_not_patched,
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
        if not self.use_harmony:
            conversation, engine_inputs = await self.preprocess_chat(request, request.messages, parser=self.parser)
        else:
            # For GPT-OSS.
            should_include_tools = tool_dicts is not None
            conversation, engine_inputs = self._make_request_with_harmony(
                request, should_include_tools
            )

        return conversation, engine_inputs
"""
CALL = "".join(f"            {line}\n" for line in CALL_SOURCE.strip("\n").splitlines())
PATCHED = RENDERER.replace(
    "            should_include_tools = tool_dicts is not None\n",
    "            should_include_tools = tool_dicts is not None\n" + CALL,
)
# What vllm#45560 makes of it (0.27.0): the call, unguarded, not our MARK.
UPSTREAM_FIX = RENDERER.replace(
    "            # For GPT-OSS.\n",
    "            # For GPT-OSS.\n"
    "            if self.parser is not None:\n"
    "                self.parser(\n"
    "                    self.renderer.get_tokenizer(), request.tools, model_config=self.model_config\n"
    "                ).adjust_request(request=request)\n\n",
)


def test_calls_adjust_request_in_the_harmony_branch():
    check(RENDERER, PATCHED)


def test_the_call_is_guarded_by_the_parser_patch_attribute():
    assert f'getattr(self.parser, "{harmony_tool_choice_structural.ADJUSTS}", False)' in CALL_SOURCE
    assert "model_config=self.model_config" in CALL_SOURCE  # 0.27.0's constructor arguments


def test_noop_when_already_patched_or_upstream():
    assert is_applied(PATCHED, None)
    assert "not found" in check_drift(PATCHED)
    assert "not found" in check_drift(UPSTREAM_FIX)


@pytest.mark.parametrize(
    "source",
    [
        pytest.param(RENDERER.replace("render_chat", "render"), id="method-renamed"),
        pytest.param(RENDERER.replace("not self.use_harmony", "self.plain"), id="test-renamed"),
        pytest.param(RENDERER.replace("self._make_request_with_harmony", "self._harmony"), id="builder-renamed"),
    ],
)
def test_drift_when_the_anchor_is_gone(source):
    assert "not found" in check_drift(source)


def test_is_applied_needs_the_mark_and_the_guarded_call():
    assert not is_applied(RENDERER, None)
    assert not is_applied(UPSTREAM_FIX, None)  # upstream's own call is not our patch
    assert not is_applied(PATCHED.replace(MARK, "#"), None)
    assert not is_applied(UPSTREAM_FIX.replace("            # For GPT-OSS.\n", f"            {MARK}\n"), None)


@pytest.mark.parametrize(
    "renderer, fixed",
    [
        pytest.param(UPSTREAM_FIX, True, id="0.27-shape"),
        pytest.param(RENDERER, False, id="stock-0.25-0.26"),
        pytest.param(PATCHED, False, id="our-patch"),
        pytest.param(None, False, id="no-renderer-before-0.25"),
    ],
)
def test_fixed_upstream_when_render_chat_calls_adjust_request(renderer, fixed, fake_package):
    reason = fixed_upstream(fake_package({RENDERER_TARGET: renderer} if renderer else {}))
    assert bool(reason) is fixed
    if fixed:
        assert "vllm#45560" in reason


def test_warns_while_the_parser_patch_is_missing(fake_package):
    parser = "class HarmonyParser:\n    pass\n"
    assert "apply both" in (parser_not_patched(fake_package({harmony_tool_choice_structural.TARGET: parser})) or "")
    own = "class HarmonyParser:\n    def adjust_request(self, request):\n        pass\n\n\n"
    done = fake_package({harmony_tool_choice_structural.TARGET: own + harmony_tool_choice_structural.HELPER_SOURCE}, "patched")
    assert parser_not_patched(done) is None


def test_status_at_0_27_0_looks_for_the_upstream_call(tmp_path):
    fixed = status_on_fake_site(tmp_path / "fixed", "0.27.0", {RENDERER_TARGET: UPSTREAM_FIX})[SPEC.id]
    missing = status_on_fake_site(tmp_path / "missing", "0.27.0", {RENDERER_TARGET: RENDERER})[SPEC.id]
    assert fixed[0] == "fixed-upstream" and "vllm#45560" in fixed[1]
    assert missing[0] == "drifted"


RELEASES = [pytest.param(str(v), id=f"vllm-{v}") for v in KNOWN_RELEASES if Version("0.24") <= v]


@pytest.mark.upstream
@pytest.mark.parametrize("version", RELEASES)
def test_the_harmony_branch_calls_adjust_request_from_0_27(version, fake_package):
    band = SPEC.band_for(Version(version))
    source = wheel_source(version, f"vllm/{band.target if band else RENDERER_TARGET}") or ""
    assert source.count("# For GPT-OSS.") == 1
    harmony_branch = source.split("# For GPT-OSS.")[1].split("return conversation, engine_inputs")[0]
    # 0.27.0-0.30.x call the parser's adjust_request there; 0.31.0 on OnlineRenderer.adjust_harmony_request, which does
    calls = "adjust_harmony_request(" if Version(version) >= Version("0.31") else "adjust_request("
    assert (calls in harmony_branch) is (Version(version) >= Version("0.27"))
    if Version(version) >= Version("0.27"):
        assert fixed_upstream(fake_package({RENDERER_TARGET: source}))


@pytest.mark.upstream
@pytest.mark.parametrize("version", ["0.24.0", "0.25.0", "0.26.0"])
def test_apply_is_idempotent_and_revert_restores_the_real_file(version, tmp_path):
    round_trip_on_the_real_file(SPEC, is_applied, version, tmp_path)


# The harness behaviour test: the real render_chat on a server object made without an engine (object.__new__ plus
# the attributes the method reads before rendering); the harmony builder is replaced by a sentinel, the parser by
# recording stand-ins, one with harmony_tool_choice_structural's attribute and one without.
BEHAVIOUR_SCRIPT = r"""
import asyncio, importlib, json, sys
for module_name, class_name in (("vllm.renderers.online_renderer", "OnlineRenderer"),
                                 ("vllm.entrypoints.serve.render.serving", "OpenAIServingRender")):
    try:
        module = importlib.import_module(module_name)
        break
    except ImportError:
        continue
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

ATTRIBUTE = sys.argv[1]
calls = []

class Patched:
    tool_parser_cls = object
    def __init__(self, tokenizer, tools, **kwargs):
        calls.append({"tokenizer": tokenizer, "tools": len(tools or []), "kwargs": sorted(kwargs)})
    def adjust_request(self, request):
        calls.append("adjust_request")
        return request
setattr(Patched, ATTRIBUTE, True)

class Stock(Patched):
    pass
setattr(Stock, ATTRIBUTE, False)

class Rendered(Exception):
    pass

def server(parser):
    s = object.__new__(getattr(module, class_name))
    s.use_harmony, s.enable_auto_tools, s.tool_parser, s.parser = True, True, object, parser
    s.renderer = type("R", (), {"tokenizer": "TOK", "get_tokenizer": lambda self: "TOK"})()
    s.model_config = "MODEL_CONFIG"
    s.engine_client = type("E", (), {"errored": False})()
    s.log_error_stack = False
    s.exclude_tools_when_tool_choice_none = False
    async def check_model(request):
        return None
    def rendered(*args, **kwargs):
        raise Rendered()
    s._check_model, s._make_request_with_harmony = check_model, rendered
    return s

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}
out = {}
for label, parser in (("patched-parser", Patched), ("stock-parser", Stock)):
    calls.clear()
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], tools=[TOOL],
                                    tool_choice="required")
    try:
        asyncio.run(server(parser).render_chat(request))
        out[label] = {"rendered": False, "calls": list(calls)}
    except Rendered:
        out[label] = {"rendered": True, "calls": list(calls)}
print("RESULT " + json.dumps(out))
"""


def run_behaviour(python) -> dict:
    return harness.script_result(python, BEHAVIOUR_SCRIPT, harmony_tool_choice_structural.ADJUSTS, env=harness.script_env(python))[0]


# One release per band, patched, and the fixing release, stock (whose own call the patched one must equal; also the
# pass set of harmony_tool_choice_structural's upstream parity suite): the CPU harness venvs it builds
# (tests/support/prewarm.py).
FIXING_RELEASE = "0.27.0"
HARNESS_RELEASES = ("0.24.0", "0.25.0", FIXING_RELEASE)


@pytest.fixture(scope="module", params=HARNESS_RELEASES)
@needs("harness")
def render(request, tmp_path_factory) -> tuple[str, dict]:
    python = harness.cpu_venv(request.param)
    if request.param != FIXING_RELEASE:
        python = harness.clone_venv(python, tmp_path_factory.mktemp("render") / "venv")
        harness.apply_patches(python, [SPEC.id])
    return request.param, run_behaviour(python)


@pytest.mark.harness
def test_the_real_render_chat_calls_adjust_request_as_0_27_0_does(render):
    _version, result = render
    assert result["patched-parser"] == {
        "rendered": True,
        "calls": [{"tokenizer": "TOK", "tools": 1, "kwargs": ["model_config"]}, "adjust_request"],
    }


@pytest.mark.harness
def test_the_call_is_skipped_for_a_parser_without_the_parser_patch(render):
    version, result = render
    if version == FIXING_RELEASE:  # upstream calls every parser: its HarmonyParser always has the method
        assert result["stock-parser"] == result["patched-parser"]
    else:
        assert result["stock-parser"] == {"rendered": True, "calls": []}
