"""What a real server renders is what the CPU harness renders: one server per band of harmony_instructions.

The claim "patched 0.17.1 and 0.22.1 render every request of the table token for token like stock 0.23.0, under
both settings of VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS" is proved once, in harness processes, by
tests/test_equivalence.py (the request builder of each release, patched as `apply` patches it). What only a
server can show is that the server's prompt is the builder's: so each server here renders the table (the
prompt's token ids, read back with `return_token_ids`) and is compared, token for token, with the harness's
rendering of the same release, patches and setting. Stock 0.17.1 is compared too (the server and the builder
agree on the raw second system message, G02), and the patched and stock servers differ on it, so the comparison
can fail.

The servers are the session's shared ones (tests/e2e/conftest.py), already started for other modules: stock
0.17.1 (test_hostile_requests' stock side, flag unset), 0.17.1 as users patch it (`gptoss-patch apply` and the hook:
test_hostile_requests' and test_served's; flag unset), and 0.22.1 with harmony_instructions and
harmony_reasoning_effort at flag "1" (test_reasoning_effort's; its effort map changes no request of the table,
checked below).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any

import pytest

from gptoss_patch.registry import all_specs
from tests.e2e.conftest import EFFORT_MAP, PATCHED_0171, PATCHED_0221, PATCHES_0221, STOCK_0171
from tests.support import harmony, harness, servers
from tests.support.chat_cases import PIRATE, TABLE
from tests.support.markers import needs

RAW_SECOND_SYSTEM = f"<|start|>system<|message|>{PIRATE}<|end|>"
DEFAULT_SET = tuple(spec.id for spec in all_specs() if not spec.opt_in)  # what `gptoss-patch apply` applies
# server -> the patches its harness twin gets, and the flag's setting (as render_table spells it)
TWINS: dict[servers.Spec, tuple[tuple[str, ...], str]] = {
    STOCK_0171: ((), "unset"),
    PATCHED_0171: (DEFAULT_SET, "unset"),
    PATCHED_0221: (PATCHES_0221, "1"),
}
SHARED_SERVERS = tuple(TWINS)
LABELS = {STOCK_0171: "stock-0.17.1", PATCHED_0171: "patched-0.17.1", PATCHED_0221: "patched-0.22.1-flag-1"}


def render_on_server(pool: servers.Pool, wanted: servers.Spec) -> dict[str, dict[str, Any]]:
    """Every TABLE request against the server of `wanted`: {case: {"ids": [...], "text": "..."}}."""
    ids: dict[str, list[int]] = {}
    (server,) = pool.get(wanted)
    for name, case in TABLE.items():
        answer = server.chat({**case, "max_tokens": 1, "temperature": 0, "return_token_ids": True})
        assert "prompt_token_ids" in answer, f"{name}: {answer}"
        ids[name] = answer["prompt_token_ids"]
    texts = harmony.decode(pool.python(wanted), list(ids.values()))
    return {name: {"ids": ids[name], "text": text} for name, text in zip(ids, texts)}


@pytest.fixture(scope="module")
def on_server(shared: servers.Pool) -> Callable[[servers.Spec], dict[str, dict[str, Any]]]:
    """Renderings per server, each computed once per session (the pool's memo)."""
    efforts = {case.get("reasoning_effort") for case in TABLE.values()} - {None}
    assert efforts and not efforts & set(EFFORT_MAP), efforts  # the 0.22.1 server's map changes no request here

    def get(spec: servers.Spec) -> dict[str, dict[str, Any]]:
        if ("render", spec) not in shared.memo:
            shared.memo["render", spec] = render_on_server(shared, spec)
        result: dict[str, dict[str, Any]] = shared.memo["render", spec]
        return result

    return get


@pytest.fixture(scope="module")
@needs("harness")
def in_harness(tmp_path_factory: pytest.TempPathFactory) -> Callable[[servers.Spec], dict[str, Any]]:
    """The harness's rendering of each server's twin (same release, patches, setting), once per module."""
    done: dict[servers.Spec, dict[str, Any]] = {}

    def get(spec: servers.Spec) -> dict[str, Any]:
        if spec not in done:
            patches, setting = TWINS[spec]
            python = harness.cpu_venv(spec.version)
            if patches:
                python = harness.clone_venv(python, tmp_path_factory.mktemp(f"twin-{spec.version}") / "venv")
                harness.apply_patches(python, patches)
            payload = harness.render_table(python, TABLE, settings=(setting,))
            assert payload["vllm"] == spec.version, payload["vllm"]
            done[spec] = {name: payload["results"][setting][name] for name in TABLE}
        return done[spec]

    return get


@pytest.mark.parametrize("spec", [pytest.param(s, id=LABELS[s]) for s in TWINS])
def test_the_server_renders_every_request_as_the_harness_renders_it(on_server, in_harness, spec: servers.Spec) -> None:
    served, built = on_server(spec), in_harness(spec)

    problems = [f"{name}: the harness could not render it: {built[name]['error']}" for name in TABLE if "error" in built[name]]
    assert not problems, "\n".join(problems)
    differing = [name for name in TABLE if served[name]["ids"] != built[name]["ids"]]
    assert not differing, "\n".join(_explain(name, served[name]["text"], built[name]["text"]) for name in differing)


def test_stock_0171_renders_the_system_message_as_a_second_raw_system_message(on_server) -> None:
    text = on_server(STOCK_0171)["system_user"]["text"]

    assert text.count("<|start|>system<|message|>") == 2
    assert RAW_SECOND_SYSTEM in text


@pytest.mark.parametrize("spec", [pytest.param(s, id=LABELS[s]) for s in (PATCHED_0171, PATCHED_0221)])
def test_patched_server_puts_the_system_message_in_the_instructions(on_server, spec: servers.Spec) -> None:
    text = on_server(spec)["system_user"]["text"]

    assert RAW_SECOND_SYSTEM not in text
    assert text.count("<|start|>system<|message|>") == 1
    if TWINS[spec][1] == "1":  # the flag puts the instructions into the system message itself
        system = text.split("<|start|>system<|message|>")[1].split("<|end|>")[0]
        assert PIRATE in system
    else:  # otherwise they become the developer message's instructions
        assert f"<|start|>developer<|message|># Instructions\n\n{PIRATE}" in text


def test_stock_and_patched_0171_servers_differ_so_the_comparison_can_fail(on_server) -> None:
    stock, patched = on_server(STOCK_0171), on_server(PATCHED_0171)

    assert stock["system_user"]["ids"] != patched["system_user"]["ids"]
    assert stock["no_system"]["ids"] == patched["no_system"]["ids"]  # control: only system handling differs


def _explain(name: str, served: str, built: str) -> str:
    diff = difflib.unified_diff(served.split("<|"), built.split("<|"), "server", "harness", lineterm="")
    return f"{name}:\n" + "\n".join(diff)
