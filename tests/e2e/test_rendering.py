"""What a real server renders: the prompt's token ids, read back with `return_token_ids` and decoded by openai_harmony.

Stock 0.17.1 renders the client's system message as a second raw harmony system message (G02).
Patched 0.17.1 and 0.22.1 (harmony_instructions, both of its bands) put it in the instructions, and
render every request of the table token for token like stock 0.23.0 (vllm#44330), under both
settings of VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS (0 and 1). One server per (release, patches, setting).

The servers are the session's shared ones (tests/e2e/conftest.py). Stock 0.17.1 is test_hostile_requests'
stock side, started without the flag: unset, it is "0" there (checked below), the only setting stock 0.17.1 is
rendered at. Patched 0.22.1 is test_reasoning_effort's: it carries harmony_reasoning_effort too, and its
server at setting 1 GPTOSS_PATCH_REASONING_EFFORT_MAP; that patch changes only efforts harmony does not
know, which no request of the table sends (checked below), so what is compared is still what
harmony_instructions renders.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Hashable, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import EFFORT_MAP, FLAG, STOCK_0171, instructions_0171, patched_0221, stock_0230
from tests.support import harmony, servers
from tests.support.chat_cases import PIRATE, TABLE

# Both settings spelled out (`gptoss-patch serve` leaves it unset, upstream's default, unless --instructions system).
SETTINGS = ("0", "1")
RAW_SECOND_SYSTEM = f"<|start|>system<|message|>{PIRATE}<|end|>"


def spec(version: str, patched: bool, setting: str) -> servers.Spec:
    if not patched:
        assert version != "0.17.1" or setting == "0", "stock 0.17.1 is rendered at the flag's default only"
        return STOCK_0171 if version == "0.17.1" else stock_0230(setting)
    return instructions_0171(setting) if version == "0.17.1" else patched_0221(setting)


def render_on_server(pool: servers.Pool, wanted: servers.Spec) -> dict[str, Any]:
    """Every TABLE request against the server of `wanted`: {case: {"ids": [...], "text": "..."}}."""
    ids: dict[str, list[int]] = {}
    (server,) = pool.get(wanted)
    for name, case in TABLE.items():
        answer = server.chat({**case, "max_tokens": 1, "temperature": 0, "return_token_ids": True})
        assert "prompt_token_ids" in answer, f"{name}: {answer}"
        ids[name] = answer["prompt_token_ids"]
    texts = harmony.decode(pool.python(wanted), list(ids.values()))
    return {name: {"ids": ids[name], "text": text} for name, text in zip(ids, texts)}


def flag_default(python: Path) -> str | None:
    """The default of FLAG in the venv's vllm/envs.py (None: not found)."""
    envs = next(Path(python).parent.parent.glob("lib/python3*/site-packages/vllm/envs.py"))
    found = re.search(rf'os\.getenv\(\s*"{FLAG}",\s*"(\w*)"\s*\)', envs.read_text())
    return found.group(1) if found else None


@pytest.fixture(scope="module")
def rendered(shared: servers.Pool) -> Callable[..., dict[str, Any]]:
    """Renderings per (release, patched, setting), each computed once per session (kept in the pool's memo)."""
    # What lets these servers be shared, checked rather than assumed: unset, the flag is "0" on stock 0.17.1...
    assert flag_default(shared.python(STOCK_0171)) == "0", "give stock 0.17.1 a server with the flag spelled out"
    # ...and the effort map of patched 0.22.1's server at "1" changes no request of the table.
    efforts = {case.get("reasoning_effort") for case in TABLE.values()} - {None}
    assert efforts and not efforts & set(EFFORT_MAP), efforts

    def get(version: str, patched: bool, setting: str) -> dict[str, Any]:
        wanted = spec(version, patched, setting)
        if ("render", wanted) not in shared.memo:
            shared.memo["render", wanted] = render_on_server(shared, wanted)
        result: dict[str, Any] = shared.memo["render", wanted]
        return result

    return get


def shared_servers(item: pytest.Item, memo: Mapping[Hashable, Any]) -> list[servers.Spec]:
    """The servers a test of this module still needs: those whose renderings it reads and the memo lacks."""
    params = getattr(item, "callspec", None)
    version, setting = (params.params["version"], params.params["setting"]) if params else ("0.17.1", "0")
    reads = {"test_stock_0171_renders_the_system_message_as_a_second_raw_system_message": [("0.17.1", False, "0")],
             "test_patched_server_puts_the_system_message_in_the_instructions": [(version, True, setting)],
             "test_patched_server_prompts_equal_stock_0230_token_for_token": [(version, True, setting), ("0.23.0", False, setting)],
             "test_stock_0171_server_differs_from_0230_so_the_comparison_can_fail": [("0.17.1", False, "0"), ("0.23.0", False, "0")]}
    wanted = [spec(*key) for key in reads.get(getattr(item, "originalname", ""), [])]
    return [w for w in wanted if ("render", w) not in memo]


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
