"""Return the raw tail of a gpt-oss output that ends inside a message header as content (known issue G44).

A non-streaming Chat Completions output that ends while the harmony parser is still reading a message header
(a malformed final turn, `<|channel|>final` with no `<|message|>`, or an output cut off there) is parsed to
`content: null` with `finish_reason: "stop"` and non-zero completion tokens: the tokens of that message are
silently dropped. vLLM 0.25.0's HarmonyParser.flush() (vllm#46437, vllm#47062) calls `process_eos()` at the end
of the output and, when harmony raises there, returns the decoded tokens since the last completed message as
final content, logging a warning. This backports that end-of-output recovery: on 0.15.1-0.23.x to the harmony
branch of the chat serving module's non-streaming generator (after parse_chat_output and the tool parser), on
0.24.x to HarmonyParser.parse, which there also starts a fresh parser afterwards, as flush() does.
Reports: https://github.com/vllm-project/vllm/issues/45736, https://github.com/vllm-project/vllm/pull/47062
"""

import ast
from typing import TYPE_CHECKING

from gptoss_patch.patches import _shapes
from gptoss_patch.spec import Band, PackageView, PatchSpec, module_id

if TYPE_CHECKING:
    from gptoss_patch.patches._base import PatchCodemod

SERVING_TARGET = "entrypoints/openai/chat_completion/serving.py"  # chat_completion_full_generator, 0.15.1-0.23.x
PARSER_TARGET = "parser/harmony.py"  # HarmonyParser.parse, 0.24.x (flush() from 0.25.0)
GENERATOR = "chat_completion_full_generator"
PARSE = "parse"
PARSE_CHAT_OUTPUT = "reasoning,content,_=parse_chat_output(token_ids)"  # whitespace removed (patches/_base.code)
TOOL_PARSER_TEST = "self.tool_parserisnotNone"  # `self.tool_parser is not None`, whitespace removed
OPEN_MESSAGE_TEST = "self.current_channel is not None"  # the first operand of 0.24's open-message check
RAW_TAIL = "_gptoss_patch_raw_tail"
WITH_RAW_TAIL = "_gptoss_patch_with_raw_tail"
FLUSH = "_gptoss_patch_flush"
MARK = "# gptoss-patch harmony_final_flush:"

SERVING_SOURCE = f"""
{MARK} an output that ends inside a message header keeps its raw tail as content (vLLM 0.25.0).
message.content = {WITH_RAW_TAIL}(message.content, token_ids, tokenizer)
"""

PARSER_SOURCE = f"""
{MARK} process_eos(), the raw tail of a non-terminal end as content, a fresh parser (vLLM 0.25.0's flush()).
content_parts.extend({FLUSH}(self, model_output_token_ids))
"""

RAW_TAIL_SOURCE = f'''
def {RAW_TAIL}(token_ids, tokenizer):
    """gptoss-patch harmony_final_flush: the decoded tokens since the last completed message, if the output ends
    in a state where harmony's process_eos() raises (inside a message header); None otherwise.

    vLLM 0.25.0's HarmonyParser.flush() returns exactly this text as final content (and logs a warning) instead of
    dropping it (G44). The tokens are replayed through a fresh assistant parser; a token harmony rejects is skipped,
    which only a guarded parse (harmony_output_guard, harmony_stream_guard) gets past.
    """
    from openai_harmony import HarmonyError

    from vllm.entrypoints.openai.parser.harmony_utils import get_encoding, get_streamable_parser_for_assistant

    parser = get_streamable_parser_for_assistant()
    tail = []
    for token_id in token_ids:
        completed = len(parser.messages)
        try:
            parser.process(token_id)
        except HarmonyError:
            continue
        if len(parser.messages) > completed:
            tail.clear()
        else:
            tail.append(token_id)
    try:
        parser.process_eos()
    except HarmonyError:
        from vllm.logger import init_logger

        init_logger(__name__).warning(
            "gptoss-patch harmony_final_flush: the harmony parser ended in a non-terminal state; returning the "
            "recovered raw output (as vLLM 0.25.0)"
        )
        return (tokenizer if tokenizer is not None else get_encoding()).decode(tail)
    return None
'''

WITH_RAW_TAIL_SOURCE = f'''
def {WITH_RAW_TAIL}(content, token_ids, tokenizer):
    """gptoss-patch harmony_final_flush: `content`, with the raw tail of a non-terminal end appended as 0.25.0 joins
    content parts ("\\n"); `content` itself when the output ends cleanly."""
    raw = {RAW_TAIL}(token_ids, tokenizer)
    if not raw:
        return content
    return f"{{content}}\\n{{raw}}" if content else raw
'''

FLUSH_SOURCE = f'''
def {FLUSH}(harmony_parser, token_ids):
    """gptoss-patch harmony_final_flush: vLLM 0.25.0's HarmonyParser.flush() at the end of parse(): the content parts
    to add (the raw tail when process_eos() raises, else none), then a fresh parser for the next parse()."""
    from openai_harmony import HarmonyError

    from vllm.entrypoints.openai.parser.harmony_utils import get_streamable_parser_for_assistant

    raw = None
    try:
        harmony_parser._harmony_parser.process_eos()
    except HarmonyError:
        raw = {RAW_TAIL}(token_ids, harmony_parser.model_tokenizer)
    harmony_parser._harmony_parser = get_streamable_parser_for_assistant()
    harmony_parser._num_processed_messages = 0
    return [raw] if raw else []
'''


def codemod() -> "type[PatchCodemod]":
    """Build the codemod class (imports libcst, so only apply/diff pay for it)."""
    import libcst as cst

    from gptoss_patch.patches._base import PatchCodemod, code, parse_statements, small_statement

    def is_statement(statement: cst.CSTNode, text: str) -> bool:
        small = small_statement(statement)
        return small is not None and code(small) == text

    def is_if(statement: cst.CSTNode, test: str) -> bool:
        return isinstance(statement, cst.If) and code(statement.test) == test

    def opens_with(statement: cst.CSTNode, operand: str) -> bool:
        """`if (self.current_channel is not None or ...)`: 0.24's check for the message left open."""
        if not isinstance(statement, cst.If) or not isinstance(statement.test, cst.BooleanOperation):
            return False
        first: cst.BaseExpression = statement.test
        while isinstance(first, cst.BooleanOperation):
            first = first.left
        return code(first) == "".join(operand.split())

    def calls_helper(block: cst.IndentedBlock, helper: str) -> bool:
        """The block already holds our call: a second pass finds no unpatched anchor (drift, never a double rewrite)."""
        return any(f"{helper}(" in code(s) for s in block.body if small_statement(s) is not None)

    def insert_after(block: cst.IndentedBlock, at: int, source: str) -> cst.IndentedBlock:
        body = list(block.body)
        body[at + 1 : at + 1] = parse_statements(source)
        return block.with_changes(body=body)

    class HarmonyFinalFlush(PatchCodemod):
        ANCHOR = (
            f"`if self.tool_parser is not None:` after `{PARSE_CHAT_OUTPUT}` in {GENERATOR} (<= 0.23), or the "
            f"open-message check at the end of HarmonyParser.{PARSE} (0.24)"
        )

        def in_scope(self, statement: cst.BaseStatement) -> bool:
            return isinstance(statement, cst.ClassDef) and statement.name.value in (
                "OpenAIServingChat",
                "HarmonyParser",
            )

        def member_in_scope(self, member: cst.BaseStatement) -> bool:
            return isinstance(member, cst.FunctionDef) and member.name.value in (GENERATOR, PARSE)

        def leave_If(self, original: cst.If, updated: cst.If) -> cst.If:
            """The harmony branch of the generator: `if self.use_harmony:` opening with parse_chat_output."""
            if code(updated.test) != "self.use_harmony" or not isinstance(updated.body, cst.IndentedBlock):
                return updated
            body = updated.body.body
            at = [i for i, s in enumerate(body) if is_if(s, TOOL_PARSER_TEST)]
            if not body or not is_statement(body[0], PARSE_CHAT_OUTPUT) or len(at) != 1:
                return updated
            if calls_helper(updated.body, WITH_RAW_TAIL):
                return updated
            self.hit()
            self.HELPER_SOURCE = RAW_TAIL_SOURCE + WITH_RAW_TAIL_SOURCE  # each band's file gets only what it calls
            return updated.with_changes(body=insert_after(updated.body, at[0], SERVING_SOURCE))

        def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
            """HarmonyParser.parse: after the open-message check, before the parts are joined."""
            if updated.name.value != PARSE or not isinstance(updated.body, cst.IndentedBlock):
                return updated
            at = [i for i, s in enumerate(updated.body.body) if opens_with(s, OPEN_MESSAGE_TEST)]
            if len(at) != 1 or calls_helper(updated.body, FLUSH):
                return updated
            self.hit()
            self.HELPER_SOURCE = RAW_TAIL_SOURCE + FLUSH_SOURCE
            return updated.with_changes(body=insert_after(updated.body, at[0], PARSER_SOURCE))

    return HarmonyFinalFlush


def is_applied(source: str, _package: PackageView) -> bool:
    if MARK not in source or not _shapes.top_level_function(source, RAW_TAIL):
        return False
    callers = {GENERATOR: WITH_RAW_TAIL, PARSE: FLUSH}
    return any(
        _shapes.top_level_function(source, helper)
        and any(_shapes.calls(f, helper) for f in _shapes.functions(source, name))
        for name, helper in callers.items()
    )


def _calls_method(node: ast.AST, name: str) -> bool:
    """Whether `node` contains a call of a method `name` (`x.name(...)`)."""
    return any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == name for n in ast.walk(node)
    )


def _recovers_in_flush(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """flush() calls process_eos() inside a `try` that handles HarmonyError (the shape of vllm#47062)."""
    return any(
        isinstance(node, ast.Try)
        and any(_calls_method(s, "process_eos") for s in node.body)
        and any(h.type is not None and "HarmonyError" in ast.unparse(h.type) for h in node.handlers)
        for node in ast.walk(function)
    )


def fixed_upstream(package: PackageView) -> str | None:
    """From 0.25.0 HarmonyParser.flush() recovers a non-terminal end (process_eos() raising) as raw final content."""
    source = package.read_text(PARSER_TARGET)
    if source and MARK not in source and any(_recovers_in_flush(f) for f in _shapes.functions(source, "flush")):
        return (
            f"HarmonyParser.flush() in the installed vllm/{PARSER_TARGET} returns the raw output of a parse that ends "
            "in a non-terminal state (vllm#47062)"
        )
    return None


SPEC = PatchSpec(
    id=module_id(__name__),
    summary="A non-streaming gpt-oss output that ends inside a message header (a malformed final turn) returns its "
    "raw tail as content, as vLLM 0.25.0 does, instead of `content: null` (G44).",
    upstream=(
        "https://github.com/vllm-project/vllm/issues/45736",
        "https://github.com/vllm-project/vllm/pull/47062",
    ),
    bands=(
        Band(">=0.15.1,<0.24", SERVING_TARGET),  # the harmony branch of chat_completion_full_generator
        Band(">=0.24,<0.25", PARSER_TARGET),  # HarmonyParser.parse
    ),
    codemod=codemod,
    is_applied=is_applied,
    fixed_upstream=fixed_upstream,
    fixed_in="0.25.0",
    note=(
        "Non-streaming Chat Completions only, as the issue: the content becomes the decoded tokens since the last "
        "completed message, special tokens included (e.g. '<|start|>assistant<|channel|>final The answer<|return|>'), "
        "exactly what 0.25.0 returns, and a warning is logged; finish_reason and usage are unchanged. Streaming "
        "output is not changed."
    ),
    python_frontend=True,
)
