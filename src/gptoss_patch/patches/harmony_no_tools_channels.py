"""Remove `commentary` from the valid harmony channels when no custom tools are given (known issue G04).

vLLM 0.15.x-0.16.x did this in `harmony_utils.get_system_message`; vllm#32114 (first in 0.17.0) dropped
the block, and through 0.33.0 the system message tells gpt-oss that `commentary` is valid in tool-less
requests. The model then sometimes opens commentary or tool-style headers and the harmony parser fails
("Unknown role", "Unexpected token ... start token 200006"). Report: https://github.com/tenstorrent/vllm/issues/386

Opt-in (SPEC.opt_in): the removal was deliberate. The harmony format declares all three channels and
uses `commentary` for preambles shown to users; the model's own chat template always lists all three;
and a Responses request with only built-in tools (browser, python, container) counts as tool-less
here, so the rule would also hide `commentary` from it. Applied only when named (--with, --only).
"""

import ast
from typing import TYPE_CHECKING

from gptoss_patch.patches import _shapes
from gptoss_patch.spec import Band, PackageView, PatchSpec, module_id

if TYPE_CHECKING:
    from gptoss_patch.patches._base import PatchCodemod

FUNCTION = "get_system_message"
PARAMETER = "with_custom_tools"
HELPER = "_gptoss_patch_without_commentary"
TARGET = "entrypoints/openai/parser/harmony_utils.py"
# `sys_msg = Message.from_role_and_content(Role.SYSTEM, sys_msg_content)`, whitespace removed: the
# system content is final here, so the restriction goes right before it.
ANCHOR_CODE = "sys_msg=Message.from_role_and_content(Role.SYSTEM,sys_msg_content)"

CALL_SOURCE = f"""
# gptoss-patch harmony_no_tools_channels: no custom tools, no `commentary` channel.
sys_msg_content = {HELPER}(sys_msg_content, {PARAMETER})
"""

HELPER_SOURCE = f'''
def {HELPER}(content, with_custom_tools):
    """gptoss-patch harmony_no_tools_channels: without custom tools, `commentary` is not a valid channel.

    vLLM before 0.17.0 did this in {FUNCTION} (vllm#32114 removed it). Without it gpt-oss may open
    commentary or tool headers in requests without tools, which the harmony parser rejects (G04).
    """
    if with_custom_tools or content.channel_config is None:
        return content
    from openai_harmony import ChannelConfig

    channels = [c for c in content.channel_config.valid_channels if c != "commentary"]
    return content.with_channel_config(ChannelConfig.require_channels(channels))
'''


def codemod() -> "type[PatchCodemod]":
    """Build the codemod class (imports libcst, so only apply/diff pay for it)."""
    import libcst as cst

    from gptoss_patch.patches._base import PatchCodemod, code, defines, parse_statements, small_statement

    def takes_parameter(function: cst.FunctionDef) -> bool:
        params = function.params
        return any(p.name.value == PARAMETER for p in [*params.params, *params.kwonly_params])

    class HarmonyNoToolsChannels(PatchCodemod):
        ANCHOR = f"{FUNCTION}({PARAMETER}=...): one `sys_msg = Message.from_role_and_content(...)`"
        HELPER_SOURCE = HELPER_SOURCE

        def in_scope(self, statement: cst.BaseStatement) -> bool:
            return defines(statement, FUNCTION)

        def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
            body = list(updated.body.body)
            codes = [code(small) if (small := small_statement(s)) is not None else "" for s in body]
            at = [i for i, c in enumerate(codes) if c == ANCHOR_CODE]
            patched = any(c.startswith(f"sys_msg_content={HELPER}(") for c in codes)
            if updated.name.value != FUNCTION or len(at) != 1 or patched or not takes_parameter(updated):
                return updated
            self.hit()
            body[at[0] : at[0]] = parse_statements(CALL_SOURCE)
            return updated.with_changes(body=updated.body.with_changes(body=body))

    return HarmonyNoToolsChannels


def is_applied(source: str, _package: PackageView) -> bool:
    return _shapes.top_level_function(source, HELPER) and any(
        _shapes.calls(f, HELPER) for f in _shapes.functions(source, FUNCTION)
    )


def _restricts_channels(function: ast.AST) -> bool:
    """An `if` on with_custom_tools that sets a channel config (the block vLLM had before 0.17.0)."""
    return any(
        isinstance(n, ast.If)
        and any(isinstance(x, ast.Name) and x.id == PARAMETER for x in ast.walk(n.test))
        and any(isinstance(x, ast.Attribute) and x.attr == "with_channel_config" for x in ast.walk(n))
        for n in ast.walk(function)
    )


def not_needed(source: str, _package: PackageView) -> str | None:
    if "with_channel_config" not in source:  # the restriction needs it; skip parsing the file
        return None
    if any(_restricts_channels(f) for f in _shapes.functions(source, FUNCTION)):
        return f"{FUNCTION} already removes `commentary` when no custom tools are given (stock vLLM before 0.17.0)"
    return None


SPEC = PatchSpec(
    id=module_id(__name__),
    summary="Without custom tools, `commentary` is not a valid harmony channel, as before vLLM 0.17.0 (G04).",
    upstream=(
        "https://github.com/vllm-project/vllm/pull/32114",
        "https://github.com/tenstorrent/vllm/issues/386",
        "https://github.com/vllm-project/vllm/pull/43408",
    ),
    bands=(Band(">=0.15.1", TARGET),),
    codemod=codemod,
    is_applied=is_applied,
    not_needed=not_needed,
    note=(
        "Reverts a deliberate upstream change: vllm#32114 (0.17.0) kept `commentary` valid so that preambles "
        "can be generated; no upstream release restores the restriction (checked through 0.33.0). "
        "vllm#43408 (open) tolerates the resulting malformed streams instead."
    ),
    stock_not_needed="<0.17.0",  # the restriction is still stock in 0.15.1 and 0.16.0
    opt_in=(
        "it departs from upstream on purpose: stock vLLM from 0.17.0, the model's chat template and vLLM's Rust "
        "renderer declare all three channels, and Responses requests with only built-in tools would lose preambles"
    ),
    python_frontend=True,
)
