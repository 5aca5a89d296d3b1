"""SIGINT, SIGTERM and SIGHUP as part of the transaction: a command ends with one line and 128+N, never half-way.

`install()` (cli.main, before anything runs) replaces Python's default handlers. A signal is always recorded;
it is raised as `Interrupted` (a KeyboardInterrupt, so code that cleans up after Ctrl-C does so for SIGTERM
too) only while a command runs (`armed()`, the root group's invoke) and outside a critical section:
inside `deferred()` (the journalled commit, the recovery of an interrupted one, capture's patch file and
ledger) it waits until the section is done, so the transaction is complete, never torn, when the process
ends. Whatever the moment, the process says `error: interrupted by SIGINT` once and exits 130 (143 for
SIGTERM, 129 for SIGHUP); the line says whether the transaction was completed first (a signal that lands
after the commit, while the report is printed, cuts only the report). Click never sees the signal, so it
never prints `Aborted!`. This module prints nothing: `ending()` gives the line and the code, and the
command-line layer prints it (render.interrupted).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

_received: int | None = None  # the first signal that arrived
_armed = False  # a command is running: a signal may be raised
_depth = 0  # inside deferred(): a signal waits for the section's end
_raised = False  # Interrupted was raised once: later signals are only recorded
_said = False  # the one line is on stderr
_finished: str | None = None  # the critical section a deferred signal waited for
_completed: str | None = None  # the last critical section that ran to its end (a later signal cuts only the report)


class Interrupted(KeyboardInterrupt):
    """A signal ended the command (raised from the handler, or where a deferred section ends)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def install() -> None:
    """Our handler for SIGINT, SIGTERM and SIGHUP (one left ignored by the parent, as under nohup, stays ignored)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, _handler)


def closing() -> None:
    """The command is over: a signal from here on is ignored (the process ends with the command's own code).

    Python restores the default handlers while it shuts down, so a signal then would kill the process
    (exit -2 instead of 0 after a complete `apply`); one ignored stays ignored.
    """
    if threading.current_thread() is threading.main_thread():
        for sig in SIGNALS:
            if signal.getsignal(sig) is _handler:
                signal.signal(sig, signal.SIG_IGN)


def received() -> int | None:
    """The signal that arrived first (None: none did)."""
    return _received


def _handler(signum: int, _frame: object) -> None:
    global _received  # noqa: PLW0603 - a signal handler's state is module state
    if _received is None:
        _received = signum
    if _armed and not _depth and not _raised:
        _raise()


def _raise() -> None:
    global _raised  # noqa: PLW0603
    _raised = True
    raise Interrupted(_received or signal.SIGINT)


@contextmanager
def armed() -> Iterator[None]:
    """While a command runs: a signal is raised where it lands (one that came while parsing, at once)."""
    global _armed, _completed  # noqa: PLW0603
    _armed = True
    _completed = None  # this command's sections only (tests run several commands in one process)
    try:
        if _received is not None and not _depth and not _raised:
            _raise()
        yield
    finally:
        _armed = False


@contextmanager
def deferred(what: str) -> Iterator[None]:
    """A critical section (`what`: "apply", "revert", ...): a signal that lands inside is raised at its end."""
    global _depth, _finished, _completed  # noqa: PLW0603
    _depth += 1
    try:
        yield
        if _depth == 1:
            _completed = what
    finally:
        _depth -= 1
        if not _depth and _received is not None and _armed and not _raised:
            _finished = what
            _raise()  # replaces an exception under way: the section rolled back or completed either way


def message() -> str:
    """The one line: which signal, and whether the transaction was completed first (it waited for the commit, or the
    signal came after it, while the report was printed: the lines before this one are then the whole truth so far)."""
    name = signal.Signals(_received).name if _received is not None else "SIGINT"
    if _finished:
        return f"interrupted by {name}; the {_finished} already under way was completed first"
    if _completed:
        return f"interrupted by {name} after the {_completed} was complete"
    return f"interrupted by {name}"


def exit_code() -> int:
    return 128 + (_received or signal.SIGINT)


def ending() -> tuple[str | None, int]:
    """The line for the shell to print (`error: LINE`; None when it was given out already, for the same signal) and
    the exit code. A KeyboardInterrupt with no signal behind it (in-process) gets its line each time."""
    global _said, _raised  # noqa: PLW0603
    _raised = True  # from here a signal only sets the exit code
    if _said and _received is not None:
        return None, exit_code()
    _said = _received is not None
    return message(), exit_code()
