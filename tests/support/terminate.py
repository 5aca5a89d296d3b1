"""SIGTERM ends a pytest run as Ctrl-C does: the running test's `finally` blocks and every fixture's tear-down run.

Without this, SIGTERM (what `.ci/run` sends a lane it stops, and what `timeout` and CI runners send) kills pytest on
the spot: no `finally`, no tear-down, so what a test keeps outside pytest's tmp_path (the cold demo's root under
/tmp) stays behind. The servers and builds a test started are in the lane's process group and get the signal
themselves; the sender's SIGKILL after its grace period bounds the tear-downs.
"""

from __future__ import annotations

import signal
from types import FrameType

import pytest


def install() -> None:
    """SIGTERM raises KeyboardInterrupt once; a second one during the tear-downs is ignored, so it cannot cut them
    short. Left alone where SIGTERM is already handled or ignored (the caller's choice)."""
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return
    fired = False

    def terminated(signum: int, frame: FrameType | None) -> None:
        nonlocal fired
        if not fired:
            fired = True
            raise KeyboardInterrupt("SIGTERM")

    signal.signal(signal.SIGTERM, terminated)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    install()
