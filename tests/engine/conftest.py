"""The engine tests' one real installation: a private --no-deps venv of the vLLM 0.17.1 wheel."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.markers import needs
from tests.support.safety import VERSION
from tests.support.upstream import fresh_install


@pytest.fixture
@needs("upstream")
def venv(tmp_path: Path) -> Path:
    """A hardlinked clone of the cached --no-deps venv of vLLM `safety.VERSION` (0.17.1); a module that tests a
    fake site instead defines its own `venv`, which wins over this one."""
    fresh_install(VERSION, tmp_path / "venv")
    return tmp_path / "venv"
