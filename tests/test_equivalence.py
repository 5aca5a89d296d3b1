"""Patched vLLM 0.17.1 (and 0.22.1) render gpt-oss chat prompts token-for-token like stock 0.23.0 (vllm#44330).

Every request of TABLE goes through the installed `_make_request_with_harmony` of CPU harness venvs
(stock 0.17.1; 0.17.1 and 0.22.1 patched with the default set, which holds both bands of
harmony_instructions: OpenAIServingChat and OpenAIServingRender; stock 0.23.0), under both settings of
VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS, with VLLM_SYSTEM_START_DATE pinned. Opt-in patches are left
out, as `apply` leaves them out: the claim is about what a plain `apply` gives.
"""

from __future__ import annotations

import difflib
from typing import Any

import pytest

from gptoss_patch.registry import all_specs
from tests.support import harness
from tests.support.chat_cases import PIRATE, SETTINGS, TABLE
from tests.support.markers import needs

PATCHED_VERSIONS = ("0.17.1", "0.22.1")  # one per band of harmony_instructions
DEFAULT_SET = tuple(spec.id for spec in all_specs() if not spec.opt_in)


@pytest.fixture(scope="module")
@needs("harness")
def upstream() -> dict[str, Any]:
    return harness.render_table(harness.cpu_venv("0.23.0"), TABLE, settings=SETTINGS)


@pytest.fixture(scope="module")
@needs("harness")
def stock() -> dict[str, Any]:
    return harness.render_table(harness.cpu_venv("0.17.1"), TABLE, settings=SETTINGS)


@pytest.fixture(scope="module", params=[pytest.param(v, id=f"vllm-{v}") for v in PATCHED_VERSIONS])
@needs("harness")
def patched(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    python = harness.clone_venv(harness.cpu_venv(request.param), tmp_path_factory.mktemp("eq") / "venv")
    harness.apply_patches(python, DEFAULT_SET)
    return harness.render_table(python, TABLE, settings=SETTINGS)


def rendered(payload: dict[str, Any], setting: str, case: str) -> dict[str, Any]:
    got = payload["results"][setting][case]
    assert "error" not in got, f"vllm {payload['vllm']} could not render {case}: {got['error']}"
    return got


def explain(a: dict[str, Any], b: dict[str, Any]) -> str:
    ours, theirs = f"patched {a['vllm']}", "stock 0.23.0"
    return "\n".join(difflib.unified_diff(a["text"].split("<|"), b["text"].split("<|"), ours, theirs, lineterm=""))


@pytest.mark.harness
@pytest.mark.parametrize("setting", [pytest.param(s, id=f"flag-{s}") for s in SETTINGS])
@pytest.mark.parametrize("case", [pytest.param(name, id=name) for name in TABLE])
def test_patched_prompt_ids_equal_stock_0230(patched: dict[str, Any], upstream: dict[str, Any], case: str, setting: str) -> None:
    ours, theirs = rendered(patched, setting, case), rendered(upstream, setting, case)
    assert ours["ids"] == theirs["ids"], explain(dict(ours, vllm=patched["vllm"]), theirs)


@pytest.mark.harness
def test_the_venvs_are_the_versions_compared(stock: dict[str, Any], upstream: dict[str, Any]) -> None:
    assert (stock["vllm"], upstream["vllm"]) == ("0.17.1", "0.23.0")
    assert stock["where"].endswith("OpenAIServingChat._make_request_with_harmony")
    assert upstream["where"].endswith("OpenAIServingRender._make_request_with_harmony")


@pytest.mark.harness
@pytest.mark.parametrize("setting", [pytest.param(s, id=f"flag-{s}") for s in SETTINGS])
def test_stock_0171_differs_from_0230_on_system_user(stock: dict[str, Any], upstream: dict[str, Any], setting: str) -> None:
    # The comparison can fail: without the patch, the client system text is a second system message.
    ours, theirs = rendered(stock, setting, "system_user"), rendered(upstream, setting, "system_user")
    assert ours["ids"] != theirs["ids"]
    assert f"<|start|>system<|message|>{PIRATE}<|end|>" in ours["text"]


@pytest.mark.harness
def test_stock_0171_already_matches_0230_without_system_messages(stock: dict[str, Any], upstream: dict[str, Any]) -> None:
    # Control: the table's differences come from system/developer handling, not from the versions.
    for setting in SETTINGS:
        for case in ("no_system", "tools_no_system"):
            assert rendered(stock, setting, case)["ids"] == rendered(upstream, setting, case)["ids"], (case, setting)

