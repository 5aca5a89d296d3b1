"""Data types of the launcher: check verdicts, resolved settings, the launch plan, run and smoke outcomes."""

from __future__ import annotations

import enum
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # types only: these modules import this one
    from gptoss_patch.launcher.options import LaunchOptions
    from gptoss_patch.launcher.parallel import Context
    from gptoss_patch.launcher.static import Capabilities
    from gptoss_patch.spec import Report
    from gptoss_patch.target import Installation
    from gptoss_patch.vocab import Choice


class Status(str, enum.Enum):
    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True)
class Check:
    """One named pre-flight (or smoke) verdict with a one-line fix."""

    name: str
    status: Status
    message: str
    fix: str = ""
    issue: str = ""  # known-issue id (G01...) from docs/known-issues.md, when one applies

    def to_json(self) -> dict[str, str]:
        out = {"name": self.name, "status": self.status.value, "message": self.message, "fix": self.fix}
        if self.issue:
            out["issue"] = self.issue
        return out


def worst(checks: tuple[Check, ...] | list[Check]) -> Status:
    statuses = {c.status for c in checks}
    return next((s for s in (Status.FAIL, Status.WARN) if s in statuses), Status.PASS)


@dataclass(frozen=True)
class Setting:
    """One flag or environment variable the launcher adds, with the reason it is there."""

    kind: Literal["flag", "env"]
    name: str  # "--kv-cache-dtype" or "VLLM_MXFP4_USE_MARLIN"
    values: tuple[str, ...]  # flag arguments (none for a switch); exactly one for env
    why: str

    @classmethod
    def flag(cls, name: str, *values: str, why: str) -> Setting:
        return cls("flag", name, tuple(values), why)

    @classmethod
    def env(cls, name: str, value: str, *, why: str) -> Setting:
        return cls("env", name, (value,), why)

    @property
    def argv(self) -> tuple[str, ...]:
        return (self.name, *self.values) if self.kind == "flag" else ()

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "values": list(self.values), "why": self.why}


@dataclass(frozen=True)
class Tuned:
    """What `gptoss-patch tune` left for this launch (tune/profile.py finds it): a profile of the same GPU, vLLM and model
    shape (`used`: its settings join the plan), one of another vLLM or GPU (`stale`), or one that cannot be read
    (`corrupt`); the last two add nothing. `line` is the one line serve and doctor print."""

    state: Literal["used", "stale", "corrupt"]
    path: Path
    line: str
    settings: tuple[Setting, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "path": str(self.path), "line": self.line, "settings": [s.to_json() for s in self.settings]}


@dataclass(frozen=True)
class LaunchPlan:
    """Everything `vllm serve` will be started with, and why; built by plan.resolve()."""

    installation: Installation
    executable: Path
    model: str
    profile: str
    profile_source: str
    settings: tuple[Setting, ...]
    notes: tuple[str, ...]  # profile items left out, each with its reason
    extra_args: tuple[str, ...]  # the user's own `vllm serve` arguments (after --)
    base_env: Mapping[str, str] = field(repr=False)
    patch_report: Report  # from engine.status
    capabilities: Capabilities  # of the installed vLLM
    options: LaunchOptions  # what the plan was resolved from
    vocabulary: Choice  # plan.vocabulary_choice: what harmony loads in the server, and from where
    parallel: Context  # the TP/DP sizes, the GPUs nvidia-smi lists, the model's shape
    expected_moe: str | None = None  # MoE backend family the profile pinned ("MARLIN"), checked in the log
    # The server's module, run as `python -m MODULE --model M`, where the `vllm` script cannot start it.
    server_module: str | None = None
    tuned: Tuned | None = None  # the tuned profile found for this stack (used, stale or corrupt); None: none, or --no-tuned

    @property
    def entry(self) -> list[str]:
        """What follows the executable before the flags: `serve MODEL`, or `-m MODULE --model MODEL`."""
        if self.server_module:
            return ["-m", self.server_module, "--model", self.model]
        return ["serve", self.model]

    @property
    def vllm_flags(self) -> list[str]:
        """vLLM's arguments after the model (the profile's settings, then the user's own, which win): what every check
        of the command line reads, whichever entry starts the server (`argv[3:]` was wrong for `-m MODULE`)."""
        return [*(arg for s in self.settings for arg in s.argv), *self.extra_args]

    @property
    def argv(self) -> list[str]:
        return [str(self.executable), *self.entry, *self.vllm_flags]

    @property
    def env_additions(self) -> dict[str, str]:
        return {s.name: s.values[0] for s in self.settings if s.kind == "env"}

    @property
    def env(self) -> dict[str, str]:
        return {**self.base_env, **self.env_additions}

    @property
    def command_line(self) -> str:
        return shlex.join(self.argv)


@dataclass(frozen=True)
class KnownIssue:
    id: str  # "G01"
    title: str
    fix: str


@dataclass(frozen=True)
class SmokeReport:
    url: str
    model: str
    checks: tuple[Check, ...]
    content: str | None = None
    tokens_per_second: float | None = None

    @property
    def ok(self) -> bool:
        return worst(self.checks) is not Status.FAIL

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "model": self.model,
            "ok": self.ok,
            "tokens_per_second": self.tokens_per_second,
            "content": self.content,
            "checks": [c.to_json() for c in self.checks],
        }


@dataclass(frozen=True)
class RunOutcome:
    """How a supervised `vllm serve` ended."""

    exit_code: int
    log_file: Path
    ready_after: float | None = None  # seconds from start to the first healthy /health
    moe_backend: str | None = None  # as recognised in the startup log
    stopped_for: str | None = None  # why the launcher stopped vLLM itself, if it did
    last_lines: tuple[str, ...] = ()
    known_issue: KnownIssue | None = None
    smoke: SmokeReport | None = None
    signal: int | None = None  # the first signal forwarded to vLLM (Ctrl-C, SIGTERM, SIGHUP): serve exits 128+N
