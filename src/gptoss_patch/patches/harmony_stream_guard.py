"""Skip a token the harmony parser rejects instead of aborting the gpt-oss stream (known issue G05).

The streaming path feeds each generated token to `StreamableParser.process()` unguarded, so one
malformed token (e.g. `<|return|>` after `<|end|>`) raises HarmonyError out of the generator and the
request dies with HTTP 500/503. vLLM 0.32.0 skips such a token; this backports that, logging once.
Before 0.24 the non-streaming parse (harmony_utils.parse_output_into_messages) lives in another file,
which a band of this patch cannot also edit: the companion patch harmony_output_guard guards it there. 0.33.0's own
tests of the fix pass on patched 0.24.0 and 0.31.0, both ends of the HarmonyParser band (tests/test_upstream_parity.py).
Reports: https://github.com/vllm-project/vllm/issues/46464, https://github.com/vllm-project/vllm/issues/50690
"""

import ast
from typing import TYPE_CHECKING

from gptoss_patch.patches import _shapes
from gptoss_patch.spec import Band, PackageView, PatchSpec, module_id

if TYPE_CHECKING:
    from gptoss_patch.patches._base import PatchCodemod

HELPER = "_gptoss_patch_harmony_process"
# Where the per-token call lives: the chat stream generator (<= 0.23), HarmonyParser (0.24+).
FUNCTIONS = ("chat_completion_stream_generator", "process_chunk")
# The unguarded call, whitespace removed, in each band; its receiver is passed to the helper.
UNGUARDED = {
    "harmony_parser.process(token_id)": "harmony_parser",  # <= 0.23
    "self._harmony_parser.process(token_id)": "self._harmony_parser",  # 0.24-0.31
}
PARSER_MODULE = "parser/harmony.py"

GUARD_SOURCE = """
# gptoss-patch harmony_stream_guard: skip a rejected token, keep streaming.
if not {helper}({receiver}, token_id):
    continue
"""

HELPER_SOURCE = f'''
def {HELPER}(parser, token_id):
    """gptoss-patch harmony_stream_guard: feed one token to the harmony parser; False if it was rejected.

    A rejected token raises HarmonyError, which used to abort the whole stream (G05). It is skipped
    instead, as vLLM does from 0.32.0; the first skipped token of each parser is logged.
    """
    from openai_harmony import HarmonyError

    try:
        parser.process(token_id)
    except HarmonyError as exc:
        if not getattr(parser, "_gptoss_patch_skipped", False):
            parser._gptoss_patch_skipped = True
            from vllm.logger import init_logger

            init_logger(__name__).warning(
                "gptoss-patch harmony_stream_guard: skipped token %s that the harmony parser rejected (%s); "
                "later rejected tokens of this stream are skipped without logging",
                token_id,
                exc,
            )
        return False
    return True
'''


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

    def unguarded_call(statement: cst.CSTNode) -> str | None:
        """The receiver of an unguarded `<parser>.process(token_id)` statement, else None."""
        small = small_statement(statement)
        return UNGUARDED.get(code(small.value)) if isinstance(small, cst.Expr) else None

    class HarmonyStreamGuard(PatchCodemod):
        ANCHOR = "the per-token `harmony_parser.process(token_id)` in the harmony stream loop"
        HELPER_SOURCE = HELPER_SOURCE

        def in_scope(self, statement: cst.BaseStatement) -> bool:
            return any(class_has_method(statement, f) for f in FUNCTIONS)

        def member_in_scope(self, member: cst.BaseStatement) -> bool:
            return any(defines(member, f) for f in FUNCTIONS)

        def leave_For(self, original: cst.For, updated: cst.For) -> cst.For:
            body = list(updated.body.body)
            at = [i for i, s in enumerate(body) if unguarded_call(s)]
            if code(updated.target) != "token_id" or len(at) != 1:
                return updated
            self.hit()
            guard = GUARD_SOURCE.format(helper=HELPER, receiver=unguarded_call(body[at[0]]))
            body[at[0] : at[0] + 1] = parse_statements(guard)
            return updated.with_changes(body=updated.body.with_changes(body=body))

    return HarmonyStreamGuard


def is_applied(source: str, _package: PackageView) -> bool:
    return _shapes.top_level_function(source, HELPER) and any(
        _shapes.calls(f, HELPER) for name in FUNCTIONS for f in _shapes.functions(source, name)
    )


def _calls_process(statements: list[ast.stmt]) -> bool:
    calls = [c for s in statements for c in ast.walk(s) if isinstance(c, ast.Call)]
    return any(isinstance(c.func, ast.Attribute) and c.func.attr == "process" for c in calls)


def _skips_rejected_tokens(function: ast.AST) -> bool:
    """A `try:` around `.process(...)` whose handler catches HarmonyError (vLLM 0.32.0's shape)."""
    return any(
        isinstance(n, ast.Try)
        and _calls_process(n.body)
        and any(h.type is not None and "HarmonyError" in ast.unparse(h.type) for h in n.handlers)
        for n in ast.walk(function)
    )


def fixed_upstream(package: PackageView) -> str | None:
    source = package.read_text(PARSER_MODULE)
    if source and any(_skips_rejected_tokens(f) for f in _shapes.functions(source, "process_chunk")):
        return f"HarmonyParser.process_chunk in the installed vllm/{PARSER_MODULE} skips tokens harmony rejects"
    return None


SPEC = PatchSpec(
    id=module_id(__name__),
    summary="A token the harmony parser rejects is skipped (logged once), not aborting the gpt-oss stream (G05).",
    upstream=(
        "https://github.com/vllm-project/vllm/issues/46464",
        "https://github.com/vllm-project/vllm/issues/50690",
        "https://github.com/vllm-project/vllm/pull/47350",
        "https://github.com/vllm-project/vllm/pull/52055",
    ),
    bands=(
        Band(">=0.15.1,<0.24", "entrypoints/openai/chat_completion/serving.py"),  # the chat stream generator
        Band(">=0.24,<0.32", PARSER_MODULE),  # HarmonyParser.process_chunk
    ),
    codemod=codemod,
    is_applied=is_applied,
    fixed_upstream=fixed_upstream,
    fixed_in="0.32.0",
    note=(
        "Covers the Chat Completions stream (from 0.24 via HarmonyParser.process_chunk, which the Responses API "
        "also uses from 0.25); a skipped token produces no output, as upstream 0.32.0. Before 0.24 the non-streaming "
        "parse (harmony_utils) is guarded by harmony_output_guard (G05)."
    ),
    probe_needs_vocabulary=True,
    probe_runs_on="<0.32",  # 0.32+ has no helper to call, and HarmonyParser needs a tokenizer to build
    python_frontend=True,
)
