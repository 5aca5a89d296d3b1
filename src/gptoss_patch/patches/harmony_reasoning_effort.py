"""Map `reasoning_effort` values that the API accepts but harmony does not to ones it does (known issue G11).

From 0.18.0 the request models accept more efforts than harmony's three (`low`, `medium`, `high`):
Chat Completions takes `none` from 0.18.0 and `minimal`, `xhigh`, `max` from 0.21.0, and the Responses
API takes whatever the installed `openai` package's `Reasoning` allows (`minimal` and `xhigh` in recent
ones). `harmony_utils.get_system_message` then fails on them: a bare `KeyError` (a 500) through 0.20.x, a
400 from 0.21.0, where vllm#40982 added `max` and the check. Clients that send `minimal` or `xhigh` (Codex, the Agents SDK, routers) get an error
from gpt-oss. 0.33.0 adds `--reasoning-effort-map` (off by default) to rewrite efforts before harmony; sglang's
router maps `minimal` to `low` for harmony models (sglang#12711).

The patch rewrites the effort at the top of `get_system_message` through a map, the same shape as
0.33.0's flag: `GPTOSS_PATCH_REASONING_EFFORT_MAP` (a JSON object) when set, else `minimal` → `low`,
`xhigh` → `high`, `max` → `high`. Efforts the map does not name pass through, so `low`/`medium`/`high`
render exactly as on stock, and the rest fail as on stock; `none` is not mapped by default (gpt-oss has no
"do not reason" setting); Chat Completions rejects it before harmony unless `harmony_reasoning_effort_none`
lets this map take it, which calls the helper below.
"""

from typing import TYPE_CHECKING

from gptoss_patch.patches import _shapes
from gptoss_patch.spec import Band, PackageView, PatchSpec, module_id

if TYPE_CHECKING:
    from gptoss_patch.patches._base import PatchCodemod

FUNCTION = "get_system_message"
PARAMETER = "reasoning_effort"
HELPER = "_gptoss_patch_reasoning_effort"
ENV = "GPTOSS_PATCH_REASONING_EFFORT_MAP"
TARGET = "entrypoints/openai/parser/harmony_utils.py"
# Where 0.33.0 defines the map it applies with --reasoning-effort-map.
UPSTREAM_MAP_FILE = "renderers/params.py"
UPSTREAM_MAP_FUNCTION = "map_reasoning_effort"
# The nearest effort harmony knows, for the values the request models accept beyond low/medium/high.
DEFAULT_MAP = {"minimal": "low", "xhigh": "high", "max": "high"}
# `if reasoning_effort is not None:`, whitespace removed: the first use of the effort in the function.
ANCHOR_TEST = "reasoning_effortisnotNone"

CALL_SOURCE = f"""
# gptoss-patch harmony_reasoning_effort: efforts harmony does not know are mapped to ones it does.
{PARAMETER} = {HELPER}({PARAMETER})
"""

HELPER_SOURCE = f'''
def {HELPER}(effort):
    """gptoss-patch harmony_reasoning_effort: rewrite an effort harmony rejects to one it accepts.

    The map is {ENV} when it is set (a JSON object, like vLLM 0.33's
    --reasoning-effort-map), else {DEFAULT_MAP!r}.
    Efforts it does not name pass through unchanged; '{{}}' maps nothing.
    """
    if effort is None:
        return None
    import json
    import os

    raw = os.environ.get("{ENV}")
    if raw is None:
        effort_map = {DEFAULT_MAP!r}
    else:
        try:
            effort_map = json.loads(raw)
        except ValueError as exc:
            raise ValueError(f"{ENV} is not valid JSON: {{exc}}") from None
        if not isinstance(effort_map, dict) or not all(isinstance(v, str) for v in effort_map.values()):
            raise ValueError("{ENV} must be a JSON object of strings, e.g. " + '{{"minimal": "low"}}')
    return effort_map.get(effort, effort)
'''


def codemod() -> "type[PatchCodemod]":
    """Build the codemod class (imports libcst, so only apply/diff pay for it)."""
    import libcst as cst

    from gptoss_patch.patches._base import PatchCodemod, code, defines, parse_statements, small_statement

    def takes_parameter(function: cst.FunctionDef) -> bool:
        params = function.params
        return any(p.name.value == PARAMETER for p in [*params.params, *params.kwonly_params])

    class HarmonyReasoningEffort(PatchCodemod):
        ANCHOR = f"{FUNCTION}({PARAMETER}=...): one `if {PARAMETER} is not None:`"
        HELPER_SOURCE = HELPER_SOURCE

        def in_scope(self, statement: cst.BaseStatement) -> bool:
            return defines(statement, FUNCTION)

        def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
            body = list(updated.body.body)
            at = [i for i, s in enumerate(body) if isinstance(s, cst.If) and code(s.test) == ANCHOR_TEST]
            patched = any(
                isinstance(s, cst.BaseStatement)
                and (small := small_statement(s)) is not None
                and code(small).startswith(f"{PARAMETER}={HELPER}(")
                for s in body
            )
            if updated.name.value != FUNCTION or len(at) != 1 or patched or not takes_parameter(updated):
                return updated
            self.hit()
            body[at[0] : at[0]] = parse_statements(CALL_SOURCE)
            return updated.with_changes(body=updated.body.with_changes(body=body))

    return HarmonyReasoningEffort


def is_applied(source: str, _package: PackageView) -> bool:
    return _shapes.top_level_function(source, HELPER) and any(
        _shapes.calls(f, HELPER) for f in _shapes.functions(source, FUNCTION)
    )


def fixed_upstream(package: PackageView) -> str | None:
    if package.defines(UPSTREAM_MAP_FILE, UPSTREAM_MAP_FUNCTION):
        return (
            f"{UPSTREAM_MAP_FILE} defines {UPSTREAM_MAP_FUNCTION} (vLLM 0.33.0): pass "
            "--reasoning-effort-map '{\"minimal\": \"low\", \"xhigh\": \"high\", \"max\": \"high\"}' "
            "(stock maps nothing by default)"
        )
    return None


SPEC = PatchSpec(
    id=module_id(__name__),
    summary="`reasoning_effort` values harmony rejects (minimal, xhigh, max) are mapped to low/high instead of failing (G11).",
    upstream=(
        "https://github.com/vllm-project/vllm/pull/40982",
        "https://github.com/sgl-project/sglang/pull/12711",
    ),
    bands=(Band(">=0.18.0,<0.33", TARGET),),
    codemod=codemod,
    is_applied=is_applied,
    fixed_upstream=fixed_upstream,
    fixed_in="0.33.0",
    reads=(UPSTREAM_MAP_FILE,),
    note=(
        f"Default map {DEFAULT_MAP}; set {ENV} (JSON, the shape of vLLM 0.33's --reasoning-effort-map) to choose "
        "another, or '{}' for stock behaviour. Requests with low/medium/high render exactly as on stock. From 0.33.0 "
        "use --reasoning-effort-map (stock maps nothing by default)."
    ),
    probe_needs_vocabulary=True,
    probe_runs_on=">=0.18.0,<0.33.0",
    python_frontend=True,
)
