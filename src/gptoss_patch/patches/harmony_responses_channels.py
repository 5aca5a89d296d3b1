"""Render Responses reasoning items on `analysis` and tool outputs on `commentary` to the assistant, as vLLM 0.22.0 does (G53).

The function that converts one Responses API input item to harmony (`parse_response_input` in harmony_utils,
0.15.1-0.16.x; `response_input_to_harmony` in responses/harmony.py, 0.17.0 on) gives two kinds of item no
channel, where the harmony format and later releases give them one:

- a `reasoning` item becomes an assistant message without a channel (0.15.1-0.17.x), read as
  `content[0]["text"]` after `assert len(content) == 1`: no content, `content: null` or two parts fail the request.
  0.18.0 joins the parts' texts, puts the message on the `analysis` channel, and converts a reasoning item
  without content to None (which the builder skips);
- a `function_call_output` item becomes a message from `functions.<name>` without a channel or recipient
  (0.15.1-0.21.x): the prompt says `<|start|>functions.get_weather<|message|>` where harmony's tool message, and
  0.22.0, say `<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>`.

One patch, not an extension of harmony_responses_input: that one backports vllm#44330 (system/developer items,
fixed in 0.23.0, G03) and its upstream detector looks for that fix; these are two other upstream changes with
their own fixing releases. One patch for both, not two: they are the same rule (every item the converter turns
into an assistant-side or tool message carries its harmony channel) in the same function, and a patch per
branch would rewrite one function twice. The reasoning rewrite is needed only before 0.18.0: from there the
codemod finds 0.18.0's branch and rewrites only the tool output (fixed_in is 0.22.0, the later of the two).
Reports: the harmony format's tool message (https://cookbook.openai.com/articles/openai-harmony) and G53 in
docs/known-issues.md; vllm#34499 is the content-less reasoning item's KeyError.
"""

import ast
from typing import TYPE_CHECKING

from gptoss_patch.patches import _shapes
from gptoss_patch.spec import Band, PackageView, PatchSpec, module_id

if TYPE_CHECKING:
    from gptoss_patch.patches._base import PatchCodemod

HARMONY_UTILS = "entrypoints/openai/parser/harmony_utils.py"  # parse_response_input, 0.15.1-0.16.x
RESPONSES_HARMONY = "entrypoints/openai/responses/harmony.py"  # response_input_to_harmony, 0.17.0 on
ITEM_CONVERTERS = ("parse_response_input", "response_input_to_harmony")  # one input item -> Message

# Whitespace-free code of the anchors (patches/_base.code).
TOOL_OUTPUT_BRANCH = 'response_msg["type"]=="function_call_output"'
REASONING_BRANCH = 'response_msg["type"]=="reasoning"'
TOOL_MESSAGE = ("Message.from_author_and_content", "Author.new(Role.TOOL,")  # `msg = <call>(<author>..., ...)`
STOCK_REASONING = (  # the reasoning branch of 0.15.1-0.17.x, statement by statement
    'content=response_msg["content"]',
    "assertlen(content)==1",
    'msg=Message.from_role_and_content(Role.ASSISTANT,content[0]["text"])',
)
ANALYSIS = 'msg=msg.with_channel("analysis")'  # in 0.18.0's reasoning branch (and ours)

MARK = "# gptoss-patch harmony_responses_channels:"
TOOL_OUTPUT_SOURCE = f"""
{MARK} a tool output goes to the assistant on commentary, as in vLLM 0.22.0.
msg = msg.with_channel("commentary")
msg = msg.with_recipient("assistant")
"""
REASONING_SOURCE = f"""
{MARK} reasoning goes on the analysis channel, as in vLLM 0.18.0.
content = response_msg.get("content")
if content and len(content) >= 1:
    reasoning_text = "\\n".join(item["text"] for item in content)
    msg = Message.from_role_and_content(Role.ASSISTANT, reasoning_text)
    msg = msg.with_channel("analysis")
else:
    return None
"""


def codemod() -> "type[PatchCodemod]":
    """Build the codemod class (imports libcst, so only apply/diff pay for it)."""
    import libcst as cst

    from gptoss_patch.patches._base import PatchCodemod, code, defines, parse_statements, small_statement

    def line(statement: cst.CSTNode) -> str:
        small = small_statement(statement)
        return code(small) if small is not None else ""

    def branches(function: cst.FunctionDef) -> list[cst.If]:
        """Every `if`/`elif` of the converter's top-level chains, in order."""
        found: list[cst.If] = []
        for statement in function.body.body:
            node: object = statement
            while isinstance(node, cst.If):
                found.append(node)
                node = node.orelse
        return found

    def is_tool_message(statement: cst.CSTNode) -> bool:
        """`msg = Message.from_author_and_content(Author.new(Role.TOOL, ...), ...)`, read by its parts: the call spans
        lines, and a comment between them is part of the call's code."""
        small = small_statement(statement)
        if not (isinstance(small, cst.Assign) and len(small.targets) == 1 and code(small.targets[0].target) == "msg"):
            return False
        call = small.value
        return (isinstance(call, cst.Call) and code(call.func) == TOOL_MESSAGE[0] and bool(call.args)
                and code(call.args[0].value).startswith(TOOL_MESSAGE[1]))

    def rewrite_tool_output(block: list[cst.BaseStatement]) -> list[cst.BaseStatement] | None:
        """The channel and recipient after the one tool message, if the block has it and sets neither."""
        at = [i for i, s in enumerate(block) if is_tool_message(s)]
        if len(at) != 1 or any(line(s).startswith("msg=msg.with_") for s in block[at[0] + 1 :]):
            return None
        return [*block[: at[0] + 1], *parse_statements(TOOL_OUTPUT_SOURCE), *block[at[0] + 1 :]]

    def rewrite_reasoning(block: list[cst.BaseStatement]) -> list[cst.BaseStatement] | None:
        """0.18.0's reasoning branch in place of 0.15.1-0.17.x's, if the block is that one exactly."""
        return list(parse_statements(REASONING_SOURCE)) if tuple(line(s) for s in block) == STOCK_REASONING else None

    def replace_branch(node: cst.CSTNode | None, old: cst.If, new: cst.If) -> cst.CSTNode | None:
        """The if/elif chain starting at `node` with `old` swapped for `new` (identity, not equality)."""
        if node is old:
            return new
        if not isinstance(node, cst.If):
            return node
        orelse = replace_branch(node.orelse, old, new)
        return node if orelse is node.orelse else node.with_changes(orelse=orelse)

    class HarmonyResponsesChannels(PatchCodemod):
        EXPECTED_HITS = 2  # the tool output and, before 0.18.0, the reasoning branch
        ANCHOR = (f"{' / '.join(ITEM_CONVERTERS)}: one function_call_output branch with one "
                  "`msg = Message.from_author_and_content(Author.new(Role.TOOL, ...), ...)`, and one reasoning branch "
                  "as 0.15.1-0.17.x have it (`assert len(content) == 1`) unless it sets the analysis channel (0.18.0 on)")

        def in_scope(self, statement: cst.BaseStatement) -> bool:
            return any(defines(statement, name) for name in ITEM_CONVERTERS)

        def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
            if updated.name.value not in ITEM_CONVERTERS:
                return updated
            function = updated
            for test, rewrite in ((TOOL_OUTPUT_BRANCH, rewrite_tool_output), (REASONING_BRANCH, rewrite_reasoning)):
                matching = [b for b in branches(function) if code(b.test) == test]
                if len(matching) != 1:
                    continue
                branch = matching[0]
                if rewrite is rewrite_reasoning and ANALYSIS in code(branch.body):
                    self.EXPECTED_HITS = 1  # 0.18.0 on: the reasoning branch is upstream's already
                    continue
                block = rewrite(list(branch.body.body))  # type: ignore[arg-type]
                if block is None:
                    continue
                self.hit()
                new = branch.with_changes(body=branch.body.with_changes(body=block))
                body = [replace_branch(s, branch, new) for s in function.body.body]
                function = function.with_changes(body=function.body.with_changes(body=body))
            return function

    return HarmonyResponsesChannels


def _branch(function: ast.AST, item_type: str) -> list[ast.If]:
    """The `if`/`elif` nodes of `function` that test `response_msg["type"] == item_type`."""
    return [n for n in ast.walk(function) if isinstance(n, ast.If) and isinstance(n.test, ast.Compare)
            and any(isinstance(c, ast.Constant) and c.value == item_type for c in n.test.comparators)]


def _sets(branch: ast.If, method: str, value: str) -> bool:
    """Whether the branch's own body (not its elif chain) calls `msg.<method>(value)`."""
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == method
               and [a.value for a in n.args if isinstance(a, ast.Constant)] == [value]
               for statement in branch.body for n in ast.walk(statement))


def _converts_with_channels(function: ast.AST) -> bool:
    """A tool output to the assistant on commentary, and reasoning on analysis (0.22.0's converter)."""
    tool_outputs, reasonings = _branch(function, "function_call_output"), _branch(function, "reasoning")
    return (len(tool_outputs) == 1 and _sets(tool_outputs[0], "with_channel", "commentary")
            and _sets(tool_outputs[0], "with_recipient", "assistant")
            and len(reasonings) == 1 and _sets(reasonings[0], "with_channel", "analysis"))


def _ours(source: str, function: ast.AST) -> bool:
    """Whether the function carries this patch's mark (a comment: only the source text has it)."""
    return MARK in (ast.get_source_segment(source, function) or "")


def is_applied(source: str, _package: PackageView) -> bool:
    converters = [f for name in ITEM_CONVERTERS for f in _shapes.functions(source, name)]
    return bool(converters) and all(_ours(source, f) and _converts_with_channels(f) for f in converters)


def fixed_upstream(package: PackageView) -> str | None:
    source = package.read_text(RESPONSES_HARMONY)
    if not source or '"assistant"' not in source:
        return None
    if any(not _ours(source, f) and _converts_with_channels(f) for f in _shapes.functions(source, ITEM_CONVERTERS[1])):
        return (f"the installed vLLM's {ITEM_CONVERTERS[1]} puts a tool output on commentary to the assistant and "
                f"reasoning on analysis ({RESPONSES_HARMONY}, as from 0.22.0)")
    return None


SPEC = PatchSpec(
    id=module_id(__name__),
    summary="Responses reasoning items render on `analysis`, tool outputs on `commentary` to the assistant, as in 0.22.0 (G53).",
    upstream=(
        "https://cookbook.openai.com/articles/openai-harmony",
        "https://github.com/vllm-project/vllm/pull/34499",
    ),
    bands=(
        Band(">=0.15.1,<0.17", HARMONY_UTILS),  # parse_response_input: both branches
        Band(">=0.17,<0.22", RESPONSES_HARMONY),  # response_input_to_harmony: both before 0.18.0, the tool output after
    ),
    codemod=codemod,
    is_applied=is_applied,
    fixed_upstream=fixed_upstream,
    fixed_in="0.22.0",
    note=(
        "Reasoning input items get the analysis channel as from 0.18.0 (several parts joined, none: no message, where "
        "stock failed the request); function_call_output items get `to=assistant` on the commentary channel as from "
        "0.22.0. On 0.15.1-0.17.x a reasoning item without content converts to None, which only the patched "
        "builder (harmony_responses_instructions) expects: apply both there."
    ),
    python_frontend=True,
    probe_needs_vocabulary=True,  # verify/probes/probe_harmony_responses_channels.py renders the converted items
)
