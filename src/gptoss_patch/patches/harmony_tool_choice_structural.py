"""Constrain gpt-oss to a harmony tool call for `tool_choice: "required"` or a named tool (known issue G52).

Before 0.27.0, Chat Completions with a tool parser accepts `required` and named choices for gpt-oss and then
constrains nothing: the harmony branch never calls the parser's `adjust_request`, and the stock gate applies a
grammar only once the final channel has begun, when the model has already chosen prose (vllm#44216). vLLM 0.27.0
(vllm#45560) gives HarmonyParser an `adjust_request` that builds a harmony structural tag: optional analysis and
commentary preambles, then only a `functions.*` call whose arguments match the tool's schema.

This patch gives 0.24.0-0.26.x's HarmonyParser the same method, with a tag builder of the project's own (the shape
of 0.27.0's, plus the recipient-first header openai_harmony renders), registered under a private key through the
release's own `register_vllm_structural_tag` and built through its `get_model_structural_tag` (tool dumping, named
choice to "forced", `auto` without a strict tool left alone). The grammar applies from the first generated token
of that request alone: `_grammar_from_tool_parser`, which those releases already pass on as `reasoning_ended=True`;
the reasoning parser's gate, and every other structured-output request, stay stock. The render site must call the
method: that is harmony_tool_choice_render, which does nothing without this patch.
Reports: https://github.com/vllm-project/vllm/issues/44216, https://github.com/vllm-project/vllm/pull/45560
"""

import ast
from typing import TYPE_CHECKING

from gptoss_patch.patches import _shapes
from gptoss_patch.spec import Band, PackageView, PatchSpec, module_id

if TYPE_CHECKING:
    from gptoss_patch.patches._base import PatchCodemod

TARGET = "parser/harmony.py"  # HarmonyParser, 0.24.0 on
PARSER_CLASS = "HarmonyParser"
METHOD = "adjust_request"
REGISTRY = "tool_parsers/structural_tag_registry.py"
REGISTRY_NAMES = ("register_vllm_structural_tag", "get_model_structural_tag", "_get_function_parameters")
PROTOCOL = "entrypoints/openai/chat_completion/protocol.py"  # declares the per-request flag
SERVING = "entrypoints/openai/chat_completion/serving.py"  # passes reasoning_ended=True when it is set
FLAG = "_grammar_from_tool_parser"
TAG_KEY = "gptoss_patch_harmony"  # private: xgrammar's builtin "harmony" template stays what it is
ADJUST = "_gptoss_patch_tool_choice"
BUILDER = "_gptoss_patch_tool_choice_tag"
COMPILES = "_gptoss_patch_tool_choice_compiles"
# Set on HarmonyParser: harmony_tool_choice_render calls adjust_request only where it is (never half a fix).
ADJUSTS = "gptoss_patch_adjusts_tool_choice"
MARK = "# gptoss-patch harmony_tool_choice_structural:"
UPSTREAM_REGISTRATION = 'register_vllm_structural_tag("harmony"'  # 0.27.0: ("harmony"); 0.33.0: ("harmony", builtin_tools=True)

METHOD_SOURCE = f'''
{MARK} required/named tool_choice constrained to a harmony tool call (vLLM 0.27.0).
{ADJUSTS} = True

def {METHOD}(self, request):
    return {ADJUST}(request)
'''

HELPER_SOURCE = f'''
{MARK} the harmony structural tag for required/named tool_choice (vllm#44216; vLLM 0.27.0).
import functools
_GPTOSS_PATCH_CHANNELS = ("commentary", "analysis", "final")
_GPTOSS_PATCH_CONSTRAINTS = (" json", " <|constrain|>json")
_GPTOSS_PATCH_MESSAGE_ENDS = ["<|end|>", "<|call|>", ""]  # "" is the EOS stop (<|return|>)
_gptoss_patch_failed_open = []
_gptoss_patch_failed_compile = []


def {BUILDER}(tools, builtin_tools, tool_choice, reasoning):
    """gptoss-patch harmony_tool_choice_structural: [analysis] [commentary preamble], then a call of one of `tools`
    whose arguments match its schema; for `auto` a final message too. None (the request stays stock) where the
    installed xgrammar lacks a format class, logged once."""
    try:
        from xgrammar import StructuralTag
        from xgrammar.structural_tag import (
            AnyTextFormat,
            ConstStringFormat,
            JSONSchemaFormat,
            OptionalFormat,
            OrFormat,
            SequenceFormat,
            TagFormat,
        )
    except ImportError as exc:
        if not _gptoss_patch_failed_open:
            _gptoss_patch_failed_open.append(exc)
            from vllm.logger import init_logger

            init_logger(__name__).warning(
                "gptoss-patch harmony_tool_choice_structural: this xgrammar lacks %s; required/named tool_choice is "
                "not constrained (stock behaviour)", exc
            )
        return None
    from vllm.tool_parsers.structural_tag_registry import _get_function_parameters

    def preamble(channel):
        message = TagFormat(begin=f"<|channel|>{{channel}}<|message|>", content=AnyTextFormat(), end="<|end|>")
        return OptionalFormat(content=SequenceFormat(elements=[message, ConstStringFormat(value="<|start|>assistant")]))

    def headers(name):
        for channel in _GPTOSS_PATCH_CHANNELS:
            for constraint in _GPTOSS_PATCH_CONSTRAINTS:
                yield f"<|channel|>{{channel}} to=functions.{{name}}{{constraint}}<|message|>"  # channel first
                yield f" to=functions.{{name}}<|channel|>{{channel}}{{constraint}}<|message|>"  # as openai_harmony renders

    choices = [
        TagFormat(begin=header, content=JSONSchemaFormat(json_schema=_get_function_parameters(tool.function)),
                  end=_GPTOSS_PATCH_MESSAGE_ENDS)
        for tool in tools
        for header in headers(tool.function.name)
    ]
    if tool_choice == "auto":
        choices += [TagFormat(begin=begin, content=AnyTextFormat(), end=_GPTOSS_PATCH_MESSAGE_ENDS)
                    for begin in ("<|channel|>final<|message|>", "<|channel|>final <|constrain|>json<|message|>")]
    if not choices:  # builtin tools only: none on Chat Completions
        return None
    return StructuralTag(format=SequenceFormat(elements=[preamble("analysis"), preamble("commentary"),
                                                         OrFormat(elements=choices)]))


@functools.lru_cache(maxsize=256)
def {COMPILES}(tag_json):
    """gptoss-patch harmony_tool_choice_structural: whether xgrammar can build the tag's grammar, once per tag. A tool
    whose parameters are no JSON schema it reads makes xgrammar raise RuntimeError; such a request stays stock
    (unconstrained, as before the patch) instead of the guidance fallback's KeyError (a 500, as on 0.27.0)."""
    import xgrammar

    try:
        xgrammar.Grammar.from_structural_tag(tag_json)
    except RuntimeError as exc:
        from vllm.logger import init_logger

        logger = init_logger(__name__)
        log = logger.debug if _gptoss_patch_failed_compile else logger.warning  # warn once, then quiet
        _gptoss_patch_failed_compile.append(True)
        log("gptoss-patch harmony_tool_choice_structural: xgrammar cannot build the tool_choice tag (%s); such a "
            "request is not constrained (stock behaviour)", str(exc).strip())
        return False
    return True


def {ADJUST}(request):
    """gptoss-patch harmony_tool_choice_structural: HarmonyParser.adjust_request. A request whose tool_choice needs a
    call gets the tag as its only output constraint, applied from the first token for that request alone."""
    from vllm import envs
    from vllm.sampling_params import StructuredOutputsParams
    from vllm.tool_parsers.structural_tag_registry import get_model_structural_tag

    if not request.tools or request.tool_choice in (None, "none") or not envs.VLLM_ENFORCE_STRICT_TOOL_CALLING:
        return request
    tag = get_model_structural_tag(model="{TAG_KEY}", tools=request.tools, tool_choice=request.tool_choice,
                                   reasoning=False)
    if tag is None:  # auto without a strict tool, or xgrammar without the format classes: stock
        return request
    tag_json = json.dumps(tag.model_dump())
    if not {COMPILES}(tag_json):  # a schema xgrammar rejects: stock (unconstrained), not 0.27.0's 500
        return request
    request.structured_outputs = StructuredOutputsParams(structural_tag=tag_json)
    if isinstance(request, ChatCompletionRequest):
        request.response_format = None
        # OpenAIServingChat passes reasoning_ended=True for this request: the tag covers the analysis channel.
        request.{FLAG} = True
    else:
        request.text = None
    return request


def _gptoss_patch_register():
    from vllm.tool_parsers.structural_tag_registry import register_vllm_structural_tag

    register_vllm_structural_tag("{TAG_KEY}")({BUILDER})


_gptoss_patch_register()
'''


def codemod() -> "type[PatchCodemod]":
    """Build the codemod class (imports libcst, so only apply/diff pay for it)."""
    import libcst as cst

    from gptoss_patch.patches._base import Drift, PatchCodemod, class_has_method, parse_statements

    def unindented_blank_lines(statement: cst.BaseStatement) -> cst.BaseStatement:
        """Blank lines inside a class carry no indentation (libcst would repeat the members' indent on them)."""
        assert isinstance(statement, (cst.SimpleStatementLine, cst.BaseCompoundStatement))
        lines = [line.with_changes(indent=False) if line.comment is None else line for line in statement.leading_lines]
        return statement.with_changes(leading_lines=lines)

    class HarmonyToolChoiceStructural(PatchCodemod):
        ANCHOR = f"class {PARSER_CLASS} without an {METHOD} of its own"

        def rewrite(self, tree: cst.Module) -> cst.Module:
            missing = _missing_support(self.package)
            if missing:
                raise Drift(f"{missing}: the tag would apply too late or not at all")
            return super().rewrite(tree)

        def in_scope(self, statement: cst.BaseStatement) -> bool:
            if not isinstance(statement, cst.ClassDef) or statement.name.value != PARSER_CLASS:
                return False
            if class_has_method(statement, METHOD):
                return False  # a second pass, or another fix: never a second method
            self._last = statement.body.body[-1]
            return True

        def member_in_scope(self, member: cst.BaseStatement) -> bool:
            return member is self._last

        def leave_FunctionDef(
            self, original: cst.FunctionDef, updated: cst.FunctionDef
        ) -> cst.FunctionDef | cst.FlattenSentinel[cst.BaseStatement]:
            if original is not self._last:
                return updated
            self.hit()
            self.HELPER_SOURCE = HELPER_SOURCE
            return cst.FlattenSentinel([updated, *map(unindented_blank_lines, parse_statements(METHOD_SOURCE, 1))])

    return HarmonyToolChoiceStructural


def _missing_support(package: PackageView) -> str | None:
    """What of the release's own machinery the patch builds on is absent (None: all there)."""
    for name in REGISTRY_NAMES:
        if not package.defines(REGISTRY, name):
            return f"vllm/{REGISTRY} defines no {name}"
    if FLAG not in (package.read_text(PROTOCOL) or ""):
        return f"vllm/{PROTOCOL} declares no ChatCompletionRequest.{FLAG}"
    if f"request.{FLAG}" not in (package.read_text(SERVING) or ""):
        return f"vllm/{SERVING} never reads request.{FLAG}"
    return None


def _parser_class(source: str) -> ast.ClassDef | None:
    tree = _shapes.parse(source)
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == PARSER_CLASS), None) if tree else None


def _own_method(cls: ast.ClassDef) -> bool:
    return any(isinstance(m, ast.FunctionDef) and m.name == METHOD for m in cls.body)


def is_applied(source: str, _package: PackageView) -> bool:
    if MARK not in source or not _shapes.top_level_function(source, ADJUST):
        return False
    cls = _parser_class(source)
    return (
        cls is not None
        and _own_method(cls)
        and _shapes.top_level_function(source, BUILDER)
        and f'register_vllm_structural_tag("{TAG_KEY}")' in source
    )


def fixed_upstream(package: PackageView) -> str | None:
    """From 0.27.0 HarmonyParser has its own adjust_request and parser/harmony.py registers a "harmony" tag."""
    source = package.read_text(TARGET)
    if not source or MARK in source or UPSTREAM_REGISTRATION not in source:
        return None
    cls = _parser_class(source)
    if cls is not None and _own_method(cls):
        return (
            f"vllm/{TARGET} registers its own harmony structural tag and HarmonyParser.adjust_request applies it "
            "to required/named tool_choice (vllm#45560)"
        )
    return None


SPEC = PatchSpec(
    id=module_id(__name__),
    summary='HarmonyParser.adjust_request constrains `tool_choice: "required"` or a named tool to a harmony tool '
    "call from the first token, as vLLM 0.27.0 does, instead of ignoring it (G52; with harmony_tool_choice_render).",
    upstream=(
        "https://github.com/vllm-project/vllm/issues/44216",
        "https://github.com/vllm-project/vllm/pull/45560",
    ),
    bands=(Band(">=0.24,<0.27", TARGET),),
    codemod=codemod,
    is_applied=is_applied,
    fixed_upstream=fixed_upstream,
    fixed_in="0.27.0",
    after=("harmony_final_flush", "harmony_stream_guard"),  # same file, other members: order only
    reads=(REGISTRY, PROTOCOL, SERVING),
    probe_runs_on=">=0.24,<0.27",  # it calls our method on a HarmonyParser built without a tokenizer: not upstream's
    note=(
        "Chat Completions with --tool-call-parser openai: required/named tool_choice (and auto with a strict tool) "
        "constrain generation to [analysis] [commentary] then a functions.* call matching the schema; a "
        "response_format sent with them is dropped, as in 0.27.0. Not bounded: the analysis length (max_tokens can "
        "still end a request there). Unchanged: auto without strict tools, VLLM_ENFORCE_STRICT_TOOL_CALLING=0, other "
        "output constraints, the Responses API (required/named still raise NotImplementedError there). The tag is "
        "xgrammar's format: an explicit guidance backend cannot read it (as on 0.27.0). Takes effect only with "
        "harmony_tool_choice_render."
    ),
    python_frontend=True,
)
