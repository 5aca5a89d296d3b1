"""Build the gpt-oss Responses API preamble from `instructions` (backport of vllm#44330's Responses half, fixed in 0.23.0).

Before 0.23.0, `/v1/responses` on gpt-oss ignores `instructions` (known issue G03): with
VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS unset they reach the prompt only inside a developer message
built for custom function tools, and never without them. A `system` input item is dropped from the
input and its text silently replaces the model identity of harmony's system message; a `developer`
item is rendered as a raw developer message whose text is prefixed `Instructions:` instead of
harmony's `# Instructions` section.

0.23.0 builds the Responses preamble the way Chat Completions builds it: the instructions are
`request.instructions`, or else the text of a leading system/developer input item (taken out of the
input); they go to the developer message by default, to the system message with the variable set to
1 (which renders developer instructions empty, as in Chat Completions). Later system/developer items
become developer messages (system ones stay system messages under the variable); an item without
text adds nothing. The patch rewrites `_construct_input_messages_with_harmony` of
OpenAIServingResponses to do the same through two helpers of its own; every other input item is
still converted by the release's own function. Before 0.21.0 a `reasoning.effort` harmony does not know
(`minimal`, `none`, `xhigh`: the Responses API accepts them) is a bare KeyError in `get_system_message`, a 500
that `make fuzz` found under the patched preamble as under stock's (G11, G39); the patched preamble refuses it
as 0.21.0 does, with a ValueError that the server answers with a 400.
Reports: https://github.com/vllm-project/vllm/pull/44330 (the fix) and G03 in docs/known-issues.md.
"""

from typing import TYPE_CHECKING

from gptoss_patch.patches import _shapes
from gptoss_patch.spec import Band, PackageView, PatchSpec, module_id

if TYPE_CHECKING:
    from gptoss_patch.patches._base import PatchCodemod

TARGET = "entrypoints/openai/responses/serving.py"  # OpenAIServingResponses, 0.15.1-0.29.x
METHOD = "_construct_input_messages_with_harmony"
PREAMBLE = "_gptoss_patch_responses_preamble"
ITEMS = "_gptoss_patch_responses_items"
# Where 0.23.0 and later build the Responses preamble with vllm#44330's build_harmony_preamble.
UPSTREAM_BUILDERS = (TARGET, "renderers/online_renderer.py")
UPSTREAM_FUNCTION = "build_harmony_preamble"
# The release's own converter of one input item: parse_response_input (harmony_utils, 0.15.1-0.16.0),
# response_input_to_harmony (responses/harmony.py, 0.17.0 on).
CONVERTERS = ("parse_response_input", "response_input_to_harmony")

HELPER_SOURCE = f'''
def _gptoss_patch_responses_fields(item):
    """An input item or message as a dict (the shapes a Responses request carries)."""
    if isinstance(item, dict):
        return item
    if hasattr(item, "to_dict"):
        return item.to_dict()
    if hasattr(item, "model_dump"):
        return item.model_dump(exclude_none=True)
    raise ValueError(f"Unknown message type: {{type(item)}}")


def _gptoss_patch_responses_text(content):
    """The text of a message's content: a string as it is, the text parts of a list joined, else None."""
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    texts = [part if isinstance(part, str) else part.get("text") for part in content if isinstance(part, (str, dict))]
    texts = [text for text in texts if text is not None]
    return "".join(texts) if texts else None


def {PREAMBLE}(server, request, tool_types, with_custom_tools):
    """gptoss-patch harmony_responses_instructions: the Responses preamble as vLLM 0.23.0 builds it (vllm#44330).

    Returns (harmony system message [+ developer message], the input items still to convert). The
    instructions are request.instructions, else the text of a leading system/developer item, which
    is then left out of the input; they go to the system message with
    VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS=1, else to the developer message. No developer message
    is emitted without instructions or custom tools.
    """
    from vllm import envs as _envs
    from vllm.entrypoints.openai.parser import harmony_utils as _hu

    items = request.input
    instructions = request.instructions
    if instructions is None and isinstance(items, list) and items:
        first = _gptoss_patch_responses_fields(items[0])
        if first.get("role") in ("system", "developer"):
            instructions = _gptoss_patch_responses_text(first.get("content"))
            items = items[1:]
    in_system = _envs.VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS

    # The built-in tools the server offers and the request enables (MCP allowed_tools filters them).
    allowed = _extract_allowed_tools_from_mcp_requests(request.tools)
    tool_server = server.tool_server
    descriptions = {{}}
    for tool, kind in (("browser", "web_search_preview"), ("python", "code_interpreter"), ("container", "container")):
        offered = kind in tool_types and tool_server is not None and tool_server.has_tool(tool)
        descriptions[f"{{tool}}_description"] = tool_server.get_tool_description(tool, allowed.get(kind)) if offered else None

    try:
        system = _hu.get_system_message(
            reasoning_effort=request.reasoning.effort if request.reasoning else None,
            instructions=instructions if in_system else None,
            with_custom_tools=with_custom_tools,
            **descriptions,
        )
    except KeyError as exc:
        # Before 0.21.0 an effort harmony does not know (the Responses API takes `minimal`, `none`, `xhigh`) is a
        # bare KeyError in get_system_message, which the server answers with a 500: refuse it as 0.21.0 does, with a
        # ValueError (a 400).
        known = getattr(_hu, "REASONING_EFFORT", None)
        if known is None or len(exc.args) != 1 or exc.args[0] in known:
            raise
        raise ValueError(
            f"reasoning_effort={{exc.args[0]!r}} is not supported by Harmony. Supported values are: {{', '.join(known)}}."
        ) from None
    preamble = [system]
    developer_instructions = None if in_system else instructions
    tools = request.tools if with_custom_tools else None
    if developer_instructions or tools:
        preamble.append(_hu.get_developer_message(instructions=developer_instructions, tools=tools))
    return preamble, items


def {ITEMS}(items, prev_outputs, convert):
    """gptoss-patch harmony_responses_instructions: input items to harmony messages, as vLLM 0.23.0 does.

    A system/developer message item becomes a developer message with its text as instructions (a
    system item stays a system message under VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS=1, which also
    empties developer instructions); one without text adds nothing. Every other item goes through the
    release's own `convert`. A function call is remembered in prev_outputs for the outputs that follow.
    """
    from openai.types.responses import ResponseFunctionToolCall
    from vllm import envs as _envs
    from vllm.entrypoints.openai.parser import harmony_utils as _hu

    messages = []
    for item in items:
        fields = item if isinstance(item, dict) else item.model_dump()
        role = fields.get("role")
        if ("type" not in fields or fields["type"] == "message") and role in ("system", "developer"):
            text = _gptoss_patch_responses_text(fields.get("content"))
            if not text:
                message = None
            elif role == "system" and _envs.VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS:
                message = _hu.get_system_message(instructions=text)
            else:
                message = _hu.get_developer_message(instructions=text)
        else:
            message = convert(item, prev_outputs)
        if message is not None:
            messages.append(message)
        if isinstance(item, ResponseFunctionToolCall):
            prev_outputs.append(item)
    return messages
'''

MARK = "# gptoss-patch harmony_responses_instructions:"
INPUT_SOURCE = f"""
{MARK} a leading system/developer item may become the instructions.
request_input = request.input
"""
PREAMBLE_SOURCE = f"""
{MARK} instructions go to the harmony preamble (vllm#44330).
preamble, request_input = {PREAMBLE}(self, request, tool_types, with_custom_tools)
messages.extend(preamble)
"""
ITEMS_SOURCE = f"""
{MARK} system/developer items become harmony instructions (vllm#44330).
messages.extend({ITEMS}(request_input, prev_outputs, {{convert}}))
"""


def codemod() -> "type[PatchCodemod]":
    """Build the codemod class (imports libcst, so only apply/diff pay for it)."""
    import libcst as cst

    from gptoss_patch.patches._base import (
        PatchCodemod,
        class_has_method,
        code,
        defines,
        parse_statements,
        small_statement,
    )

    def line(statement: cst.CSTNode) -> str | None:
        small = small_statement(statement)
        return code(small) if small is not None else None

    def if_with(body: list[cst.CSTNode], test: str) -> list[int]:
        return [i for i, s in enumerate(body) if isinstance(s, cst.If) and code(s.test) == test]

    def preamble_at(block: list[cst.CSTNode]) -> int | None:
        """Where the stock system message + developer message (for custom tools) start, if exactly once."""
        starts = [
            i
            for i in range(len(block) - 2)
            if (line(block[i]) or "").startswith("sys_msg=self._construct_harmony_system_input_message(")
            and line(block[i + 1]) == "messages.append(sys_msg)"
            and isinstance(third := block[i + 2], cst.If)
            and code(third.test) == "with_custom_tools"
        ]
        return starts[0] if len(starts) == 1 else None

    def converter_loop(block: list[cst.CSTNode]) -> tuple[int, str] | None:
        """The loop over `request.input` and the converter it calls, if exactly once."""
        found = []
        for i, s in enumerate(block):
            if not (isinstance(s, cst.For) and code(s.iter) == "request.input" and code(s.target) == "response_msg"):
                continue
            first = line(s.body.body[0]) if s.body.body else None
            found += [(i, name) for name in CONVERTERS if first == f"new_msg={name}(response_msg,prev_outputs)"]
        return found[0] if len(found) == 1 else None

    class HarmonyResponsesInstructions(PatchCodemod):
        ANCHOR = f"{METHOD}: _construct_harmony_system_input_message / developer message for custom tools / input loop"
        HELPER_SOURCE = HELPER_SOURCE

        def in_scope(self, statement: cst.BaseStatement) -> bool:
            return class_has_method(statement, METHOD)

        def member_in_scope(self, member: cst.BaseStatement) -> bool:
            return defines(member, METHOD)

        def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
            body = list(updated.body.body)
            new_branch, input_branch = if_with(body, "prev_responseisNone"), if_with(body, "isinstance(request.input,str)")
            if updated.name.value != METHOD or len(new_branch) != 1 or len(input_branch) != 1:
                return updated
            branch, inputs = body[new_branch[0]], body[input_branch[0]]
            assert isinstance(branch, cst.If) and isinstance(inputs, cst.If)
            block = list(branch.body.body)
            start = preamble_at(block)
            loop = converter_loop(list(inputs.orelse.body.body)) if isinstance(inputs.orelse, cst.Else) else None
            if start is None or loop is None:
                return updated
            self.hit()
            first, *rest = parse_statements(PREAMBLE_SOURCE)
            stock = block[start]
            assert isinstance(stock, cst.SimpleStatementLine) and isinstance(first, cst.SimpleStatementLine)
            kept = [*stock.leading_lines, *first.leading_lines]  # the blank line before the stock block
            block[start : start + 3] = [first.with_changes(leading_lines=kept), *rest]
            items = list(inputs.orelse.body.body)  # type: ignore[union-attr]
            items[loop[0] : loop[0] + 1] = parse_statements(ITEMS_SOURCE.format(convert=loop[1]))
            body[new_branch[0]] = branch.with_changes(body=branch.body.with_changes(body=block))
            orelse = inputs.orelse.with_changes(body=inputs.orelse.body.with_changes(body=items))  # type: ignore[union-attr]
            body[input_branch[0]] = inputs.with_changes(orelse=orelse)
            body[new_branch[0] : new_branch[0]] = parse_statements(INPUT_SOURCE)
            return updated.with_changes(body=updated.body.with_changes(body=body))

    return HarmonyResponsesInstructions


def is_applied(source: str, _package: PackageView) -> bool:
    methods = _shapes.functions(source, METHOD)
    return (
        _shapes.top_level_function(source, PREAMBLE)
        and _shapes.top_level_function(source, ITEMS)
        and any(_shapes.calls(f, PREAMBLE) and _shapes.calls(f, ITEMS) for f in methods)
    )


def fixed_upstream(package: PackageView) -> str | None:
    for relpath in UPSTREAM_BUILDERS:
        source = package.read_text(relpath)
        tree = _shapes.parse(source) if source and f"{UPSTREAM_FUNCTION}(" in source else None
        if tree is not None and _shapes.calls(tree, UPSTREAM_FUNCTION):
            return f"the installed vLLM builds the Responses preamble with {UPSTREAM_FUNCTION} ({relpath}, vllm#44330)"
    return None


SPEC = PatchSpec(
    id=module_id(__name__),
    summary="Responses API `instructions` and system/developer input items become harmony instructions for gpt-oss (G03).",
    upstream=(
        "https://github.com/vllm-project/vllm/pull/44330",
        "https://github.com/vllm-project/vllm/issues/33210",
    ),
    bands=(Band(">=0.15.1,<0.23", TARGET),),  # OpenAIServingResponses._construct_input_messages_with_harmony
    codemod=codemod,
    is_applied=is_applied,
    fixed_upstream=fixed_upstream,
    fixed_in="0.23.0",
    reads=UPSTREAM_BUILDERS[1:],
    note=(
        "Backport of the Responses half of vllm#44330 (first in 0.23.0). Unset, VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS "
        "puts the instructions in the developer message; at 1 in the system message, and developer instructions are "
        "rendered empty. A system input item no longer replaces the model identity. Before 0.21.0 a reasoning effort "
        "harmony does not know is refused with a 400 (0.21.0's message), not a bare KeyError (a 500)."
    ),
    probe_needs_vocabulary=True,
    probe_runs_on="<0.30",  # 0.30+ renders Responses through OnlineRenderer: no OpenAIServingResponses builder to call
    python_frontend=True,
)
