"""Render client system/developer messages as harmony instructions (backport of vllm#44330, fixed in 0.23.0).

Before 0.23.0 the gpt-oss Chat Completions builder passes a client `system` message through as a
second, raw harmony system message after vLLM's own (known issue G02), so the model mostly ignores it.
"""

from typing import TYPE_CHECKING

from gptoss_patch.patches import _shapes
from gptoss_patch.spec import Band, PackageView, PatchSpec, module_id

if TYPE_CHECKING:
    from gptoss_patch.patches._base import PatchCodemod

HELPER = "_gptoss_patch_harmony_messages"
METHOD = "_make_request_with_harmony"
HARMONY_UTILS = "entrypoints/openai/parser/harmony_utils.py"

# Our backport, appended to the patched module. It reuses the installed harmony_utils functions,
# so the rendering is exactly what that vLLM version would do with the upstream fix.
HELPER_SOURCE = f'''
def {HELPER}(chat_messages, *, tools, reasoning_effort, with_custom_tools):
    """gptoss-patch harmony_instructions: backport of vllm#44330 (upstream from vLLM 0.23.0).

    The first message, if it is a system or developer message, becomes the instructions: in the
    system message with VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS=1, else in the developer message.
    Later system/developer messages become developer messages (system ones stay system with the
    variable set). No developer message is emitted without instructions or tools.
    """
    from vllm import envs as _envs
    from vllm.entrypoints.openai.parser import harmony_utils as _hu

    def as_dict(message):
        if isinstance(message, dict):
            return message
        if hasattr(message, "to_dict"):
            return message.to_dict()
        return message.model_dump(exclude_none=True)

    def text_of(content):
        if content is None or isinstance(content, str):
            return content
        if not isinstance(content, list):
            return None
        texts = [p if isinstance(p, str) else p.get("text") for p in content if isinstance(p, (str, dict))]
        texts = [t for t in texts if t is not None]
        return "".join(texts) if texts else None

    to_system = _envs.VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS
    remaining = [as_dict(message) for message in chat_messages]
    instructions = None
    if remaining and remaining[0].get("role") in ("system", "developer"):
        instructions = text_of(remaining.pop(0).get("content"))
    developer_instructions = None if to_system else instructions
    messages = [
        _hu.get_system_message(
            reasoning_effort=reasoning_effort,
            browser_description=None,
            python_description=None,
            instructions=instructions if to_system else None,
            with_custom_tools=with_custom_tools,
        )
    ]
    if developer_instructions or tools:
        messages.append(_hu.get_developer_message(instructions=developer_instructions, tools=tools))

    tool_names = {{}}
    for chat_msg in remaining:
        for call in chat_msg.get("tool_calls", []):
            tool_names[call.get("id")] = call.get("function", {{}}).get("name")
    converted = []
    for chat_msg in remaining:
        role = chat_msg.get("role")
        if role not in ("system", "developer"):
            converted.extend(_hu.parse_chat_input_to_harmony_message(chat_msg, tool_names))
            continue
        text = text_of(chat_msg.get("content"))
        if text is None:
            continue
        if role == "system" and to_system:
            converted.append(_hu.get_system_message(instructions=text))
        else:
            converted.append(_hu.get_developer_message(instructions=text))
    messages.extend(_hu.auto_drop_analysis_messages(converted))
    return messages
'''

CALL_SOURCE = f"""
# gptoss-patch harmony_instructions: system/developer messages become harmony instructions.
messages.extend(
    {HELPER}(
        request.messages,
        tools=request.tools if should_include_tools else None,
        reasoning_effort=request.reasoning_effort,
        with_custom_tools=should_include_tools,
    )
)
"""


def codemod() -> "type[PatchCodemod]":
    """Build the codemod class (imports libcst, so only apply/diff pay for it).

    No `from __future__ import annotations` here: libcst reads these methods' annotations at runtime.
    """
    import libcst as cst
    import libcst.matchers as m

    from gptoss_patch.patches._base import PatchCodemod, parse_statements

    # The four statements of the unpatched builder that the helper call replaces, in order.
    system_message = m.SimpleStatementLine(
        body=[m.Assign(targets=[m.AssignTarget(m.Name("sys_msg"))], value=m.Call(func=m.Name("get_system_message")))]
    )
    append_system = m.SimpleStatementLine(
        body=[m.Expr(m.Call(func=m.Attribute(m.Name("messages"), m.Name("append")), args=[m.Arg(m.Name("sys_msg"))]))]
    )
    developer_if = m.If(test=m.Attribute(m.Name("request"), m.Name("tools")))
    extend_chat = m.SimpleStatementLine(
        body=[
            m.Expr(
                m.Call(
                    func=m.Attribute(m.Name("messages"), m.Name("extend")),
                    args=[m.Arg(m.Call(func=m.Name("parse_chat_inputs_to_harmony_messages")))],
                )
            )
        ]
    )
    anchors = (system_message, append_system, developer_if, extend_chat)

    class HarmonyInstructions(PatchCodemod):
        DESCRIPTION = __doc__
        ANCHOR = f"{METHOD}: get_system_message / developer message / parse_chat_inputs_to_harmony_messages"

        @m.leave(m.FunctionDef(name=m.Name(METHOD)))
        def route_instructions(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
            body = list(updated.body.body)
            starts = [i for i, stmt in enumerate(body) if m.matches(stmt, system_message)]
            if len(starts) != 1:
                return updated
            start = starts[0]
            window = body[start : start + len(anchors)]
            if len(window) != len(anchors) or not all(m.matches(s, a) for s, a in zip(window, anchors)):
                return updated
            self.hit()
            body[start : start + len(anchors)] = parse_statements(CALL_SOURCE)
            return updated.with_changes(body=updated.body.with_changes(body=body))

        def leave_Module(self, original: cst.Module, updated: cst.Module) -> cst.Module:
            if self.hits != 1:
                return updated
            return updated.with_changes(body=[*updated.body, *parse_statements(HELPER_SOURCE, blank_lines_before=2)])

    return HarmonyInstructions


def is_applied(source: str, _package: PackageView) -> bool:
    methods = _shapes.functions(source, METHOD)
    return _shapes.top_level_function(source, HELPER) and any(_shapes.calls(f, HELPER) for f in methods)


def fixed_upstream(package: PackageView) -> str | None:
    if package.defines(HARMONY_UTILS, "build_harmony_preamble"):
        return f"the installed vLLM has the upstream fix (build_harmony_preamble in {HARMONY_UTILS}, vllm#44330)"
    return None


SPEC = PatchSpec(
    id=module_id(__name__),
    summary="Client system/developer messages become harmony instructions in gpt-oss Chat Completions (G02).",
    upstream=(
        "https://github.com/vllm-project/vllm/pull/44330",
        "https://github.com/vllm-project/vllm/issues/33210",
    ),
    bands=(Band(">=0.15.1,<0.18", "entrypoints/openai/chat_completion/serving.py"),),
    codemod=codemod,
    is_applied=is_applied,
    fixed_upstream=fixed_upstream,
    fixed_in="0.23.0",
    note=(
        "Upstream fix is vllm#44330, first in 0.23.0 (not #31607, which is an unmerged SM121/HarmonyError PR). "
        "With the patch, VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS=1 puts instructions in the system message."
    ),
)
