"""harmony_output_guard: a token the harmony parser rejects is skipped when a non-streaming output is parsed.

Snippets are hand-written in the shape of `parse_output_into_messages` in harmony_utils (0.15.1-0.23.x):
the per-token loop the codemod guards. The behaviour tests run the real function in CPU harness venvs.
"""

from __future__ import annotations

import logging
import sys
from functools import partial
from types import ModuleType

import pytest
from packaging.version import Version

from gptoss_patch.patches.harmony_output_guard import (
    FUNCTION,
    HELPER,
    HELPER_SOURCE,
    SPEC,
    TARGET,
    fixed_upstream,
    is_applied,
)
from gptoss_patch.versions import KNOWN_RELEASES
from tests.patches.helpers import round_trip_on_the_real_file, status_on_fake_site, wheel_source, with_helper
from tests.support import harness, tools
from tests.support.markers import needs

check = partial(tools.check_transformed, spec=SPEC)
check_drift = partial(tools.check_drift, spec=SPEC)
PARSER_TARGET = "parser/harmony.py"

OUTPUT = """\
def parse_output_into_messages(token_ids):
    parser = get_streamable_parser_for_assistant()
    for token_id in token_ids:
        parser.process(token_id)
    return parser


def parse_chat_output(token_ids):
    parser = parse_output_into_messages(token_ids)
    return parser.messages
"""

CALL = "        parser.process(token_id)\n"
PATCHED = with_helper(
    OUTPUT.replace(
        CALL,
        "        # gptoss-patch harmony_output_guard: skip a rejected token, keep parsing (as vLLM 0.32.0).\n"
        f"        if not {HELPER}(parser, token_id):\n"
        "            continue\n",
    ),
    HELPER_SOURCE,
)

# 0.32.0+: HarmonyParser.process_chunk skips a token that raises (the upstream fix this patch backports).
GUARDED_UPSTREAM = """\
class HarmonyParser:
    def process_chunk(self, token_ids):
        for token_id in token_ids:
            try:
                self._harmony_parser.process(token_id)
            except HarmonyError:
                continue
"""


def test_guards_the_per_token_call():
    check(OUTPUT, PATCHED)


def test_noop_when_already_patched():
    assert is_applied(PATCHED, None)
    assert "not found" in check_drift(PATCHED)


@pytest.mark.parametrize(
    "source, message",
    [
        pytest.param(OUTPUT.replace(FUNCTION, "parse_output"), "not found", id="function-renamed"),
        pytest.param(OUTPUT.replace("token_id", "tok"), "not found", id="loop-variable-renamed"),
        pytest.param(OUTPUT.replace(CALL, CALL + CALL), "not found", id="call-twice-in-one-loop"),
        pytest.param(
            OUTPUT.replace("    return parser\n", "    for token_id in token_ids:\n" + CALL + "    return parser\n", 1),
            "found 2 times",
            id="two-unguarded-loops",
        ),
        pytest.param(
            OUTPUT.replace(CALL, "        try:\n    " + CALL + "        except HarmonyError:\n            continue\n"),
            "not found",
            id="already-guarded",
        ),
    ],
)
def test_drift_when_the_anchor_is_gone_or_ambiguous(source, message):
    assert message in check_drift(source)


def test_is_applied_needs_our_helper_called_from_the_function():
    assert not is_applied(OUTPUT, None)
    assert not is_applied(OUTPUT + "\n\n" + HELPER_SOURCE.lstrip("\n"), None)


@pytest.mark.parametrize(
    "parser_module, fixed",
    [
        pytest.param(GUARDED_UPSTREAM, True, id="0.32-shape"),
        pytest.param(GUARDED_UPSTREAM.replace("except HarmonyError", "except ValueError"), False, id="other-exception"),
        pytest.param(None, False, id="no-parser-module-before-0.24"),
    ],
)
def test_fixed_upstream_when_harmony_parser_skips_rejected_tokens(parser_module, fixed, fake_package):
    package = fake_package({PARSER_TARGET: parser_module} if parser_module else {})
    reason = fixed_upstream(package)
    assert bool(reason) is fixed
    if fixed:
        assert "HarmonyParser.process_chunk" in reason and "non-streaming" in reason


class HarmonyError(Exception):
    pass


class FakeStreamableParser:
    """Rejects negative tokens the way StreamableParser raises HarmonyError on a malformed sequence."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def process(self, token_id: int) -> FakeStreamableParser:
        if token_id < 0:
            raise HarmonyError(f"Unexpected token {token_id}")
        self.seen.append(token_id)
        return self


@pytest.fixture
def load(monkeypatch):
    """exec a (patched) snippet with fake openai_harmony and vllm.logger modules installed."""
    harmony = ModuleType("openai_harmony")
    harmony.HarmonyError = HarmonyError
    logger_module = ModuleType("vllm.logger")
    logger_module.init_logger = logging.getLogger
    for name, module in {"openai_harmony": harmony, "vllm": ModuleType("vllm"), "vllm.logger": logger_module}.items():
        monkeypatch.setitem(sys.modules, name, module)

    def run(source: str) -> dict:
        namespace = {"__name__": "vllm.fake_output", "get_streamable_parser_for_assistant": FakeStreamableParser}
        exec(compile(source, "harmony_utils.py", "exec"), namespace)
        return namespace[FUNCTION]

    return run


def test_skips_rejected_tokens_and_logs_once_per_output(load, caplog):
    parse = load(PATCHED)
    with caplog.at_level(logging.WARNING, logger="vllm.fake_output"):
        assert parse([1, -2, 3, -4]).seen == [1, 3]
        assert parse([-5]).seen == []
    assert [r.getMessage().split(";")[0] for r in caplog.records] == [
        "gptoss-patch harmony_output_guard: skipped token -2 that the harmony parser rejected (Unexpected token -2)",
        "gptoss-patch harmony_output_guard: skipped token -5 that the harmony parser rejected (Unexpected token -5)",
    ]
    with pytest.raises(HarmonyError):
        load(OUTPUT)([1, -2, 3])


def test_status_from_0_32_0_looks_for_the_harmony_parser_guard(tmp_path):
    fixed = status_on_fake_site(tmp_path / "fixed", "0.32.0", {PARSER_TARGET: GUARDED_UPSTREAM})[SPEC.id]
    missing = status_on_fake_site(tmp_path / "missing", "0.32.0", {PARSER_TARGET: "class HarmonyParser:\n    pass\n"})
    between = status_on_fake_site(tmp_path / "between", "0.31.0")[SPEC.id]
    assert fixed[0] == "fixed-upstream" and "HarmonyParser.process_chunk" in fixed[1]
    assert missing[SPEC.id] == (
        "drifted",
        "vllm 0.32.0 should carry the upstream fix (since 0.32.0) but it was not found",
    )
    assert between[0] == "out-of-range"


RELEASES = [pytest.param(str(v), id=f"vllm-{v}") for v in KNOWN_RELEASES]


@pytest.mark.upstream
@pytest.mark.parametrize("version", RELEASES)
def test_the_function_lives_in_harmony_utils_until_0_23(version):
    source = wheel_source(version, f"vllm/{TARGET}") or ""
    assert (f"def {FUNCTION}(" in source) is (Version(version) < Version("0.24"))


@pytest.mark.upstream
@pytest.mark.parametrize("version", ["0.15.1", "0.17.1", "0.18.0", "0.22.1", "0.23.0"])
def test_apply_is_idempotent_and_revert_restores_the_real_file(version, tmp_path):
    round_trip_on_the_real_file(SPEC, is_applied, version, tmp_path)


# The harness behaviour test: the real parse_output_into_messages and parse_chat_output on real harmony tokens.
# `<|return|>` (200002) right after `<|end|>`, where harmony expects `<|start|>`: stock raises HarmonyError.
VALID = (
    "<|channel|>analysis<|message|>think<|end|>"
    "<|start|>assistant<|channel|>final<|message|>answer<|return|>"
)
BEHAVIOUR_SCRIPT = """
import json, logging, sys
from openai_harmony import HarmonyError
from vllm.entrypoints.openai.parser import harmony_utils as hu

enc = hu.get_encoding()
valid = enc.encode(sys.argv[1], allowed_special="all")
end = valid.index(enc.encode("<|end|>", allowed_special="all")[0])
malformed = valid[: end + 1] + [200002] + valid[end + 1 :]
partial = valid[:-1]  # the final message still open: parse_chat_output reads current_content
out = {}
for name, tokens in (("valid", valid), ("malformed", malformed), ("partial", partial)):
    try:
        parser = hu.parse_output_into_messages(tokens)
        out[name] = {
            "messages": [m.to_dict() for m in parser.messages],
            "current": [parser.current_channel, parser.current_content],
            "chat": list(hu.parse_chat_output(tokens)),
        }
    except HarmonyError as exc:
        out[name] = {"error": str(exc)}
print("RESULT " + json.dumps(out, default=str))
"""


def run_behaviour(python) -> tuple[dict, str]:
    return harness.script_result(python, BEHAVIOUR_SCRIPT, VALID, env=harness.script_env(python))


HARNESS_RELEASES = ("0.17.1", "0.22.1")  # the CPU harness venvs it builds (tests/support/prewarm.py)


@pytest.fixture(scope="module", params=HARNESS_RELEASES)
@needs("harness")
def stock_and_patched(request, tmp_path_factory):
    stock = harness.cpu_venv(request.param)
    patched = harness.clone_venv(stock, tmp_path_factory.mktemp("output-guard") / "venv")
    harness.apply_patches(patched, [SPEC.id])
    return run_behaviour(stock), run_behaviour(patched)


@pytest.mark.harness
def test_stock_raises_and_patched_skips_the_rejected_token(stock_and_patched):
    (stock, _), (patched, log) = stock_and_patched
    assert stock["malformed"] == {"error": "Unexpected token 200002 while expecting start token 200006"}
    assert patched["malformed"] == patched["valid"]  # the stray token skipped, the rest parsed as if it were absent
    assert patched["malformed"]["chat"] == ["think", "answer", False]
    assert "gptoss-patch harmony_output_guard: skipped token 200002" in log


@pytest.mark.harness
def test_valid_and_unfinished_outputs_parse_identically_stock_and_patched(stock_and_patched):
    (stock, _), (patched, _) = stock_and_patched
    assert patched["valid"] == stock["valid"] and len(stock["valid"]["messages"]) == 2
    assert patched["partial"] == stock["partial"]
    assert stock["partial"]["chat"] == ["think", "answer", False]  # the open final message, through current_content
