"""Child processes that start as a command typed at a terminal would.

Under `nohup`, or as a background job of a non-interactive script (how CI runners and `nohup bash .ci/run &`
start the suite), SIGHUP or SIGINT reach every child already ignored, and gptoss-patch keeps an ignored
signal ignored (the Unix convention; gptoss_patch.interrupts). A test that sends a child one of these
signals passes `preexec_fn=default_signals` so that its result does not depend on how the suite was started.
"""

from __future__ import annotations

import signal

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def default_signals() -> None:
    """In the child, before exec: the default disposition for SIGINT, SIGTERM and SIGHUP."""
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
