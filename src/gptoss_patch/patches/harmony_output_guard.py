"""Skip a token the harmony parser rejects when parsing a non-streaming gpt-oss output (known issue G05).

On 0.15.1-0.23.x a non-streaming Chat Completions request (and the `openai` tool parser) parses the
generated tokens with harmony_utils.parse_output_into_messages, which feeds each token to
`StreamableParser.process()` unguarded: one malformed token (e.g. `<|return|>` after `<|end|>`) raises
HarmonyError and the request fails with HTTP 500. From 0.24 that parse runs through
HarmonyParser.process_chunk (harmony_stream_guard's second band), which vLLM 0.32.0 guards: a token that
raises is skipped. This backports that skip to parse_output_into_messages, logging once per output.
The companion of harmony_stream_guard, whose file on these releases is the chat serving module.
Reports: https://github.com/vllm-project/vllm/issues/46464, https://github.com/vllm-project/vllm/issues/50690
"""

from typing import TYPE_CHECKING

from gptoss_patch.patches import _shapes, harmony_stream_guard
from gptoss_patch.spec import Band, PackageView, PatchSpec, module_id

if TYPE_CHECKING:
    from gptoss_patch.patches._base import PatchCodemod

FUNCTION = "parse_output_into_messages"
TARGET = "entrypoints/openai/parser/harmony_utils.py"
HELPER = "_gptoss_patch_harmony_output_process"
UNGUARDED = "parser.process(token_id)"  # the per-token call, whitespace removed (patches/_base.code)

GUARD_SOURCE = f"""
# gptoss-patch harmony_output_guard: skip a rejected token, keep parsing (as vLLM 0.32.0).
if not {HELPER}(parser, token_id):
    continue
"""

HELPER_SOURCE = f'''
def {HELPER}(parser, token_id):
    """gptoss-patch harmony_output_guard: feed one token to the harmony parser; False if it was rejected.

    A rejected token raises HarmonyError, which used to fail the whole non-streaming request (G05). It
    is skipped instead, as vLLM's HarmonyParser.process_chunk does from 0.32.0; the first skipped token
    of each parser is logged.
    """
    from openai_harmony import HarmonyError

    try:
        parser.process(token_id)
    except HarmonyError as exc:
        if not getattr(parser, "_gptoss_patch_skipped", False):
            parser._gptoss_patch_skipped = True
            from vllm.logger import init_logger

            init_logger(__name__).warning(
                "gptoss-patch harmony_output_guard: skipped token %s that the harmony parser rejected (%s); "
                "later rejected tokens of this output are skipped without logging",
                token_id,
                exc,
            )
        return False
    return True
'''


def codemod() -> "type[PatchCodemod]":
    """Build the codemod class (imports libcst, so only apply/diff pay for it)."""
    import libcst as cst

    from gptoss_patch.patches._base import PatchCodemod, code, defines, parse_statements, small_statement

    def is_unguarded_call(statement: cst.CSTNode) -> bool:
        small = small_statement(statement)
        return isinstance(small, cst.Expr) and code(small.value) == UNGUARDED

    class HarmonyOutputGuard(PatchCodemod):
        ANCHOR = f"the per-token `{UNGUARDED}` loop in {FUNCTION}"
        HELPER_SOURCE = HELPER_SOURCE

        def in_scope(self, statement: cst.BaseStatement) -> bool:
            return defines(statement, FUNCTION)

        def leave_For(self, original: cst.For, updated: cst.For) -> cst.For:
            body = list(updated.body.body)
            at = [i for i, s in enumerate(body) if is_unguarded_call(s)]
            if code(updated.target) != "token_id" or len(at) != 1:
                return updated
            self.hit()
            body[at[0] : at[0] + 1] = parse_statements(GUARD_SOURCE)
            return updated.with_changes(body=updated.body.with_changes(body=body))

    return HarmonyOutputGuard


def is_applied(source: str, _package: PackageView) -> bool:
    return _shapes.top_level_function(source, HELPER) and any(
        _shapes.calls(f, HELPER) for f in _shapes.functions(source, FUNCTION)
    )


def fixed_upstream(package: PackageView) -> str | None:
    """From 0.24 the non-streaming parse is HarmonyParser.parse -> process_chunk, which skips rejected tokens from 0.32.0."""
    reason = harmony_stream_guard.fixed_upstream(package)
    return f"{reason} (the non-streaming parse goes through it too)" if reason else None


SPEC = PatchSpec(
    id=module_id(__name__),
    summary="A token the harmony parser rejects is skipped (logged once) when a non-streaming gpt-oss output is "
    "parsed, instead of failing the request (G05).",
    upstream=(
        "https://github.com/vllm-project/vllm/issues/46464",
        "https://github.com/vllm-project/vllm/issues/50690",
    ),
    bands=(Band(">=0.15.1,<0.24", TARGET),),  # harmony_utils.parse_output_into_messages; gone from 0.24.0
    codemod=codemod,
    is_applied=is_applied,
    fixed_upstream=fixed_upstream,
    fixed_in="0.32.0",
    reads=(harmony_stream_guard.PARSER_MODULE,),
    note=(
        "Covers parse_output_into_messages (non-streaming chat output, the openai tool parser) on 0.15.1-0.23.x; a "
        "skipped token produces no output, as upstream 0.32.0. 0.24.0-0.31.x parse non-streaming output through "
        "HarmonyParser, which harmony_stream_guard guards; stock 0.32.0+ skips such tokens itself."
    ),
    python_frontend=True,
)
