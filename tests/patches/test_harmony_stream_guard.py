"""harmony_stream_guard: a token the harmony parser rejects is skipped, logged once, and the stream goes on.

Snippets are hand-written in the shape of the per-token loop: the chat stream generator of
`entrypoints/openai/chat_completion/serving.py` (0.15.1-0.23.x) and `HarmonyParser.process_chunk`
in `vllm/parser/harmony.py` (0.24.0-0.31.x; guarded upstream from 0.32.0).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from functools import partial
from types import ModuleType

import pytest

from gptoss_patch.patches.harmony_stream_guard import HELPER, HELPER_SOURCE, SPEC, fixed_upstream, is_applied
from tests.patches.helpers import status_on_fake_site, with_helper
from tests.support import tools

check = partial(tools.check_transformed, spec=SPEC)
check_drift = partial(tools.check_drift, spec=SPEC)
CHAT_TARGET = "entrypoints/openai/chat_completion/serving.py"
PARSER_TARGET = "parser/harmony.py"

# <= 0.23: the generator feeds each token of each output to that choice's parser.
CHAT_STREAM = """\
class OpenAIServingChat:
    async def chat_completion_stream_generator(self, result_generator, harmony_parsers):
        async for res in result_generator:
            for output in res:
                harmony_parser = harmony_parsers[output["index"]]
                deltas = []
                for token_id in output["token_ids"]:
                    harmony_parser.process(token_id)
                    deltas.append(harmony_parser.last_content_delta or "")
                yield "".join(deltas)
"""

# 0.24-0.31: the shared parser adapter feeds a chunk of tokens to its StreamableParser.
CHUNK = """\
class HarmonyParser:
    def process_chunk(self, token_ids):
        deltas = []
        for token_id in token_ids:
            self._harmony_parser.process(token_id)
            deltas.append(self._harmony_parser.last_content_delta or "")
        self._num_counted_tokens += len(token_ids)
        return deltas
"""

# 0.32.0+: the call sits in a try whose HarmonyError handler skips the token.
GUARDED_UPSTREAM = CHUNK.replace(
    "            self._harmony_parser.process(token_id)\n",
    "            try:\n"
    "                self._harmony_parser.process(token_id)\n"
    "            except HarmonyError:\n"
    "                continue\n",
)


def guarded(source: str, call: str, receiver: str) -> str:
    indent = call[: len(call) - len(call.lstrip())]
    guard = (
        f"{indent}# gptoss-patch harmony_stream_guard: skip a rejected token, keep streaming.\n"
        f"{indent}if not {HELPER}({receiver}, token_id):\n"
        f"{indent}    continue\n"
    )
    return with_helper(source.replace(call, guard), HELPER_SOURCE)


CHAT_CALL = "                    harmony_parser.process(token_id)\n"
CHUNK_CALL = "            self._harmony_parser.process(token_id)\n"
PATCHED_CHAT = guarded(CHAT_STREAM, CHAT_CALL, "harmony_parser")
PATCHED_CHUNK = guarded(CHUNK, CHUNK_CALL, "self._harmony_parser")
SECOND_LOOP = "        for token_id in token_ids:\n    " + CHUNK_CALL
TWO_LOOPS = CHUNK.replace("        self._num_counted_tokens", SECOND_LOOP + "        self._num_counted_tokens")


@pytest.mark.parametrize(
    "before, after",
    [
        pytest.param(CHAT_STREAM, PATCHED_CHAT, id="chat-stream-generator-0.15-0.23"),
        pytest.param(CHUNK, PATCHED_CHUNK, id="process-chunk-0.24-0.31"),
    ],
)
def test_guards_the_per_token_call_in_both_bands(before, after):
    check(before, after)


@pytest.mark.parametrize("patched", [PATCHED_CHAT, PATCHED_CHUNK], ids=["chat", "chunk"])
def test_noop_when_already_patched(patched):
    assert is_applied(patched, None)
    assert "not found" in check_drift(patched)


@pytest.mark.parametrize(
    "source, message",
    [
        pytest.param(GUARDED_UPSTREAM, "not found", id="already-guarded-upstream"),
        pytest.param(CHUNK.replace("token_id", "tok"), "not found", id="loop-variable-renamed"),
        pytest.param(CHUNK.replace("process_chunk", "count_reasoning_tokens"), "not found", id="call-outside-the-stream"),
        pytest.param(TWO_LOOPS, "found 2 times", id="two-unguarded-loops"),
        pytest.param(CHUNK.replace(CHUNK_CALL, CHUNK_CALL + CHUNK_CALL), "not found", id="call-twice-in-one-loop"),
    ],
)
def test_drift_when_the_anchor_is_gone_or_ambiguous(source, message):
    assert message in check_drift(source)


def test_is_applied_needs_our_helper_called_from_the_stream_loop():
    assert not is_applied(CHUNK, None)
    assert not is_applied(GUARDED_UPSTREAM, None)  # upstream's guard is fixed-upstream, not our patch
    assert not is_applied(CHUNK + "\n\n" + HELPER_SOURCE.lstrip("\n"), None)


@pytest.mark.parametrize(
    "parser_module, fixed",
    [
        pytest.param(GUARDED_UPSTREAM, True, id="0.32-shape"),
        pytest.param(CHUNK, False, id="0.24-0.31-shape"),
        pytest.param(GUARDED_UPSTREAM.replace("except HarmonyError", "except ValueError"), False, id="other-exception"),
        pytest.param(PATCHED_CHUNK, False, id="our-patch-is-not-upstream"),
        pytest.param(None, False, id="no-parser-module-before-0.24"),
    ],
)
def test_fixed_upstream_is_detected_by_shape(parser_module, fixed, fake_package):
    package = fake_package({PARSER_TARGET: parser_module} if parser_module else {})
    reason = fixed_upstream(package)
    assert bool(reason) is fixed
    if fixed:
        assert "HarmonyParser.process_chunk" in reason


class HarmonyError(Exception):
    pass


class FakeStreamableParser:
    """Rejects negative tokens the way StreamableParser raises HarmonyError on a malformed sequence."""

    def __init__(self) -> None:
        self.last_content_delta = None

    def process(self, token_id: int) -> FakeStreamableParser:
        if token_id < 0:
            raise HarmonyError(f"Unexpected token {token_id}")
        self.last_content_delta = f"<{token_id}>"
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

    def run(source: str, name: str) -> dict:
        namespace = {"__name__": "vllm.fake_stream", "HarmonyError": HarmonyError}
        exec(compile(source, "stream.py", "exec"), namespace)
        return namespace[name]

    return run


def test_process_chunk_skips_rejected_tokens_and_logs_once(load, caplog):
    parser = load(PATCHED_CHUNK, "HarmonyParser")()
    parser._harmony_parser, parser._num_counted_tokens = FakeStreamableParser(), 0
    with caplog.at_level(logging.WARNING, logger="vllm.fake_stream"):
        first = parser.process_chunk([1, -2, 3])
        second = parser.process_chunk([-4, 5])
    assert (first, second) == (["<1>", "<3>"], ["<5>"])
    assert parser._num_counted_tokens == 5  # every token still counts, as upstream
    assert [r.getMessage().split(";")[0] for r in caplog.records] == [
        "gptoss-patch harmony_stream_guard: skipped token -2 that the harmony parser rejected (Unexpected token -2)"
    ]


def test_stock_process_chunk_raises_on_a_rejected_token(load):
    parser = load(CHUNK, "HarmonyParser")()
    parser._harmony_parser, parser._num_counted_tokens = FakeStreamableParser(), 0
    with pytest.raises(HarmonyError):
        parser.process_chunk([1, -2, 3])


def stream(serving_class, chunks: list[list[int]], parsers: list) -> list[str]:
    async def results():
        for tokens in chunks:
            yield [{"index": 0, "token_ids": tokens}]

    async def collect():
        return [delta async for delta in serving_class().chat_completion_stream_generator(results(), parsers)]

    return asyncio.run(collect())


def test_chat_stream_keeps_streaming_past_a_rejected_token(load, caplog):
    with caplog.at_level(logging.WARNING, logger="vllm.fake_stream"):
        deltas = stream(load(PATCHED_CHAT, "OpenAIServingChat"), [[1, 2], [-3, 4], [-5]], [FakeStreamableParser()])
    assert deltas == ["<1><2>", "<4>", ""]
    assert len(caplog.records) == 1
    with pytest.raises(HarmonyError):
        stream(load(CHAT_STREAM, "OpenAIServingChat"), [[1, 2], [-3, 4]], [FakeStreamableParser()])


def test_each_stream_logs_its_own_first_rejection(load, caplog):
    serving = load(PATCHED_CHAT, "OpenAIServingChat")
    with caplog.at_level(logging.WARNING, logger="vllm.fake_stream"):
        stream(serving, [[-1, -2]], [FakeStreamableParser()])
        stream(serving, [[-3]], [FakeStreamableParser()])
    assert len(caplog.records) == 2


def test_status_from_0_32_0_looks_for_the_per_token_guard_instead_of_patching(tmp_path):
    """0.31.0 still gets the patch in HarmonyParser; from 0.32.0 (fixed_in) `status` wants upstream's guard."""
    before = status_on_fake_site(tmp_path / "0.31.0", "0.31.0", {PARSER_TARGET: CHUNK})[SPEC.id]
    fixed = status_on_fake_site(tmp_path / "fixed", "0.32.0", {PARSER_TARGET: GUARDED_UPSTREAM})[SPEC.id]
    missing = status_on_fake_site(tmp_path / "missing", "0.32.0", {PARSER_TARGET: CHUNK})[SPEC.id]
    assert before == ("pending", "unpatched shape found in vllm 0.31.0")
    assert fixed[0] == "fixed-upstream" and "HarmonyParser.process_chunk" in fixed[1]
    assert missing == ("drifted", "vllm 0.32.0 should carry the upstream fix (since 0.32.0) but it was not found")
