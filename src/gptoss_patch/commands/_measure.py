"""Options shared by the commands that start servers of their own and measure them: bench, numerics, tune (private:
cli.py registers only public modules).

Their launch options are _launch's group (`ServersLaunchGroup`, `TuneLaunchGroup`); the options after their own,
--start-timeout, --log-dir, --json and --verbose, are this module's group (`RunOptions`, a clikit.Group), which
reaches the command as one ServerRun.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from gptoss_patch import clikit
from gptoss_patch.commands._launch import LogDirOption, StartTimeoutOption
from gptoss_patch.options import JsonOption, VerboseOption

# The workload of bench and tune (vllm bench serve's random dataset).
InputLenOption = Annotated[int, clikit.Option("--input-len", help="Prompt tokens per request (random dataset).")]
OutputLenOption = Annotated[int, clikit.Option("--output-len", help="Generated tokens per request (ignore_eos).")]


@dataclass(frozen=True)
class ServerRun:
    """How a measuring command runs its servers and reports: --start-timeout, --log-dir, --json, --verbose."""

    start_timeout: float
    log_dir: Path | None
    json: bool
    verbose: int

    def logs(self, command: str) -> Path:
        """--log-dir, else a new directory per run beside serve's logs, named for the command (bench-..., tune-...)."""
        if self.log_dir is not None:
            return self.log_dir
        from gptoss_patch.bench import launch as servers

        default = servers.default_log_dir()
        return default.with_name(default.name.replace("bench-", f"{command}-", 1))


# The group declared once: a command's `run: RunOptions` parameter becomes these options, where it stands (last, in
# bench, numerics and tune: their --help lists them there).
RunOptions = Annotated[ServerRun, clikit.Group(ServerRun, {
    "start_timeout": (StartTimeoutOption, 900.0),
    "log_dir": (LogDirOption, None),
    "json": (JsonOption, False),
    "verbose": (VerboseOption, False),
})]  # fmt: skip
