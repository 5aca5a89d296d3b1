"""What a bench run is: its servers, its workload, and the checks of the command line's own values."""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gptoss_patch.errors import CheckFailed, UsageError

COMPARISONS = ("vanilla", "eager", "recipe")
DEFAULT_CONCURRENCY = (1, 2, 4, 5, 8, 10, 16, 32, 64)
SHARED_MEMORY_UTILIZATION = "0.44"  # each of two servers on one GPU (vLLM's default is 0.9 for one)


class BenchFailed(CheckFailed):
    """A server or the benchmark failed: one line, plus the server's last log lines for the caller to show."""

    def __init__(self, message: str, *, last_lines: Sequence[str] = (), log_file: Path | None = None) -> None:
        super().__init__(message, hint=f"log: {log_file}" if log_file else None)
        self.last_lines = tuple(last_lines)
        self.log_file = log_file


@dataclass(frozen=True)
class ServerSpec:
    """One server to start: `name` is profile, vanilla, eager or a --variant's NAME."""

    name: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(repr=False)
    port: int
    served_model: str
    gpus: int = 1  # tensor x pipeline x data-parallel size of its command line: per-GPU figures divide by it

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def command_line(self) -> str:
        return " ".join(self.argv)


@dataclass(frozen=True)
class Workload:
    """What each `vllm bench serve` run sends: fixed lengths, `waves` prompts per concurrent stream."""

    model: str  # tokenizer path for the random dataset (the model directory or id)
    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    repeat: int = 3
    input_len: int = 128
    output_len: int = 256
    waves: int = 2
    min_prompts: int = 2
    warm_up: bool = True  # an untimed run per server at every concurrency before round 1 (schedule.warmups)

    def prompts(self, concurrency: int) -> int:
        return max(self.min_prompts, self.waves * concurrency)


def parse_compare(text: str | None) -> tuple[str, ...]:
    if not text:
        return ()
    names = tuple(dict.fromkeys(item.strip() for item in text.split(",")))
    unknown = [n for n in names if n not in COMPARISONS]
    if unknown or not names:
        raise UsageError(f"--compare {text!r}: expected {', '.join(COMPARISONS)} (comma-separated for several)")
    return names


def check_repeat(repeat: int) -> int:
    if repeat < 1:
        raise UsageError(f"--repeat {repeat}: expected 1 or more rounds")
    return repeat


def require_bench(package_root: Path, python: str) -> None:
    """`vllm bench serve` is vllm/benchmarks/serve.py (read statically, before any server starts)."""
    if not (Path(package_root) / "benchmarks" / "serve.py").is_file():
        raise BenchFailed(
            f"vllm bench serve is not available in {python}: no vllm/benchmarks/serve.py in {package_root}"
        )


VARIANT_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,31}")


def parse_variants(texts: Sequence[str], taken: Sequence[str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """`NAME=ARGS` items: the profile server again with ARGS (shell words) added, named NAME."""
    variants: dict[str, tuple[str, ...]] = {}
    for text in texts:
        name, sep, words = text.partition("=")
        name = name.strip()
        if not sep or not VARIANT_NAME.fullmatch(name):
            raise UsageError(
                f"--variant {text!r}: expected NAME=ARGS, NAME in lower-case letters, digits, '_', '-', '.'"
            )
        if name in ("profile", *COMPARISONS, *taken, *variants):
            raise UsageError(f"--variant {text!r}: the name {name!r} is already a server of this run")
        try:
            args = tuple(shlex.split(words))
        except ValueError as exc:
            raise UsageError(f"--variant {text!r}: {exc}") from None
        if not args:
            raise UsageError(f"--variant {text!r}: no arguments after '='")
        variants[name] = args
    return tuple(variants.items())
