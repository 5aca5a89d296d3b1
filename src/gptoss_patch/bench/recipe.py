"""`bench --compare recipe`: vLLM's published Hopper config for gpt-oss (GPT-OSS_Hopper.yaml, quoted by the gpt-oss
recipe guide) as a server of its own, its flags limited to what the installed release accepts, and the notes the
table needs: which of them this release already defaults to, which it lacks, and what --stream-interval distorts."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

# GPT-OSS_Hopper.yaml, flag by flag (the values as published).
HOPPER = (
    ("--no-enable-prefix-caching",),
    ("--max-cudagraph-capture-size", "2048"),
    ("--max-num-batched-tokens", "8192"),
    ("--stream-interval", "20"),
    ("--async-scheduling",),
)
SOURCE = "vLLM's GPT-OSS_Hopper.yaml"
# vLLM's benchmark figures that count tokens as they arrive: with --stream-interval N they come N at a time.
DISTORTED_BY_STREAM_INTERVAL = ("peak tok/s", "inter-token latency")


@dataclass(frozen=True)
class RecipeArgs:
    argv: tuple[str, ...]
    notes: tuple[str, ...]


def hopper_args(accepts: Callable[[str], bool], defaults: Mapping[str, str], version: object) -> RecipeArgs:
    """The recipe's flags the release accepts (`accepts(flag)`: static.Capabilities.has_flag); a flag it lacks is
    left out with a note, one it already defaults to is kept (the config is run as published) and named."""
    argv: list[str] = []
    notes: list[str] = []
    for flag, *values in HOPPER:
        if not accepts(flag):
            notes.append(f"recipe: {' '.join((flag, *values))} left out: vLLM {version} has no {flag}")
            continue
        argv += [flag, *values]
        default = defaults.get(flag)
        if default is not None and (not values or default.split()[0] == values[0]):
            notes.append(f"recipe: {' '.join((flag, *values))} is already vLLM {version}'s default ({default})")
    return RecipeArgs(tuple(argv), tuple(notes))


def stream_interval(argv: Sequence[str]) -> int:
    """The --stream-interval a server runs with (the last one given; vLLM's default 1)."""
    from gptoss_patch.launcher.static import last_value

    value = last_value(list(argv), "--stream-interval")
    return int(value) if value and value.isdigit() else 1
