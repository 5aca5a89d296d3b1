"""Patch discovery: a walk of gptoss_patch.patches; each public module's SPEC is one patch."""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from gptoss_patch import patches
from gptoss_patch.errors import UsageError
from gptoss_patch.spec import PatchSpec, Selection


@cache
def all_specs() -> tuple[PatchSpec, ...]:
    """Every patch, ordered by `after=` and then by id."""
    specs: dict[str, PatchSpec] = {}
    for info in pkgutil.iter_modules(patches.__path__):
        if info.name.startswith("_"):
            continue
        spec = importlib.import_module(f"{patches.__name__}.{info.name}").SPEC
        if spec.id != info.name or spec.id in specs:
            raise RuntimeError(f"patch module {info.name} declares id {spec.id!r}")
        specs[spec.id] = spec
    return tuple(_ordered(specs))


def _ordered(specs: dict[str, PatchSpec]) -> list[PatchSpec]:
    done: list[PatchSpec] = []
    pending = sorted(specs)
    while pending:
        ready = [i for i in pending if all(dep in {s.id for s in done} for dep in specs[i].after)]
        if not ready:
            raise RuntimeError(f"patches with unknown or circular `after=`: {', '.join(pending)}")
        done.append(specs[ready[0]])
        pending.remove(ready[0])
    return done


def ids() -> tuple[str, ...]:
    return tuple(spec.id for spec in all_specs())


@cache
def by_id() -> dict[str, PatchSpec]:
    return {spec.id: spec for spec in all_specs()}


def check_ids(names: tuple[str, ...], extra: tuple[str, ...] = ()) -> None:
    """Every name must be a patch id, or one of `extra` (the user patches' names)."""
    known = (*ids(), *extra)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"unknown patch id {unknown[0]!r}; known: {', '.join(known)}")


def selection(only: list[str] | None, skip: list[str] | None, extra: tuple[str, ...] = ()) -> Selection:
    chosen = Selection(only=tuple(only or ()), skip=tuple(skip or ()))
    check_ids(chosen.only + chosen.skip, extra)
    return chosen


def selected(chosen: Selection) -> tuple[PatchSpec, ...]:
    return tuple(spec for spec in all_specs() if chosen.wants(spec.id))
