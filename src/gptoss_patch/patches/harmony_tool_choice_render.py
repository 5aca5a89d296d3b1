"""Let the harmony branch of the chat renderer call the parser's adjust_request, as vLLM 0.27.0 does (G52).

The second half of harmony_tool_choice_structural: before 0.27.0, `render_chat` builds a gpt-oss request through
`_make_request_with_harmony` without ever calling the parser's `adjust_request`, so nothing can constrain a
required or named tool_choice. vLLM 0.27.0 (vllm#45560) calls it there, with the constructor arguments the
non-harmony path already uses. This patch inserts the same call in the harmony branch of
`OpenAIServingRender.render_chat` (0.24.x) and `OnlineRenderer.render_chat` (0.25.0-0.26.x), guarded by the class
attribute harmony_tool_choice_structural gives HarmonyParser: on a parser without it the call is skipped, because
stock DelegatingParser.adjust_request would force the generic JSON-array tool grammar, which harmony never parses.
Reports: https://github.com/vllm-project/vllm/issues/44216, https://github.com/vllm-project/vllm/pull/45560
"""

import ast
from typing import TYPE_CHECKING

from gptoss_patch.patches import _shapes, harmony_tool_choice_structural
from gptoss_patch.spec import Band, PackageView, PatchSpec, module_id

if TYPE_CHECKING:
    from gptoss_patch.patches._base import PatchCodemod

RENDER_TARGET = "entrypoints/serve/render/serving.py"  # OpenAIServingRender.render_chat, 0.24.x
RENDERER_TARGET = "renderers/online_renderer.py"  # OnlineRenderer.render_chat, 0.25.0 on
METHOD = "render_chat"
HARMONY_BUILD = "self._make_request_with_harmony"
# The parser's method, or (0.31.0 on) OnlineRenderer.adjust_harmony_request, which calls it for every harmony path.
ADJUST_CALLS = ("adjust_request", "adjust_harmony_request")
ADJUSTS = harmony_tool_choice_structural.ADJUSTS
MARK = "# gptoss-patch harmony_tool_choice_render: the harmony request goes through adjust_request (vllm#45560)"
CALL_SOURCE = f"""
{MARK}
if getattr(self.parser, "{ADJUSTS}", False):
    self.parser(self.renderer.get_tokenizer(), request.tools, model_config=self.model_config).adjust_request(
        request=request
    )
"""


def codemod() -> "type[PatchCodemod]":
    """Build the codemod class (imports libcst, so only apply/diff pay for it)."""
    import libcst as cst

    from gptoss_patch.patches._base import PatchCodemod, code, parse_statements

    def builds_harmony(statement: cst.CSTNode) -> bool:
        return HARMONY_BUILD in code(statement) if isinstance(statement, cst.SimpleStatementLine) else False

    def adjusts(statement: cst.CSTNode) -> bool:
        return any(f".{name}(" in code(statement) for name in ADJUST_CALLS)

    class HarmonyToolChoiceRender(PatchCodemod):
        ANCHOR = f"the `else:` branch of `if not self.use_harmony:` in {METHOD} ({HARMONY_BUILD}(...))"

        def in_scope(self, statement: cst.BaseStatement) -> bool:
            return isinstance(statement, cst.ClassDef) and any(
                isinstance(m, cst.FunctionDef) and m.name.value == METHOD for m in statement.body.body
            )

        def member_in_scope(self, member: cst.BaseStatement) -> bool:
            return isinstance(member, cst.FunctionDef) and member.name.value == METHOD

        def leave_If(self, original: cst.If, updated: cst.If) -> cst.If:
            orelse = updated.orelse
            if code(updated.test) != "notself.use_harmony" or not isinstance(orelse, cst.Else):
                return updated
            if not isinstance(orelse.body, cst.IndentedBlock):
                return updated
            body = list(orelse.body.body)
            if not any(builds_harmony(s) for s in body) or any(adjusts(s) for s in body):
                return updated  # not the harmony branch, or it calls adjust_request already (0.27.0's shape)
            self.hit()
            # the branch's first statement carries `# For GPT-OSS.`: the call goes after it, the comment stays first
            body[1:1] = parse_statements(CALL_SOURCE)
            return updated.with_changes(orelse=orelse.with_changes(body=orelse.body.with_changes(body=body)))

    return HarmonyToolChoiceRender


def _harmony_branches(source: str) -> list[list[ast.stmt]]:
    """The `else:` bodies of `if not self.use_harmony:` in render_chat that build the harmony request."""
    if HARMONY_BUILD not in source:
        return []
    return [
        node.orelse
        for function in _shapes.functions(source, METHOD)
        for node in ast.walk(function)
        if isinstance(node, ast.If)
        and ast.unparse(node.test) == "not self.use_harmony"
        and any(HARMONY_BUILD in ast.unparse(s) for s in node.orelse)
    ]


def _calls_adjust(branch: list[ast.stmt]) -> bool:
    return any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ADJUST_CALLS
        for s in branch
        for n in ast.walk(s)
    )


def is_applied(source: str, _package: PackageView) -> bool:
    """The guarded call of ours in the harmony branch (the guard names the attribute harmony_tool_choice_structural sets)."""
    return MARK in source and any(
        ADJUSTS in ast.unparse(s) and _calls_adjust([s]) for b in _harmony_branches(source) for s in b
    )


def fixed_upstream(package: PackageView) -> str | None:
    """From 0.27.0 OnlineRenderer.render_chat calls the parser's adjust_request for harmony requests (not ours)."""
    source = package.read_text(RENDERER_TARGET)
    if source and MARK not in source and any(_calls_adjust(b) for b in _harmony_branches(source)):
        return (
            f"vllm/{RENDERER_TARGET}: OnlineRenderer.render_chat calls the parser's adjust_request for harmony "
            "requests (vllm#45560)"
        )
    return None


def parser_not_patched(package: PackageView) -> str | None:
    """A warning while HarmonyParser lacks harmony_tool_choice_structural: the inserted call then does nothing."""
    source = package.read_text(harmony_tool_choice_structural.TARGET) or ""
    if harmony_tool_choice_structural.is_applied(source, package):
        return None
    return (
        f"does nothing until harmony_tool_choice_structural is applied too (vllm/{harmony_tool_choice_structural.TARGET} "
        "has no HarmonyParser.adjust_request of ours): apply both"
    )


SPEC = PatchSpec(
    id=module_id(__name__),
    summary="The harmony branch of the chat renderer calls the parser's adjust_request, as vLLM 0.27.0 does, so "
    "harmony_tool_choice_structural can constrain required/named tool_choice (G52).",
    upstream=(
        "https://github.com/vllm-project/vllm/issues/44216",
        "https://github.com/vllm-project/vllm/pull/45560",
    ),
    bands=(
        Band(">=0.24,<0.25", RENDER_TARGET),  # OpenAIServingRender.render_chat
        Band(">=0.25,<0.27", RENDERER_TARGET),  # OnlineRenderer.render_chat
    ),
    codemod=codemod,
    is_applied=is_applied,
    fixed_upstream=fixed_upstream,
    fixed_in="0.27.0",
    after=(harmony_tool_choice_structural.SPEC.id, "harmony_tool_choice_needs_parser"),
    reads=(harmony_tool_choice_structural.TARGET,),
    watch=parser_not_patched,
    note=(
        "Half of the G52 backport: the call runs only where harmony_tool_choice_structural gave HarmonyParser its "
        "adjust_request (a guard in the inserted code), so alone it changes nothing and status warns. Chat "
        "Completions only; the Responses path is unchanged."
    ),
    python_frontend=True,
)
