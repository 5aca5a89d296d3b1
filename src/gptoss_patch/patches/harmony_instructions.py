"""Render client system/developer messages as harmony instructions (backport of vllm#44330, fixed in 0.23.0).

Before 0.23.0 the gpt-oss Chat Completions builder passes a client `system` message through as a
second, raw harmony system message after vLLM's own (known issue G02), so the model mostly ignores it.
"""

from typing import TYPE_CHECKING

from gptoss_patch.patches import _shapes
from gptoss_patch.spec import Band, PackageView, PatchSpec, ServeEnv, module_id

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
    """Build the codemod class (imports libcst, so only apply/diff pay for it)."""
    import libcst as cst

    from gptoss_patch.patches._base import PatchCodemod, class_has_method, code, defines, parse_statements

    def anchors_at(body: list[cst.CSTNode], i: int) -> bool:
        """The four statements of the unpatched builder that the helper call replaces, in order."""
        window = [small_statement_code(s) for s in body[i : i + 4]]
        return (
            len(window) == 4
            and window[0] is not None and window[0].startswith("sys_msg=get_system_message(")
            and window[1] == "messages.append(sys_msg)"
            and isinstance(third := body[i + 2], cst.If) and code(third.test) == "request.tools"
            and window[3] is not None and window[3].startswith("messages.extend(parse_chat_inputs_to_harmony_messages(")
        )

    def small_statement_code(statement: cst.CSTNode) -> str | None:
        if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
            return code(statement.body[0])
        return None

    class HarmonyInstructions(PatchCodemod):
        ANCHOR = f"{METHOD}: get_system_message / developer message / parse_chat_inputs_to_harmony_messages"
        HELPER_SOURCE = HELPER_SOURCE

        def in_scope(self, statement: cst.BaseStatement) -> bool:
            return class_has_method(statement, METHOD)

        def member_in_scope(self, member: cst.BaseStatement) -> bool:
            return defines(member, METHOD)

        def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
            body = list(updated.body.body)
            starts = [i for i in range(len(body)) if anchors_at(body, i)]
            if updated.name.value != METHOD or len(starts) != 1:
                return updated
            self.hit()
            body[starts[0] : starts[0] + 4] = parse_statements(CALL_SOURCE)
            return updated.with_changes(body=updated.body.with_changes(body=body))

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
    bands=(
        Band(">=0.15.1,<0.18", "entrypoints/openai/chat_completion/serving.py"),  # OpenAIServingChat
        Band(">=0.18,<0.23", "entrypoints/serve/render/serving.py"),  # OpenAIServingRender
    ),
    codemod=codemod,
    is_applied=is_applied,
    fixed_upstream=fixed_upstream,
    fixed_in="0.23.0",
    reads=(HARMONY_UTILS,),
    note=(
        "Upstream fix is vllm#44330, first in 0.23.0 (not #31607, which is an unmerged SM121/HarmonyError PR). "
        "With the patch, VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS=1 puts instructions in the system message and "
        "renders every later developer message empty; `serve` leaves it unset unless given --instructions system."
    ),
    probe_needs_vocabulary=True,
    probe_runs_on="<0.25",  # 0.25+ renders through OnlineRenderer: no _make_request_with_harmony to call
    serve_env=(
        # Only on request: upstream's default (unset) keeps every system and developer message; with 1,
        # get_developer_message drops the instructions of every later developer message (vllm#44330 semantics).
        ServeEnv(
            "VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS",
            "1",
            effect="asked for with --instructions system: the client's first system/developer message goes into the "
            "harmony system message; every later developer message is rendered empty (its text is lost)",
            unset_why="and stock Chat Completions before 0.23 never passes instructions, "
            "so the variable would change nothing there (G02)",
            choice="--instructions system",
        ),
    ),
    python_frontend=True,
)
