"""Test configuration: isolated environment variables, pinned rich width, upstream wheel options."""

from __future__ import annotations

import os

import pytest

pytest.register_assert_rewrite("tests.tools")


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("VLLM_", "GPTOSS_PATCH_TEST_", "TIKTOKEN_")):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COLUMNS", "3000")
    monkeypatch.setenv("NO_COLOR", "1")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="rewrite patches/<id>/vllm-<version>.diff")
