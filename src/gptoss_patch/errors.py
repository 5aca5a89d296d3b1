"""The one error contract: every expected failure is a GptossPatchError with an exit code."""

from __future__ import annotations

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


class GptossPatchError(Exception):
    """An expected failure: one line for the user, an optional hint, an exit code.

    `detail` (a subprocess's whole output, say) is shown only under -v; the error line stays one line.
    """

    exit_code: ExitCode = ExitCode.PATCH_FAILED

    def __init__(self, message: str, *, hint: str | None = None, detail: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint
        self.detail = detail


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


class CheckFailed(GptossPatchError):
    """A launcher check failed: pre-flight, the startup-log sentinel or the smoke canary (serve/doctor/smoke)."""

    exit_code = ExitCode.ACTION_NEEDED
