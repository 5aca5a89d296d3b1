"""Convert Responses API system/developer input items to harmony instructions (the converter half of vllm#44330, G03).

Before 0.23.0 the function that converts one Responses input item to harmony renders a `system` item as a
raw harmony system message (its text in place of the system content) and a `developer` item as a raw
developer message whose text is prefixed `Instructions:`, not harmony's `# Instructions` section. 0.23.0
turns both into instructions through `get_system_or_developer_message`: a developer message, or, for a
system item with VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS=1, a system message carrying them; an item
without text converts to nothing (None). It did the same for the chat-format messages of
`previous_input_messages` (`response_previous_input_to_harmony`), which return an empty list then.

`harmony_responses_instructions` fixes the Responses request builder, which never hands a system/developer
item to the converter once patched; this patch fixes the converters themselves, which upstream's own tests
call directly (tests/test_upstream_parity.py) and plugins or later callers may reach:
`parse_response_input` in harmony_utils (0.15.1-0.16.x) and `response_input_to_harmony` plus
`_parse_chat_format_message` (behind `response_previous_input_to_harmony`) in responses/harmony.py
(0.17.0-0.22.x). Every other item is converted as before, except that a content part without `text` (an
assistant item's `refusal` part, an image) reads as empty text, as 0.23.0's rewritten branch reads it
(`c.get("text", "")`), where the stock item converter's `c["text"]` raised a KeyError: a 500 that
`make fuzz` found (docs/safety.md).
Reports: https://github.com/vllm-project/vllm/pull/44330 (the fix) and G03 in docs/known-issues.md.
"""

from collections.abc import Sequence
from typing import TYPE_CHECKING

from gptoss_patch.patches import _shapes
from gptoss_patch.spec import Band, PackageView, PatchSpec, module_id

if TYPE_CHECKING:
    from gptoss_patch.patches._base import PatchCodemod

HARMONY_UTILS = "entrypoints/openai/parser/harmony_utils.py"  # parse_response_input, 0.15.1-0.16.x
RESPONSES_HARMONY = "entrypoints/openai/responses/harmony.py"  # response_input_to_harmony, 0.17.0 on
ITEM_CONVERTERS = ("parse_response_input", "response_input_to_harmony")  # one input item -> Message
CHAT_FORMAT = "_parse_chat_format_message"  # one previous_input_messages dict -> [Message] (0.17.0 on)
HELPER = "_gptoss_patch_response_instructions"
TEXT = "_gptoss_patch_response_input_text"
UPSTREAM_FUNCTION = "get_system_or_developer_message"  # what 0.23.0's converters call for these roles

# Whitespace-free code of the anchors (patches/_base.code).
MESSAGE_BRANCH = '"type"notinresponse_msgorresponse_msg["type"]=="message"'
CONTENT_READ = 'content=response_msg["content"]'
ROLE_READ = 'role=response_msg["role"]'
ROLE_TEST = 'rolein("system","developer")'
TOOL_BRANCH = 'role=="tool"'
PART_TEXT = 'contents=[TextContent(text=text_prefix+c["text"])forcincontent]'  # a list content's parts

MARK = "# gptoss-patch harmony_responses_input:"
ITEM_SOURCE = f"""
{MARK} system/developer items become harmony instructions (vllm#44330).
if role in ("system", "developer"):
    return {HELPER}(role, content)
"""
PART_SOURCE = (
    'contents = [TextContent(text=text_prefix + c.get("text", "")) for c in content]'
    f"  {MARK} a part without text is empty text, as in 0.23.0 (not a KeyError)\n"
)
CHAT_FORMAT_SOURCE = f"""
{MARK} system/developer messages become harmony instructions (vllm#44330).
if role in ("system", "developer"):
    instructions = {HELPER}(role, chat_msg.get("content"))
    return [instructions] if instructions is not None else []
"""

HELPER_SOURCE = f'''
def {TEXT}(content):
    """gptoss-patch harmony_responses_input: a content field's text as vLLM 0.23.0 flattens it.

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


def {HELPER}(role, content):
    """gptoss-patch harmony_responses_input: backport of vllm#44330 (upstream from vLLM 0.23.0).

    A system or developer item becomes a developer message's instructions; a system item goes into a
    system message instead while VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS is set. Without text it
    converts to nothing (None).
    """
    from vllm import envs as _envs
    from vllm.entrypoints.openai.parser import harmony_utils as _hu

    text = {TEXT}(content)
    if not text:
        return None
    if role == "system" and _envs.VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS:
        return _hu.get_system_message(instructions=text)
    return _hu.get_developer_message(instructions=text)
'''


def codemod() -> "type[PatchCodemod]":
    """Build the codemod class (imports libcst, so only apply/diff pay for it)."""
    import libcst as cst

    from gptoss_patch.patches._base import PatchCodemod, code, defines, parse_statements, small_statement

    def line(statement: cst.CSTNode) -> str:
        small = small_statement(statement)
        return code(small) if small is not None else ""

    def ifs(body: Sequence[cst.CSTNode], test: str) -> list[int]:
        return [i for i, s in enumerate(body) if isinstance(s, cst.If) and code(s.test) == test]

    def patched_at(body: Sequence[cst.CSTNode], i: int) -> bool:
        """Whether our system/developer branch already follows the anchor at `i` (a second pass is drift)."""
        return i + 1 < len(body) and isinstance(nxt := body[i + 1], cst.If) and code(nxt.test) == ROLE_TEST

    def part_texts(block: list[cst.CSTNode]) -> list[tuple[int, int]]:
        """(statement, else-statement) of each `contents = [... c["text"] ...]` in an `else:` of the message branch."""
        return [(i, j) for i, s in enumerate(block) if isinstance(s, cst.If) and isinstance(s.orelse, cst.Else)
                for j, inner in enumerate(s.orelse.body.body) if line(inner) == PART_TEXT]

    def rewrite_item_converter(function: cst.FunctionDef) -> cst.FunctionDef | None:
        """The message branch with the system/developer return after its content read and its content parts read
        with `.get("text", "")`, if each is there once."""
        body = list(function.body.body)
        branches = ifs(body, MESSAGE_BRANCH)
        if len(branches) != 1:
            return None
        branch = body[branches[0]]
        assert isinstance(branch, cst.If)
        block = list(branch.body.body)
        reads = [i for i, s in enumerate(block) if line(s) == CONTENT_READ]
        parts = part_texts(block)
        if (len(reads) != 1 or len(parts) != 1 or patched_at(block, reads[0])
                or not any(line(s) == ROLE_READ for s in block[: reads[0]])):
            return None
        at, inner_at = parts[0]
        parted = block[at]
        assert isinstance(parted, cst.If) and isinstance(parted.orelse, cst.Else)
        inner = list(parted.orelse.body.body)
        stock = inner[inner_at]
        assert isinstance(stock, cst.SimpleStatementLine)
        inner[inner_at] = parse_statements(PART_SOURCE)[0].with_changes(leading_lines=stock.leading_lines)
        orelse = parted.orelse.with_changes(body=parted.orelse.body.with_changes(body=inner))
        block[at] = parted.with_changes(orelse=orelse)
        block[reads[0] + 1 : reads[0] + 1] = parse_statements(ITEM_SOURCE)
        body[branches[0]] = branch.with_changes(body=branch.body.with_changes(body=block))
        return function.with_changes(body=function.body.with_changes(body=body))

    def rewrite_chat_format(function: cst.FunctionDef) -> cst.FunctionDef | None:
        """The system/developer return after the tool branch, if that branch is there once."""
        body = list(function.body.body)
        tools = ifs(body, TOOL_BRANCH)
        if len(tools) != 1 or patched_at(body, tools[0]):
            return None
        body[tools[0] + 1 : tools[0] + 1] = parse_statements(CHAT_FORMAT_SOURCE)
        return function.with_changes(body=function.body.with_changes(body=body))

    class HarmonyResponsesInput(PatchCodemod):
        ANCHOR = (f"{' / '.join(ITEM_CONVERTERS)}: one message branch reading `content = response_msg[\"content\"]` "
                  f"and its parts' `c[\"text\"]`; {CHAT_FORMAT} (0.17.0 on): one `if role == \"tool\":`")
        HELPER_SOURCE = HELPER_SOURCE

        def rewrite(self, tree: cst.Module) -> cst.Module:
            # responses/harmony.py (0.17.0 on) holds both converters: each must be rewritten once.
            self.EXPECTED_HITS = 2 if any(defines(s, ITEM_CONVERTERS[1]) for s in tree.body) else 1
            return super().rewrite(tree)

        def in_scope(self, statement: cst.BaseStatement) -> bool:
            return any(defines(statement, name) for name in (*ITEM_CONVERTERS, CHAT_FORMAT))

        def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
            name = updated.name.value
            rewrite = rewrite_chat_format if name == CHAT_FORMAT else rewrite_item_converter if name in ITEM_CONVERTERS else None
            new = rewrite(updated) if rewrite is not None else None
            if new is None:
                return updated
            self.hit()
            return new

    return HarmonyResponsesInput


def is_applied(source: str, _package: PackageView) -> bool:
    converters = [f for name in (*ITEM_CONVERTERS, CHAT_FORMAT) for f in _shapes.functions(source, name)]
    return _shapes.top_level_function(source, HELPER) and bool(converters) and all(
        _shapes.calls(f, HELPER) for f in converters
    )


def fixed_upstream(package: PackageView) -> str | None:
    source = package.read_text(RESPONSES_HARMONY)
    converters = _shapes.functions(source, ITEM_CONVERTERS[1]) if source and UPSTREAM_FUNCTION in source else []
    if any(_shapes.calls(f, UPSTREAM_FUNCTION) for f in converters):
        return f"the installed vLLM's {ITEM_CONVERTERS[1]} calls {UPSTREAM_FUNCTION} ({RESPONSES_HARMONY}, vllm#44330)"
    return None


SPEC = PatchSpec(
    id=module_id(__name__),
    summary="Responses API system/developer input items convert to harmony instructions, as in 0.23.0 (G03).",
    upstream=(
        "https://github.com/vllm-project/vllm/pull/44330",
        "https://github.com/vllm-project/vllm/issues/33210",
    ),
    bands=(
        Band(">=0.15.1,<0.17", HARMONY_UTILS),  # parse_response_input
        Band(">=0.17,<0.23", RESPONSES_HARMONY),  # response_input_to_harmony, _parse_chat_format_message
    ),
    codemod=codemod,
    is_applied=is_applied,
    fixed_upstream=fixed_upstream,
    fixed_in="0.23.0",
    note=(
        "The converter half of the Responses fix in vllm#44330 (harmony_responses_instructions is the request "
        "builder's): the per-item conversion functions render system/developer items as 0.23.0 does, and read a "
        "content part without text as empty text as 0.23.0 does (stock: KeyError, a 500). On "
        "0.15.1-0.16.x an item without text converts to None, which only the patched builder expects."
    ),
    python_frontend=True,
)
