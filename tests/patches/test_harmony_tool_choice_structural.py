"""harmony_tool_choice_structural: HarmonyParser.adjust_request constrains required/named tool_choice (G52).

Snippets are hand-written in the shape of `class HarmonyParser` (parser/harmony.py, 0.24.0-0.26.x: its last member
is `process_chunk` in 0.24.x, `_normalize_recipient` from 0.25.0) and of the registry, protocol and serving lines
the patch builds on. What the method does is checked by 0.27.0's own TestAdjustRequest on patched 0.25.0
(tests/test_upstream_parity.py); the render call that reaches it is harmony_tool_choice_render's.
"""

from __future__ import annotations

from functools import partial

import pytest
from packaging.version import Version

from gptoss_patch import engine
from gptoss_patch.patches.harmony_tool_choice_structural import (
    ADJUST,
    BUILDER,
    HELPER_SOURCE,
    MARK,
    METHOD_SOURCE,
    PROTOCOL,
    REGISTRY,
    SERVING,
    SPEC,
    TAG_KEY,
    TARGET,
    fixed_upstream,
    is_applied,
)
from gptoss_patch.spec import Selection
from gptoss_patch.versions import KNOWN_RELEASES
from tests.patches.helpers import status_on_fake_site, wheel_source
from tests.support import tools

SUPPORT = {  # what 0.24.0-0.26.x have and the patch builds on (drift without it)
    REGISTRY: """\
        def register_vllm_structural_tag(model):
            pass
        def get_model_structural_tag(model, tools, tool_choice, reasoning):
            pass
        def _get_function_parameters(function):
            pass
    """,
    PROTOCOL: """\
        class ChatCompletionRequest:
            _grammar_from_tool_parser: bool = PrivateAttr(default=False)
    """,
    SERVING: """\
        class OpenAIServingChat:
            async def create_chat_completion(self, request):
                if request._grammar_from_tool_parser:
                    reasoning_ended = True
    """,
}
check = partial(tools.check_transformed, spec=SPEC, package_files=SUPPORT)
check_drift = partial(tools.check_drift, spec=SPEC, package_files=SUPPORT)

PARSER = """\
from vllm.parser.abstract_parser import DelegatingParser


class HarmonyParser(DelegatingParser):
    def __init__(self, tokenizer, tools=None, *args, **kwargs):
        super().__init__(tokenizer, tools, *args, **kwargs)

    def process_chunk(self, token_ids):
        return None
"""
# 0.25.0-0.26.x: a static method is the class's last member
PARSER_025 = PARSER.replace(
    "        return None\n", "        return None\n\n    @staticmethod\n    def _normalize_recipient(recipient):\n        return recipient\n"
)


def patched(source: str) -> str:
    """`source` as the codemod leaves it: the method after the class's last member, the helpers at the end."""
    method = "".join(f"    {line}\n" if line else "\n" for line in METHOD_SOURCE.splitlines())
    return source + method + "\n\n" + HELPER_SOURCE.lstrip("\n")


# What vllm#45560 makes of it (0.27.0; 0.33.0 registers with builtin_tools=True): not our MARK.
UPSTREAM_FIX = (
    PARSER
    + "\n    def adjust_request(self, request):\n        return super().adjust_request(request)\n\n\n"
    + '@register_vllm_structural_tag("harmony")\ndef get_harmony_structural_tag(tools, builtin_tools, tool_choice, '
    "reasoning):\n    pass\n"
)


@pytest.mark.parametrize("parser", [PARSER, PARSER_025], ids=["0.24-process_chunk-last", "0.25-staticmethod-last"])
def test_adds_adjust_request_and_the_registered_builder(parser, tmp_path):
    check(parser, patched(parser), tmp_path=tmp_path)


def test_the_helpers_register_a_private_key_and_set_the_per_request_flag():
    assert f'register_vllm_structural_tag("{TAG_KEY}")({BUILDER})' in HELPER_SOURCE
    assert 'register_vllm_structural_tag("harmony")' not in HELPER_SOURCE  # xgrammar's builtin stays untouched
    assert "request._grammar_from_tool_parser = True" in HELPER_SOURCE
    assert "is_reasoning_end" not in HELPER_SOURCE  # the global gate is not changed
    assert f"return {ADJUST}(request)" in METHOD_SOURCE


def test_the_helpers_compile_and_copy_nothing_but_call_vllm_by_name():
    compile(HELPER_SOURCE, "helper", "exec")
    assert "except ImportError" in HELPER_SOURCE  # fails open where xgrammar lacks a format class


@pytest.mark.parametrize(
    "source, message",
    [
        pytest.param(PARSER.replace("class HarmonyParser", "class OtherParser"), "not found", id="class-renamed"),
        pytest.param(
            PARSER.replace("    def process_chunk", "    def adjust_request(self, request):\n        pass\n\n    def x"),
            "not found",
            id="own-adjust-request",
        ),
        pytest.param(PARSER.replace("        return None\n", "        return None\n\n    X = 1\n"), "not found", id="last-member-not-a-def"),
    ],
)
def test_drift_when_the_anchor_is_gone(source, message, tmp_path):
    assert message in check_drift(source, tmp_path=tmp_path)


@pytest.mark.parametrize(
    "missing, message",
    [
        pytest.param((REGISTRY, "_get_function_parameters"), "defines no _get_function_parameters", id="no-helper"),
        pytest.param((REGISTRY, "register_vllm_structural_tag"), "defines no register_vllm_structural_tag", id="no-registry"),
        pytest.param((PROTOCOL, "_grammar_from_tool_parser"), "declares no ChatCompletionRequest", id="no-flag"),
        pytest.param((SERVING, "request._grammar_from_tool_parser"), "never reads", id="flag-unread"),
    ],
)
def test_drift_without_what_applies_the_tag_from_the_first_token(missing, message, tmp_path):
    rel, name = missing
    files = {**SUPPORT, rel: SUPPORT[rel].replace(name, "renamed")}
    assert message in tools.check_drift(PARSER, spec=SPEC, tmp_path=tmp_path, package_files=files)


def test_is_applied_needs_the_mark_the_method_and_the_registration():
    done = patched(PARSER)
    assert is_applied(done, None)
    assert not is_applied(PARSER, None)
    assert not is_applied(UPSTREAM_FIX, None)  # upstream's own fix is not our patch
    assert not is_applied(done.replace(f'register_vllm_structural_tag("{TAG_KEY}")', "x"), None)
    assert not is_applied(done.replace("    def adjust_request(", "    def adjust(", 1), None)
    assert not is_applied(done.replace(MARK, "#"), None)


@pytest.mark.parametrize(
    "parser_module, fixed",
    [
        pytest.param(UPSTREAM_FIX, True, id="0.27-shape"),
        pytest.param(UPSTREAM_FIX.replace('("harmony")', '("harmony", builtin_tools=True)'), True, id="0.33-shape"),
        pytest.param(UPSTREAM_FIX.replace("    def adjust_request", "    def adjust"), False, id="no-method"),
        pytest.param(PARSER, False, id="stock-0.24-0.26"),
        pytest.param(patched(PARSER), False, id="our-patch"),
        pytest.param(None, False, id="no-parser-module"),
    ],
)
def test_fixed_upstream_when_harmony_parser_registers_its_own_tag(parser_module, fixed, fake_package):
    reason = fixed_upstream(fake_package({TARGET: parser_module} if parser_module else {}))
    assert bool(reason) is fixed
    if fixed:
        assert "vllm#45560" in reason


def test_status_at_0_27_0_looks_for_the_upstream_fix(tmp_path):
    fixed = status_on_fake_site(tmp_path / "fixed", "0.27.0", {TARGET: UPSTREAM_FIX})[SPEC.id]
    missing = status_on_fake_site(tmp_path / "missing", "0.27.0", {TARGET: PARSER})[SPEC.id]
    assert fixed[0] == "fixed-upstream" and "vllm#45560" in fixed[1]
    assert missing[0] == "drifted"


RELEASES = [pytest.param(str(v), id=f"vllm-{v}") for v in KNOWN_RELEASES if Version("0.24") <= v]


@pytest.mark.upstream
@pytest.mark.parametrize("version", RELEASES)
def test_harmony_parser_has_no_adjust_request_of_its_own_before_0_27(version):
    source = wheel_source(version, f"vllm/{TARGET}") or ""
    has_method = "    def adjust_request(" in source
    assert has_method is (Version(version) >= Version("0.27"))
    assert ('register_vllm_structural_tag("harmony"' in source) is has_method


@pytest.mark.upstream
@pytest.mark.parametrize("version", ["0.24.0", "0.25.0", "0.26.0"])
def test_apply_is_idempotent_and_revert_restores_the_real_file(version, tmp_path):
    from tests.support.golden import extracted

    inst = extracted(Version(version), tmp_path)
    only = Selection(only=(SPEC.id,))
    path = inst.site_packages / "vllm" / TARGET
    stock = path.read_bytes()
    assert engine.apply(inst, only).results[0].changed
    assert is_applied(path.read_text(), None)
    compile(path.read_text(), TARGET, "exec")
    assert not engine.apply(inst, only).results[0].changed
    engine.revert(inst, only)
    assert path.read_bytes() == stock
