"""Let the reasoning-effort map take `none` on Chat Completions, as vLLM 0.33.0's `--reasoning-effort-map` does (G11).

From 0.18.0 Chat Completions accepts `reasoning_effort: "none"`, and the harmony request builder rejects it
at once (`if (reasoning_effort := request.reasoning_effort) == "none": raise ValueError("Harmony does not
support reasoning_effort='none'")`, a 400), before `get_system_message`, where `harmony_reasoning_effort`
maps efforts. So `GPTOSS_PATCH_REASONING_EFFORT_MAP='{"none": "low"}'` could not take effect there. 0.33.0
maps first and then rejects a `none` that is left.

The patch changes only that check: it rejects `none` when the map leaves it `none`. The map is
`harmony_reasoning_effort`'s own, looked up through the helper that patch adds to harmony_utils
(`_gptoss_patch_reasoning_effort`); without that helper (that patch not applied) nothing is mapped and
`none` is rejected as on stock. The effort handed on is still the request's own: `get_system_message` maps
it, once (a chained map such as {"minimal": "low", "low": "medium"} applies one step, as on 0.33.0). The
check lives in `_make_request_with_harmony` of OpenAIServingRender (entrypoints/serve/render/serving.py,
0.18.0-0.24.0) and of OnlineRenderer (renderers/online_renderer.py, 0.25.0-0.32.0).
Reports: issue #23 (upstream's test_effort_map_applies_to_harmony with {"none": "low"}) and G11 in
docs/known-issues.md.
"""

from typing import TYPE_CHECKING

from gptoss_patch.patches import _shapes
from gptoss_patch.spec import Band, PackageView, PatchSpec, module_id

if TYPE_CHECKING:
    from gptoss_patch.patches._base import PatchCodemod

METHOD = "_make_request_with_harmony"
RENDER_TARGET = "entrypoints/serve/render/serving.py"  # OpenAIServingRender, 0.18.0-0.24.0
RENDERER_TARGET = "renderers/online_renderer.py"  # OnlineRenderer, 0.25.0 on
HELPER = "_gptoss_patch_effort_after_map"
MAP_HELPER = "_gptoss_patch_reasoning_effort"  # harmony_reasoning_effort's map, in harmony_utils
UPSTREAM_MAP_FUNCTION = "map_reasoning_effort"  # 0.33.0 maps with it before its `none` check
# `if (reasoning_effort := request.reasoning_effort) == "none":`, whitespace removed.
ANCHOR_TEST = '(reasoning_effort:=request.reasoning_effort)=="none"'
NEW_TEST = f'{HELPER}(reasoning_effort := request.reasoning_effort) == "none"'
MARK = "# gptoss-patch harmony_reasoning_effort_none"

HELPER_SOURCE = f'''
def {HELPER}(effort):
    """gptoss-patch harmony_reasoning_effort_none: the effort as the reasoning-effort map leaves it.

    The map is harmony_reasoning_effort's ({MAP_HELPER} in harmony_utils,
    which get_system_message applies); without it nothing is mapped. Only the `none` check reads this:
    the effort passed on is the request's, mapped once by get_system_message.
    """
    from vllm.entrypoints.openai.parser import harmony_utils as _hu

    effort_map = getattr(_hu, "{MAP_HELPER}", None)
    return effort if effort_map is None else effort_map(effort)
'''


def codemod() -> "type[PatchCodemod]":
    """Build the codemod class (imports libcst, so only apply/diff pay for it)."""
    import libcst as cst

    from gptoss_patch.patches._base import PatchCodemod, class_has_method, code, defines

    class HarmonyReasoningEffortNone(PatchCodemod):
        ANCHOR = f'{METHOD}: one `if (reasoning_effort := request.reasoning_effort) == "none":`'
        HELPER_SOURCE = HELPER_SOURCE

        def in_scope(self, statement: cst.BaseStatement) -> bool:
            return class_has_method(statement, METHOD)

        def member_in_scope(self, member: cst.BaseStatement) -> bool:
            return defines(member, METHOD)

        def leave_If(self, original: cst.If, updated: cst.If) -> cst.If:
            if code(updated.test) != ANCHOR_TEST:
                return updated
            self.hit()
            if not isinstance(updated.body, cst.IndentedBlock):  # `if x: raise` on one line: leave it unmarked
                return updated.with_changes(test=cst.parse_expression(NEW_TEST))
            header = updated.body.header
            if header.comment is None:  # mark the line, as the other patches mark theirs
                header = header.with_changes(whitespace=cst.SimpleWhitespace("  "), comment=cst.Comment(MARK))
            return updated.with_changes(test=cst.parse_expression(NEW_TEST), body=updated.body.with_changes(header=header))

    return HarmonyReasoningEffortNone


def is_applied(source: str, _package: PackageView) -> bool:
    return _shapes.top_level_function(source, HELPER) and any(_shapes.calls(f, HELPER) for f in _shapes.functions(source, METHOD))


def fixed_upstream(package: PackageView) -> str | None:
    source = package.read_text(RENDERER_TARGET)
    methods = _shapes.functions(source, METHOD) if source and UPSTREAM_MAP_FUNCTION in source else []
    if any(_shapes.calls(f, UPSTREAM_MAP_FUNCTION) for f in methods):
        return (
            f"{RENDERER_TARGET} maps the effort ({UPSTREAM_MAP_FUNCTION}) before rejecting `none` (vLLM 0.33.0): "
            "pass --reasoning-effort-map '{\"none\": \"low\"}' to map it"
        )
    return None


SPEC = PatchSpec(
    id=module_id(__name__),
    summary="`reasoning_effort: none` on Chat Completions is rejected only when the effort map leaves it `none` (G11).",
    upstream=("https://github.com/vllm-project/vllm/pull/40982",),
    bands=(
        Band(">=0.18.0,<0.25", RENDER_TARGET),  # OpenAIServingRender._make_request_with_harmony
        Band(">=0.25,<0.33", RENDERER_TARGET),  # OnlineRenderer._make_request_with_harmony
    ),
    codemod=codemod,
    is_applied=is_applied,
    fixed_upstream=fixed_upstream,
    fixed_in="0.33.0",
    note=(
        "Reads harmony_reasoning_effort's map (GPTOSS_PATCH_REASONING_EFFORT_MAP; no default entry for none), "
        "so '{\"none\": \"low\"}' renders Reasoning: low as on 0.33.0 with the same --reasoning-effort-map; "
        "unmapped, none is still a 400. Without harmony_reasoning_effort applied nothing changes."
    ),
    probe_needs_vocabulary=True,
    probe_runs_on=">=0.18.0,<0.25.0",  # 0.25+ renders through OnlineRenderer, which the probe's builder cannot call
    python_frontend=True,
)
