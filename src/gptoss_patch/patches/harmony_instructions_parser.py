"""`parse_chat_input_to_harmony_message` renders system/developer messages as instructions (the harmony_utils half of vllm#44330).

Before 0.23.0 the function that converts one Chat Completions message to harmony passes a client
`system` or `developer` message through as a raw harmony message of that role (G02), and flattens
content parts by `type == "text"` only. vllm#44330 (first in 0.23.0) turned such a message into harmony
instructions (a developer message, or with VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS=1 a system message
for role system), and flattened content as the Responses API sends it too. `harmony_instructions`
fixes the Chat Completions builder; this patch fixes the function itself, which every other caller
(the plural `parse_chat_inputs_to_harmony_messages`, the Responses API's previous-input path, plugins,
tool parsers) still reaches. Upstream's own tests of it (`test_system_message`,
`test_developer_message`, 0.23.0) pass on the patched releases: tests/patches/test_upstream_parity.py.
"""

from typing import TYPE_CHECKING

from gptoss_patch.patches import _shapes
from gptoss_patch.spec import Band, PackageView, PatchSpec, module_id

if TYPE_CHECKING:
    from gptoss_patch.patches._base import PatchCodemod

FUNCTION = "parse_chat_input_to_harmony_message"
TARGET = "entrypoints/openai/parser/harmony_utils.py"
FLATTEN = "_gptoss_patch_flatten_input_text"
INSTRUCTIONS = "_gptoss_patch_instruction_messages"
UPSTREAM_FUNCTION = "get_system_or_developer_message"  # what 0.23.0 added to harmony_utils with the fix

# Whitespace-free code of the statements the rewrite anchors on (patches/_base.code), and what replaces them.
ROLE_ANCHOR = 'role=chat_msg.get("role")'
TOOL_CALL_CONTENT = 'content=flatten_chat_text_content(chat_msg.get("content"))'
TOOL_CONTENT = "content=flatten_chat_text_content(content)"

ROLE_SOURCE = f"""
# gptoss-patch harmony_instructions_parser: system/developer messages become harmony instructions (vllm#44330).
if role in ("system", "developer"):
    return {INSTRUCTIONS}(role, chat_msg.get("content"))
"""
TOOL_CALL_SOURCE = f'content = {FLATTEN}(chat_msg.get("content"))  # gptoss-patch harmony_instructions_parser\n'
TOOL_SOURCE = f'content = {FLATTEN}(content) or ""  # gptoss-patch harmony_instructions_parser\n'

HELPER_SOURCE = f'''
def {FLATTEN}(content):
    """gptoss-patch harmony_instructions_parser: a content field's text as vLLM 0.23.0 flattens it.

    A string as it is; from a list, every string and every part's `text` (Chat Completions and
    Responses parts alike), joined; None when there is no text.
    """
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    texts = [item if isinstance(item, str) else item.get("text") for item in content if isinstance(item, (str, dict))]
    texts = [text for text in texts if text is not None]
    return "".join(texts) if texts else None


def {INSTRUCTIONS}(role, content):
    """gptoss-patch harmony_instructions_parser: backport of vllm#44330 (upstream from vLLM 0.23.0).

    A system or developer message becomes a developer message's instructions; a system message goes
    into a system message instead while VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS is set. Without text
    it renders nothing.
    """
    from vllm import envs as _envs

    instructions = {FLATTEN}(content)
    if instructions is None:
        return []
    if role == "system" and _envs.VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS:
        return [get_system_message(instructions=instructions)]
    return [get_developer_message(instructions=instructions)]
'''


def codemod() -> "type[PatchCodemod]":
    """Build the codemod class (imports libcst, so only apply/diff pay for it)."""
    import libcst as cst

    from gptoss_patch.patches._base import PatchCodemod, code, defines, parse_statements, small_statement

    def line_code(statement: cst.CSTNode) -> str:
        small = small_statement(statement)
        return code(small) if small is not None else ""

    def rewrite_branch(branch: cst.CSTNode, found: list[str]) -> cst.CSTNode:
        """An `if` at the function's top level, with its content-flattening statement replaced."""
        if not isinstance(branch, cst.If):
            return branch
        body = list(branch.body.body)
        for i, statement in enumerate(body):
            new = {TOOL_CALL_CONTENT: TOOL_CALL_SOURCE, TOOL_CONTENT: TOOL_SOURCE}.get(line_code(statement))
            if new is not None and isinstance(statement, cst.SimpleStatementLine):
                found.append(line_code(statement))
                body[i] = parse_statements(new)[0].with_changes(leading_lines=statement.leading_lines)
        return branch.with_changes(body=branch.body.with_changes(body=body))

    class HarmonyInstructionsParser(PatchCodemod):
        ANCHOR = (f"{FUNCTION}: one `role = chat_msg.get(\"role\")` and the tool-call and tool branches' "
                  "flatten_chat_text_content calls")
        HELPER_SOURCE = HELPER_SOURCE

        def in_scope(self, statement: cst.BaseStatement) -> bool:
            return defines(statement, FUNCTION)

        def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
            if updated.name.value != FUNCTION:
                return updated
            found: list[str] = []
            body = [rewrite_branch(statement, found) for statement in updated.body.body]
            roles = [i for i, statement in enumerate(body) if line_code(statement) == ROLE_ANCHOR]
            if len(roles) != 1 or sorted(found) != sorted([TOOL_CALL_CONTENT, TOOL_CONTENT]):
                return updated
            self.hit()
            body[roles[0] + 1 : roles[0] + 1] = parse_statements(ROLE_SOURCE)
            return updated.with_changes(body=updated.body.with_changes(body=body))

    return HarmonyInstructionsParser


def is_applied(source: str, _package: PackageView) -> bool:
    return _shapes.top_level_function(source, INSTRUCTIONS) and any(
        _shapes.calls(f, INSTRUCTIONS) for f in _shapes.functions(source, FUNCTION)
    )


def fixed_upstream(package: PackageView) -> str | None:
    if package.defines(TARGET, UPSTREAM_FUNCTION):
        return f"the installed vLLM has the upstream fix ({UPSTREAM_FUNCTION} in {TARGET}, vllm#44330)"
    return None


SPEC = PatchSpec(
    id=module_id(__name__),
    summary="parse_chat_input_to_harmony_message turns system/developer messages into harmony instructions (G02).",
    upstream=(
        "https://github.com/vllm-project/vllm/pull/44330",
        "https://github.com/vllm-project/vllm/issues/33210",
    ),
    bands=(Band(">=0.15.1,<0.23", TARGET),),
    codemod=codemod,
    is_applied=is_applied,
    fixed_upstream=fixed_upstream,
    fixed_in="0.23.0",
    note=(
        "The harmony_utils half of vllm#44330 (harmony_instructions is the Chat Completions builder's): callers of "
        "parse_chat_input_to_harmony_message other than the patched builder get 0.23.0's rendering too."
    ),
    python_frontend=True,
)
