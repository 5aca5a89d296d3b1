"""What a real server renders: the prompt's token ids, read back with `return_token_ids` and decoded by openai_harmony.

Stock 0.17.1 renders the client's system message as a second raw harmony system message (G02).
Patched 0.17.1 and 0.22.1 (harmony_instructions, both of its bands) put it in the instructions, and
render every request of the table token for token like stock 0.23.0 (vllm#44330), under both
settings of VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS (0 and 1). One server per (release, patches, setting).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import RENDER_ARGS
from tests.support import harmony, servers
from tests.support.chat_cases import PIRATE, TABLE

FLAG = "VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS"
# Both settings spelled out (`gptoss-patch serve` leaves it unset, upstream's default, unless --instructions system).
SETTINGS = ("0", "1")
PATCH = ("harmony_instructions",)
RAW_SECOND_SYSTEM = f"<|start|>system<|message|>{PIRATE}<|end|>"


def render_on_server(python: Path, model: Path, log_dir: Path, setting: str) -> dict[str, Any]:
    """Every TABLE request against one fresh server: {case: {"ids": [...], "text": "..."}}."""
    env = {FLAG: setting}
    ids: dict[str, list[int]] = {}
    # --allow-unpatched: stock servers, and patched ones carry harmony_instructions only (the other patches pend)
    with servers.running(python, model, log_dir, *RENDER_ARGS, env=env, launcher_args=("--allow-unpatched",)) as server:
        for name, case in TABLE.items():
            answer = server.chat({**case, "max_tokens": 1, "temperature": 0, "return_token_ids": True})
            assert "prompt_token_ids" in answer, f"{name}: {answer}"
            ids[name] = answer["prompt_token_ids"]
    texts = harmony.decode(python, list(ids.values()))
    return {name: {"ids": ids[name], "text": text} for name, text in zip(ids, texts)}


@pytest.fixture(scope="module")
def rendered(clone: Callable[..., Path], model: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., dict[str, Any]]:
    """Renderings per (release, patched, setting), each computed once per module."""
    done: dict[tuple[str, bool, str], dict[str, Any]] = {}
    venvs: dict[tuple[str, bool], Path] = {}

    def get(version: str, patched: bool, setting: str) -> dict[str, Any]:
        key = (version, patched, setting)
        if key not in done:
            if (version, patched) not in venvs:
                venvs[version, patched] = clone(version, PATCH if patched else ())
            log_dir = tmp_path_factory.mktemp(f"render-{version}-{'patched' if patched else 'stock'}-{setting}")
            done[key] = render_on_server(venvs[version, patched], model, log_dir, setting)
        return done[key]

    return get


def test_stock_0171_renders_the_system_message_as_a_second_raw_system_message(rendered) -> None:
    text = rendered("0.17.1", False, "0")["system_user"]["text"]

    assert text.count("<|start|>system<|message|>") == 2
    assert RAW_SECOND_SYSTEM in text


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("version", ["0.17.1", "0.22.1"])
def test_patched_server_puts_the_system_message_in_the_instructions(rendered, version: str, setting: str) -> None:
    text = rendered(version, True, setting)["system_user"]["text"]

    assert RAW_SECOND_SYSTEM not in text
    assert text.count("<|start|>system<|message|>") == 1
    if setting == "1":  # the flag puts the instructions into the system message itself
        system = text.split("<|start|>system<|message|>")[1].split("<|end|>")[0]
        assert PIRATE in system
    else:  # otherwise they become the developer message's instructions
        assert f"<|start|>developer<|message|># Instructions\n\n{PIRATE}" in text


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("version", ["0.17.1", "0.22.1"])
def test_patched_server_prompts_equal_stock_0230_token_for_token(rendered, version: str, setting: str) -> None:
    ours, theirs = rendered(version, True, setting), rendered("0.23.0", False, setting)

    differing = [name for name in TABLE if ours[name]["ids"] != theirs[name]["ids"]]
    assert not differing, "\n".join(_explain(name, ours[name]["text"], theirs[name]["text"]) for name in differing)


def test_stock_0171_server_differs_from_0230_so_the_comparison_can_fail(rendered) -> None:
    ours, theirs = rendered("0.17.1", False, "0"), rendered("0.23.0", False, "0")

    assert ours["system_user"]["ids"] != theirs["system_user"]["ids"]
    assert ours["no_system"]["ids"] == theirs["no_system"]["ids"]  # control: only system handling differs


def _explain(name: str, ours: str, theirs: str) -> str:
    diff = difflib.unified_diff(ours.split("<|"), theirs.split("<|"), "patched", "stock 0.23.0", lineterm="")
    return f"{name}:\n" + "\n".join(diff)
