"""Reject `tool_choice: "required"` or a named tool with a 400 when a gpt-oss server has no tool parser.

Chat Completions checks, before rendering, that a `tool_choice` other than `none` can be honoured: `auto`
needs `--enable-auto-tool-choice`, and `required` or a named function needs `--tool-call-parser`, else a 400.
Harmony models (gpt-oss) skip the whole check (`and not self.use_harmony` in `tool_parsing_unavailable`),
so a server started without `--tool-call-parser` accepts `required` and named choices, renders the tools,
and answers 200 with no tool call at all: nothing parses one (vllm#48207). The patch
narrows the exemption to `auto` (best effort, as stock), as vLLM PR #48672 does: `required` and named
choices get the very 400 and message that every other model gets from that release's own code. The check
is `OpenAIServingChat.render_chat_request` (0.15.1-0.17.x), `OpenAIServingRender.render_chat`
(0.18.0-0.24.x) and `OnlineRenderer.render_chat` (0.25.0 on; unchanged through 0.33.0).
Reports: https://github.com/vllm-project/vllm/issues/48207, https://github.com/vllm-project/vllm/pull/48672
"""

import ast
from typing import TYPE_CHECKING

from gptoss_patch.patches import _shapes
from gptoss_patch.spec import Band, PackageView, PatchSpec, module_id

if TYPE_CHECKING:
    from gptoss_patch.patches._base import PatchCodemod

CHAT_TARGET = "entrypoints/openai/chat_completion/serving.py"  # OpenAIServingChat.render_chat_request, 0.15.1-0.17.x
RENDER_TARGET = "entrypoints/serve/render/serving.py"  # OpenAIServingRender.render_chat, 0.18.0-0.24.x
RENDERER_TARGET = "renderers/online_renderer.py"  # OnlineRenderer.render_chat, 0.25.0 on
METHODS = ("render_chat_request", "render_chat")
FLAG = "tool_parsing_unavailable"
EXEMPTION = "notself.use_harmony"  # the last operand of the flag, whitespace removed (patches/_base.code)
NARROWED = 'not (self.use_harmony and request.tool_choice == "auto")'
MARK = '# gptoss-patch harmony_tool_choice_needs_parser: harmony skips the check for "auto" only (vllm#48672)'


def codemod() -> "type[PatchCodemod]":
    """Build the codemod class (imports libcst, so only apply/diff pay for it)."""
    import libcst as cst

    from gptoss_patch.patches._base import PatchCodemod, code, small_statement

    def method(statement: cst.CSTNode) -> bool:
        return isinstance(statement, cst.FunctionDef) and statement.name.value in METHODS

    class HarmonyToolChoiceNeedsParser(PatchCodemod):
        ANCHOR = f"`{FLAG} = (... and not self.use_harmony)` in render_chat / render_chat_request"

        def in_scope(self, statement: cst.BaseStatement) -> bool:
            return isinstance(statement, cst.ClassDef) and any(method(m) for m in statement.body.body)

        def member_in_scope(self, member: cst.BaseStatement) -> bool:
            return method(member)

        def leave_SimpleStatementLine(
            self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
        ) -> cst.SimpleStatementLine:
            small = small_statement(updated)
            if not (
                isinstance(small, cst.Assign) and len(small.targets) == 1 and code(small.targets[0].target) == FLAG
            ):
                return updated
            value = small.value
            if not (
                isinstance(value, cst.BooleanOperation)
                and isinstance(value.operator, cst.And)
                and code(value.right) == EXEMPTION
            ):
                return updated
            self.hit()
            narrowed = value.with_changes(right=cst.parse_expression(NARROWED))
            mark = cst.EmptyLine(indent=True, comment=cst.Comment(MARK))
            return updated.with_changes(
                body=[small.with_changes(value=narrowed)], leading_lines=[*updated.leading_lines, mark]
            )

    return HarmonyToolChoiceNeedsParser


def _flags(source: str) -> list[ast.expr]:
    """The values assigned to `tool_parsing_unavailable` in render_chat / render_chat_request."""
    if FLAG not in source:
        return []
    return [
        node.value
        for name in METHODS
        for function in _shapes.functions(source, name)
        for node in ast.walk(function)
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == [FLAG]
    ]


def _operands(flag: ast.expr) -> list[str]:
    """The flag's `and` operands, each as `ast.dump` (formatting and quotes do not matter)."""
    operands = flag.values if isinstance(flag, ast.BoolOp) and isinstance(flag.op, ast.And) else [flag]
    return [ast.dump(op) for op in operands]


def _expression(text: str) -> str:
    return ast.dump(ast.parse(text, mode="eval").body)


def _exempts_harmony(flag: ast.expr) -> bool:
    """Whether `not self.use_harmony` is one of the flag's `and` operands (stock's blanket exemption)."""
    return _expression("not self.use_harmony") in _operands(flag)


def is_applied(source: str, _package: PackageView) -> bool:
    return MARK in source and any(_expression(NARROWED) in _operands(f) for f in _flags(source))


def fixed_upstream(package: PackageView) -> str | None:
    """The renderer's check no longer exempts harmony models outright (the shape of vllm#48672), and not by us."""
    source = package.read_text(RENDERER_TARGET)
    flags = _flags(source) if source and MARK not in source else []
    if flags and not any(_exempts_harmony(f) for f in flags):
        return (
            f"{RENDERER_TARGET}: OnlineRenderer.render_chat no longer exempts harmony models from the "
            "tool-parser check for required/named tool_choice (vllm#48672)"
        )
    return None


SPEC = PatchSpec(
    id=module_id(__name__),
    summary='`tool_choice: "required"` or a named tool gets the 400 every other model gets when the gpt-oss server '
    "has no --tool-call-parser, instead of a 200 with no tool call.",
    upstream=(
        "https://github.com/vllm-project/vllm/issues/48207",
        "https://github.com/vllm-project/vllm/pull/48672",
    ),
    bands=(
        Band(">=0.15.1,<0.18", CHAT_TARGET),  # OpenAIServingChat.render_chat_request
        Band(">=0.18,<0.25", RENDER_TARGET),  # OpenAIServingRender.render_chat
        Band(">=0.25", RENDERER_TARGET),  # OnlineRenderer.render_chat; the exemption is still in 0.33.0
    ),
    codemod=codemod,
    is_applied=is_applied,
    fixed_upstream=fixed_upstream,
    note=(
        "Only servers without --tool-call-parser change: required/named tool_choice now answers 400 with the "
        "release's own message ('tool_choice=... requires --tool-call-parser to be set'); auto and none behave as "
        "stock. Upstream: vllm#48672 (open; the exemption is still in 0.33.0)."
    ),
    python_frontend=True,
)
