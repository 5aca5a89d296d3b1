"""The one error contract: every expected failure is a GptossPatchError with an exit code."""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum


class ExitCode(IntEnum):
    """Documented exit codes (README, "Exit codes")."""

    OK = 0
    ACTION_NEEDED = 1  # something is pending, drifted or modified; verify found a failure
    USAGE = 2  # bad command line (click's own code)
    PATCH_FAILED = 3  # a patch raised or could not be computed; nothing was written
    TARGET = 4  # no usable interpreter / vLLM, or the version is not the one asserted
    CONFLICT = 5  # a file changed behind our back; revert refused without --force
    LOCKED = 6  # another gptoss-patch run holds the lock and did not finish in time
    IO = 7  # the filesystem refused a write (read-only, full disk, permissions)


EXIT_MEANINGS = {
    ExitCode.OK: "ok",
    ExitCode.ACTION_NEEDED: "action needed",
    ExitCode.USAGE: "usage error",
    ExitCode.PATCH_FAILED: "a patch failed (nothing written)",
    ExitCode.TARGET: "target problem (interpreter, vLLM, version)",
    ExitCode.CONFLICT: "conflict (a file changed behind our back, an untrusted ledger)",
    ExitCode.LOCKED: "another run holds the lock",
    ExitCode.IO: "the filesystem refused a write",
}

# The codes a command can end with besides the ones every command has (0, 2) and those its options give it (4 with
# --python/--venv: clikit derives them). Keyed by the command as typed ("hook install"); the help ends with them.
_ON_THE_LEDGER = (ExitCode.CONFLICT, ExitCode.LOCKED)  # a command that reads the ledger under its lock
COMMAND_EXITS: dict[str, tuple[ExitCode, ...]] = {
    "apply": (ExitCode.ACTION_NEEDED, ExitCode.PATCH_FAILED, *_ON_THE_LEDGER, ExitCode.IO),
    "status": (ExitCode.ACTION_NEEDED, *_ON_THE_LEDGER),
    "diff": (ExitCode.ACTION_NEEDED, ExitCode.PATCH_FAILED, *_ON_THE_LEDGER),
    "verify": (ExitCode.ACTION_NEEDED, *_ON_THE_LEDGER),
    "revert": (*_ON_THE_LEDGER, ExitCode.IO),
    "audit": (ExitCode.ACTION_NEEDED, *_ON_THE_LEDGER),
    "capture": (ExitCode.ACTION_NEEDED, *_ON_THE_LEDGER, ExitCode.IO),
    "hook install": (ExitCode.ACTION_NEEDED, ExitCode.PATCH_FAILED, *_ON_THE_LEDGER, ExitCode.IO),
    "hook status": (ExitCode.ACTION_NEEDED,),
    "hook uninstall": (ExitCode.IO,),
    "cache clean": (ExitCode.IO,),
    "vocab install": (ExitCode.IO,),
    "vocab status": (ExitCode.ACTION_NEEDED,),
    "model random": (ExitCode.IO,),
    "doctor": (ExitCode.ACTION_NEEDED,),
    "smoke": (ExitCode.ACTION_NEEDED,),
    "serve": (ExitCode.ACTION_NEEDED,),
    "bench": (ExitCode.ACTION_NEEDED,),
    "numerics": (ExitCode.ACTION_NEEDED,),
    "tune": (ExitCode.ACTION_NEEDED, ExitCode.LOCKED, ExitCode.IO),
    "venv create": (ExitCode.ACTION_NEEDED, ExitCode.PATCH_FAILED, ExitCode.TARGET, *_ON_THE_LEDGER, ExitCode.IO),
}
COMMAND_EXIT_NOTES = {"serve": "otherwise vLLM's own exit code"}


def exit_codes_help(command: str, *, targets: bool) -> str:
    """`Exit codes: 0 ok, 1 action needed, 2 usage error, ...`: the last paragraph of a command's --help."""
    codes = {ExitCode.OK, ExitCode.USAGE, *COMMAND_EXITS.get(command, ()), *((ExitCode.TARGET,) if targets else ())}
    listed = ", ".join(f"{int(code)} {EXIT_MEANINGS[code]}" for code in sorted(codes))
    note = COMMAND_EXIT_NOTES.get(command)
    return f"Exit codes: {listed}{'; ' + note if note else ''}."


class GptossPatchError(Exception):
    """An expected failure: one line for the user, an optional hint, an exit code.

    `detail` (a subprocess's whole output, say) is shown only under -v; the error line stays one line.
    `last_lines`: the end of a failed process's output (a server's log, an interpreter's stderr), shown after the
    error line unless `detail` holds the whole of it (then -v shows that), and always in the JSON error.
    """

    exit_code: int = ExitCode.PATCH_FAILED

    def __init__(
        self, message: str, *, hint: str | None = None, detail: str | None = None, last_lines: Sequence[str] = ()
    ) -> None:
        super().__init__(message)
        self.hint = hint
        self.detail = detail
        self.last_lines = tuple(last_lines)


class UsageError(GptossPatchError):
    exit_code = ExitCode.USAGE


class TargetError(GptossPatchError):
    """The interpreter or the vLLM installation cannot be used as asked."""

    exit_code = ExitCode.TARGET


class PatchFailed(GptossPatchError):
    exit_code = ExitCode.PATCH_FAILED


class Conflict(GptossPatchError):
    exit_code = ExitCode.CONFLICT


class Locked(GptossPatchError):
    exit_code = ExitCode.LOCKED


class WriteFailed(GptossPatchError):
    exit_code = ExitCode.IO


class InterpreterFailed(TargetError):
    """Code run in the target interpreter (target.call) gave no answer: it could not start, ran past its timeout,
    exited with an error, or printed no answer. The line is `WHAT (exit N): REASON` (no exit code where it did not
    exit with one), the reason being its last meaningful stderr line, or the timeout, or why it could not start;
    `last_lines` is the end of its stderr, `detail` all of it (-v)."""

    def __init__(
        self, what: str, reason: str, *, stderr: str = "", returncode: int | None = None, hint: str | None = None
    ) -> None:
        code = f" (exit {returncode})" if returncode is not None and returncode > 0 else ""
        shown = reason if len(reason) <= REASON_CHARS else reason[: REASON_CHARS - 1] + "…"
        super().__init__(f"{what}{code}: {shown}", hint=hint, detail=stderr.rstrip() or None, last_lines=last_lines(stderr))
        self.what = what
        self.reason = reason
        self.returncode = returncode


class CheckFailed(GptossPatchError):
    """A launcher check failed: pre-flight, the startup-log sentinel or the smoke canary (serve/doctor/smoke)."""

    exit_code = ExitCode.ACTION_NEEDED


TAIL_LINES = 15  # how many of a failed process's last lines an error carries (`last_lines`)
REASON_CHARS = 200  # an error line quotes this much of a failed process's last line at most (-v shows it whole)
_NOISE = ("[notice] ",)  # pip's "a new release of pip is available": never the reason anything failed


def meaningful_lines(text: str) -> list[str]:
    """A process's output without blank lines and pip's notices, each line stripped: what names a failure."""
    lines = (line.strip() for line in text.splitlines())
    return [line for line in lines if line and not line.startswith(_NOISE)]


def last_line(text: str, default: str = "no output") -> str:
    """The last meaningful line of a process's output (a traceback's last line is the exception): the one spelling
    of "its last stderr line" in an error line; `default` when there is none."""
    lines = meaningful_lines(text)
    return lines[-1] if lines else default


def last_lines(text: str, count: int = TAIL_LINES) -> tuple[str, ...]:
    """The last `count` meaningful lines of a process's output: what an error carries as `last_lines`."""
    return tuple(meaningful_lines(text)[-count:])


def cause(exc: BaseException) -> str:
    """What went wrong, in words, for an error line: an OSError's strerror ("Permission denied"), else the
    exception's own first line; its class name only when it says nothing else (-v shows the class: `detail_of`)."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def detail_of(exc: BaseException) -> str:
    """The exception as -v shows it: its class and its whole text."""
    return f"{type(exc).__name__}: {exc}"
