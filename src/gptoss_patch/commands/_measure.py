"""Options shared by the commands that start servers of their own and measure them: bench, numerics, tune (private:
cli.py registers only public modules).

Their launch options are _launch.launch_options' group; the options after their own, --start-timeout, --log-dir,
--json and --verbose, are this module's group (`run_options`), which reaches the command as one ServerRun.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

from gptoss_patch import clikit
from gptoss_patch.commands._launch import LogDirOption, StartTimeoutOption
from gptoss_patch.options import JsonOption, VerboseOption

F = TypeVar("F", bound=Callable[..., Any])

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


_GROUP = {
    "start_timeout": (StartTimeoutOption, 900.0),
    "log_dir": (LogDirOption, None),
    "json": (JsonOption, False),
    "verbose": (VerboseOption, False),
}


def run_options(func: F) -> F:
    """The group declared once: the command's `run: ServerRun` parameter becomes these options, where it stands
    (last, in bench, numerics and tune: their --help lists them there)."""
    hints = typing.get_type_hints(func, include_extras=True)
    keyword = inspect.Parameter.KEYWORD_ONLY
    group = [inspect.Parameter(name, keyword, annotation=hint, default=value) for name, (hint, value) in _GROUP.items()]
    own = inspect.signature(func).parameters.values()
    params = [q for p in own for q in (group if p.name == "run" else [p.replace(kind=keyword, annotation=hints[p.name])])]

    @functools.wraps(func)
    def command(**kwargs: Any) -> Any:
        run = ServerRun(**{name: kwargs.pop(name) for name in _GROUP})
        return func(run=run, **kwargs)

    del command.__wrapped__  # clikit and launch_options read the signature below, not func's
    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    return command  # type: ignore[return-value]
