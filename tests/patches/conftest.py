"""Fixtures shared by the patch unit tests: fake vLLM package trees, and verdicts on the real wheels."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from packaging.version import Version

from gptoss_patch.spec import PackageView


@pytest.fixture
def fake_package(tmp_path: Path) -> Callable[..., PackageView]:
    """Build a fake `vllm` package from {relative path: hand-written source}; one tree per `name`."""

    def build(files: dict[str, str], name: str = "site") -> PackageView:
        root = tmp_path / name / "vllm"
        root.mkdir(parents=True, exist_ok=True)
        for relpath, text in files.items():
            (root / relpath).parent.mkdir(parents=True, exist_ok=True)
            (root / relpath).write_text(textwrap.dedent(text))
        return PackageView(root)

    return build



@pytest.fixture(scope="session")
def real_states(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], dict[str, tuple[str, str]]]:
    """`status` of every patch on the files of the real vllm==version wheel: {id: (state, reason)}.

    The real engine runs on a tree extracted from the cached wheel (checked against its RECORD);
    a wheel that is neither cached nor downloadable fails the test with a message.
    """
    from gptoss_patch import engine
    from gptoss_patch.spec import Selection
    from tests.support.golden import extracted

    cache: dict[str, dict[str, tuple[str, str]]] = {}

    def states(version: str) -> dict[str, tuple[str, str]]:
        if version not in cache:
            inst = extracted(Version(version), tmp_path_factory.mktemp(f"vllm-{version}"))
            cache[version] = {r.id: (r.state.value, r.reason) for r in engine.status(inst, Selection()).results}
        return cache[version]

    return states
