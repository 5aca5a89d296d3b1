"""harmony_responses_instructions: the gpt-oss Responses preamble carries `instructions` as vLLM 0.23.0's does.

Snippets are hand-written in the shape of OpenAIServingResponses._construct_input_messages_with_harmony
(`entrypoints/openai/responses/serving.py`, 0.15.1-0.22.x): the system message from
`_construct_harmony_system_input_message`, a developer message for custom tools only, and a loop over
`request.input` that calls the release's converter (`parse_response_input` in 0.15.1-0.16.0,
`response_input_to_harmony` from 0.17.0) and drops system messages. The helpers are exercised on stand-in
harmony functions; the real ones are compared with stock 0.23.0 in tests/test_equivalence.py.
"""

from __future__ import annotations

import ast
import sys
import types
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest
from packaging.version import Version

from gptoss_patch.patches.harmony_responses_instructions import (
    HELPER_SOURCE,
    ITEMS,
    METHOD,
    PREAMBLE,
    SPEC,
    TARGET,
    UPSTREAM_BUILDERS,
    fixed_upstream,
    is_applied,
)
from gptoss_patch.spec import PackageView
from tests.patches.helpers import status_on_fake_site, wheel_source, with_helper
from tests.support import fakesite, tools

check = partial(tools.check_transformed, spec=SPEC)
check_drift = partial(tools.check_drift, spec=SPEC)

# 0.17.0-0.22.x: the converter is response_input_to_harmony (0.22 also skips None).
BUILDER = """\
class OpenAIServingResponses:
    def _construct_input_messages_with_harmony(self, request, prev_response):
        messages = []
        if prev_response is None:
            tool_types = extract_tool_types(request.tools)
            with_custom_tools = has_custom_tools(tool_types)

            sys_msg = self._construct_harmony_system_input_message(
                request, with_custom_tools, tool_types
            )
            messages.append(sys_msg)
            if with_custom_tools:
                dev_msg = get_developer_message(instructions=request.instructions, tools=request.tools)
                messages.append(dev_msg)
            messages += construct_harmony_previous_input_messages(request)
        else:
            messages.extend(self.msg_store[prev_response.id])
        if isinstance(request.input, str):
            messages.append(get_user_message(request.input))
        else:
            prev_outputs = []
            for response_msg in request.input:
                new_msg = response_input_to_harmony(response_msg, prev_outputs)
                if new_msg is not None and new_msg.author.role != "system":
                    messages.append(new_msg)
                if isinstance(response_msg, ResponseFunctionToolCall):
                    prev_outputs.append(response_msg)
        return messages
"""

PATCHED = """\
class OpenAIServingResponses:
    def _construct_input_messages_with_harmony(self, request, prev_response):
        messages = []
        # gptoss-patch harmony_responses_instructions: a leading system/developer item may become the instructions.
        request_input = request.input
        if prev_response is None:
            tool_types = extract_tool_types(request.tools)
            with_custom_tools = has_custom_tools(tool_types)

            # gptoss-patch harmony_responses_instructions: instructions go to the harmony preamble (vllm#44330).
            preamble, request_input = _gptoss_patch_responses_preamble(self, request, tool_types, with_custom_tools)
            messages.extend(preamble)
            messages += construct_harmony_previous_input_messages(request)
        else:
            messages.extend(self.msg_store[prev_response.id])
        if isinstance(request.input, str):
            messages.append(get_user_message(request.input))
        else:
            prev_outputs = []
            # gptoss-patch harmony_responses_instructions: system/developer items become harmony instructions (vllm#44330).
            messages.extend(_gptoss_patch_responses_items(request_input, prev_outputs, response_input_to_harmony))
        return messages
"""

SECOND_BRANCH = "        if prev_response is None:\n            pass\n"
# 0.15.1-0.16.0: the converter lives in harmony_utils under its older name.
OLD_CONVERTER = "parse_response_input"


@pytest.mark.parametrize(
    "converter",
    [
        pytest.param(OLD_CONVERTER, id="parse_response_input-0.15-0.16"),
        pytest.param("response_input_to_harmony", id="response_input_to_harmony-0.17-0.22"),
    ],
)
def test_rewrites_the_preamble_and_the_input_loop(converter):
    before = BUILDER.replace("response_input_to_harmony", converter)
    check(before, with_helper(PATCHED.replace("response_input_to_harmony", converter), HELPER_SOURCE))


def test_keeps_a_loop_without_the_none_check_of_0_22():
    before = BUILDER.replace("if new_msg is not None and new_msg.author.role", "if new_msg.author.role")
    check(before, with_helper(PATCHED, HELPER_SOURCE))


def test_noop_when_already_patched():
    result = with_helper(PATCHED, HELPER_SOURCE)
    assert is_applied(result, None)
    assert "not found" in check_drift(result)


@pytest.mark.parametrize(
    "source",
    [
        pytest.param(BUILDER.replace("self._construct_harmony_system_input_message(", "build_system("), id="system-builder-renamed"),
        pytest.param(BUILDER.replace("            if with_custom_tools:\n", "            if request.tools:\n"), id="developer-if-changed"),
        pytest.param(BUILDER.replace("response_input_to_harmony(response_msg", "convert(response_msg"), id="converter-unknown"),
        pytest.param(BUILDER.replace("for response_msg in request.input:", "for response_msg in items:"), id="loop-over-other-input"),
        pytest.param(BUILDER.replace("if isinstance(request.input, str):", "if not request.input:"), id="input-branch-changed"),
        pytest.param(BUILDER.replace(METHOD, "_build_harmony_input"), id="method-renamed"),
        pytest.param(BUILDER.replace("        return messages\n", SECOND_BRANCH + "        return messages\n"), id="two-new-conversation-branches"),
    ],
)
def test_drift_when_the_anchor_is_gone_or_ambiguous(source):
    assert "not found" in check_drift(source)


def test_drift_message_names_the_anchor():
    assert check_drift("x = 1\n").startswith(f"{METHOD}:")


def test_is_applied_needs_both_helpers_called_from_the_method():
    assert not is_applied(BUILDER, None)
    assert not is_applied(BUILDER + "\n\n" + HELPER_SOURCE.lstrip("\n"), None)  # helpers present, method stock
    assert not is_applied(PATCHED, None)  # calls present, helpers missing


def test_fixed_upstream_where_a_responses_builder_calls_build_harmony_preamble(fake_package: Callable[..., PackageView]):
    call = "def build(request):\n    return build_harmony_preamble(instructions=request.instructions)\n"
    for relpath in UPSTREAM_BUILDERS:
        reason = fixed_upstream(fake_package({relpath: call}, relpath.replace("/", "_")))
        assert reason is not None and relpath in reason and "vllm#44330" in reason
    mention = fake_package({TARGET: "# build_harmony_preamble(...) arrives in 0.23.0\n"}, "mention")
    imported = fake_package({TARGET: "from harmony_utils import build_harmony_preamble\n"}, "import")
    assert fixed_upstream(mention) is None  # a mention is not a call
    assert fixed_upstream(imported) is None  # nor an import
    assert fixed_upstream(fake_package({}, "empty")) is None


def test_status_from_0_23_0_looks_for_the_upstream_fix_instead_of_patching(tmp_path):
    fixed_file = fakesite.RESPONSES_SERVING + "\n\ndef _preamble(request):\n    return build_harmony_preamble(instructions=None)\n"
    before = status_on_fake_site(tmp_path / "0.17.1", "0.17.1")[SPEC.id]
    fixed = status_on_fake_site(tmp_path / "fixed", "0.23.0", {TARGET: fixed_file})[SPEC.id]
    missing = status_on_fake_site(tmp_path / "missing", "0.23.0")[SPEC.id]
    assert before == ("pending", "unpatched shape found in vllm 0.17.1")
    assert fixed[0] == "fixed-upstream" and "vllm#44330" in fixed[1]
    assert missing == ("drifted", "vllm 0.23.0 should carry the upstream fix (since 0.23.0) but it was not found")


# -- the helpers, on stand-ins for harmony_utils and vllm.envs ---------------------------------------


class Tools:
    """A tool server offering the browser only."""

    def has_tool(self, name: str) -> bool:
        return name == "browser"

    def get_tool_description(self, name: str, allowed: Any) -> str:
        return f"{name} tool (allowed: {allowed})"


@pytest.fixture
def helpers(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """HELPER_SOURCE executed against fake `vllm.envs`, `harmony_utils` and `openai.types.responses`."""
    envs = types.SimpleNamespace(VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS=False)

    def get_system_message(**kwargs: Any) -> tuple[str, dict[str, Any]]:
        return ("system", kwargs)

    def get_developer_message(instructions: str | None = None, tools: Any = None) -> tuple[str, dict[str, Any]]:
        # Like every release: developer instructions are dropped while the variable is set.
        kept = None if envs.VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS else instructions
        return ("developer", {"instructions": kept, "tools": tools})

    class ResponseFunctionToolCall(dict):
        pass

    hu = types.SimpleNamespace(get_system_message=get_system_message, get_developer_message=get_developer_message)
    modules = {
        "vllm": types.SimpleNamespace(envs=envs),
        "vllm.entrypoints.openai.parser": types.SimpleNamespace(harmony_utils=hu),
        "openai.types.responses": types.SimpleNamespace(ResponseFunctionToolCall=ResponseFunctionToolCall),
    }
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    namespace: dict[str, Any] = {"_extract_allowed_tools_from_mcp_requests": lambda tools: {"web_search_preview": ["search"]}}
    exec(compile(HELPER_SOURCE, "serving.py", "exec"), namespace)
    namespace["envs"], namespace["call"] = envs, ResponseFunctionToolCall
    yield namespace


def request(**fields: Any) -> types.SimpleNamespace:
    defaults: dict[str, Any] = {"input": "hi", "instructions": None, "tools": [], "reasoning": None}
    return types.SimpleNamespace(**{**defaults, **fields})


def preamble(helpers: dict[str, Any], req: types.SimpleNamespace, *, custom_tools: bool = False, tool_types: frozenset[str] = frozenset()):
    server = types.SimpleNamespace(tool_server=Tools())
    return helpers[PREAMBLE](server, req, set(tool_types), custom_tools)


SYSTEM = {"type": "message", "role": "system", "content": "Be a pirate."}
DEVELOPER = {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Rule 1."}, {"type": "input_text", "text": "Rule 2."}]}
USER = {"type": "message", "role": "user", "content": "hi"}


@pytest.mark.parametrize(
    "fields, instructions, left",
    [
        pytest.param({"instructions": "Be brief."}, "Be brief.", "hi", id="request-instructions"),
        pytest.param({"input": [SYSTEM, USER]}, "Be a pirate.", [USER], id="leading-system-item-taken"),
        pytest.param({"input": [DEVELOPER, USER]}, "Rule 1.Rule 2.", [USER], id="leading-developer-parts-joined"),
        pytest.param({"input": [USER, SYSTEM]}, None, [USER, SYSTEM], id="later-system-item-stays"),
        pytest.param({"instructions": "Be brief.", "input": [SYSTEM, USER]}, "Be brief.", [SYSTEM, USER], id="instructions-win-item-stays"),
        pytest.param({"input": []}, None, [], id="empty-input"),
    ],
)
@pytest.mark.parametrize("in_system", [pytest.param(False, id="flag-unset"), pytest.param(True, id="flag-1")])
def test_preamble_places_the_instructions_by_the_variable(helpers, fields, instructions, left, in_system):
    helpers["envs"].VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS = in_system
    messages, items = preamble(helpers, request(**fields))
    system = messages[0][1]
    assert items == left
    assert system["instructions"] == (instructions if in_system else None)
    expected_developer = [("developer", {"instructions": instructions, "tools": None})] if instructions and not in_system else []
    assert messages[1:] == expected_developer


def test_preamble_keeps_tools_effort_and_builtin_descriptions(helpers):
    tools = [{"type": "function", "name": "get_weather"}]
    req = request(instructions="Be brief.", tools=tools, reasoning=types.SimpleNamespace(effort="high"))
    messages, _ = preamble(helpers, req, custom_tools=True, tool_types=frozenset({"function", "web_search_preview", "code_interpreter"}))
    system = messages[0][1]
    assert system["reasoning_effort"] == "high" and system["with_custom_tools"] is True
    assert system["browser_description"] == "browser tool (allowed: ['search'])"
    assert system["python_description"] is None and system["container_description"] is None  # not offered by the server
    assert messages[1] == ("developer", {"instructions": "Be brief.", "tools": tools})


def test_preamble_has_no_developer_message_without_instructions_or_custom_tools(helpers):
    messages, _ = preamble(helpers, request(tools=[{"type": "web_search_preview"}]), tool_types=frozenset({"web_search_preview"}))
    assert [role for role, _ in messages] == ["system"]


@pytest.mark.parametrize("effort", ["minimal", "none", "xhigh"])
def test_preamble_refuses_an_effort_harmony_does_not_know_with_a_400_not_a_key_error(helpers, monkeypatch, effort):
    """make fuzz (issue #25): before 0.21.0 get_system_message indexes REASONING_EFFORT (a bare KeyError, a 500);
    the patched preamble raises 0.21.0's ValueError instead, which the server answers with a 400."""
    hu = sys.modules["vllm.entrypoints.openai.parser"].harmony_utils
    known = {"high": "HIGH", "medium": "MEDIUM", "low": "LOW"}

    def get_system_message(reasoning_effort: Any = None, **kwargs: Any) -> tuple[str, dict[str, Any]]:
        return ("system", {"reasoning_effort": known[reasoning_effort] if reasoning_effort else None, **kwargs})

    monkeypatch.setattr(hu, "get_system_message", get_system_message, raising=False)
    monkeypatch.setattr(hu, "REASONING_EFFORT", known, raising=False)
    req = request(reasoning=types.SimpleNamespace(effort=effort))
    with pytest.raises(ValueError, match=rf"^reasoning_effort='{effort}' is not supported by Harmony\. "
                                         r"Supported values are: high, medium, low\.$"):
        preamble(helpers, req)
    messages, _ = preamble(helpers, request(reasoning=types.SimpleNamespace(effort="high")))
    assert messages[0][1]["reasoning_effort"] == "HIGH"  # a known effort renders as before
    monkeypatch.delattr(hu, "REASONING_EFFORT")  # a release without the table: its KeyError is left alone
    with pytest.raises(KeyError):
        preamble(helpers, req)


def test_preamble_leaves_other_key_errors_alone(helpers, monkeypatch):
    hu = sys.modules["vllm.entrypoints.openai.parser"].harmony_utils

    def get_system_message(**kwargs: Any) -> None:
        raise KeyError("high")  # a key the effort table knows: not the effort's fault

    monkeypatch.setattr(hu, "get_system_message", get_system_message, raising=False)
    monkeypatch.setattr(hu, "REASONING_EFFORT", {"high": 1}, raising=False)
    with pytest.raises(KeyError):
        preamble(helpers, request())


def test_preamble_refuses_an_item_of_unknown_type(helpers):
    with pytest.raises(ValueError, match="Unknown message type"):
        preamble(helpers, request(input=[object()]))


@pytest.mark.parametrize("in_system", [pytest.param(False, id="flag-unset"), pytest.param(True, id="flag-1")])
def test_items_become_instructions_or_go_to_the_release_converter(helpers, in_system):
    helpers["envs"].VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS = in_system
    converted: list[Any] = []

    def convert(item: Any, prev_outputs: list[Any]) -> Any:
        converted.append(item)
        return ("converted", item["role"]) if item.get("role") != "skip" else None

    items = [USER, SYSTEM, DEVELOPER, {"role": "system", "content": ""}, {"role": "skip", "content": "x"}]
    messages = helpers[ITEMS](items, [], convert)
    system = ("system", {"instructions": "Be a pirate."}) if in_system else ("developer", {"instructions": "Be a pirate.", "tools": None})
    developer = ("developer", {"instructions": None if in_system else "Rule 1.Rule 2.", "tools": None})
    assert messages == [("converted", "user"), system, developer]  # the empty system item and a None conversion add nothing
    assert converted == [USER, items[-1]]


def test_items_remember_function_calls_for_their_outputs(helpers):
    call = helpers["call"](type="function_call", call_id="c1")
    prev_outputs: list[Any] = []
    helpers[ITEMS]([call], prev_outputs, lambda item, prev: ("converted", len(prev)))
    assert prev_outputs == [call]


def test_helper_source_is_module_level_code_without_imports_at_the_top():
    tree = ast.parse(HELPER_SOURCE)
    assert all(isinstance(node, ast.FunctionDef) for node in tree.body)


@pytest.mark.upstream
@pytest.mark.parametrize("version", [pytest.param(v, id=f"vllm-{v}") for v in ("0.15.1", "0.16.0", "0.17.0", "0.22.1")])
def test_the_builder_lives_where_the_band_says(version):
    source = wheel_source(version, f"vllm/{TARGET}")
    tree = ast.parse(source)
    owners = [c.name for c in tree.body if isinstance(c, ast.ClassDef) and any(getattr(m, "name", None) == METHOD for m in c.body)]
    assert owners == ["OpenAIServingResponses"]
    assert ("parse_response_input(" if Version(version) < Version("0.17.0") else "response_input_to_harmony(") in source
