"""Patch discovery: a walk of gptoss_patch.patches (each public module's SPEC is one patch), then the
patch sets other packages ship through the entry-point group `gptoss_patch.patches` (docs/plugins.md).

A plugin entry point `ID = package.module` names a module whose SPEC is a PatchSpec with that id, the
same contract as a built-in. A plugin that cannot be loaded, or breaks the contract, is left out and
described in `plugin_problems()` (the CLI prints one line each); the other patches are not affected.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from functools import cache

from gptoss_patch import patches
from gptoss_patch.errors import UsageError
from gptoss_patch.spec import PatchSpec, Selection

ENTRY_POINT_GROUP = "gptoss_patch.patches"
BUILT_IN = "built-in"


@cache
def all_specs() -> tuple[PatchSpec, ...]:
    """Every patch, built-in and from plugins, ordered by `after=` and then by id."""
    specs: dict[str, PatchSpec] = {}
    for info in pkgutil.iter_modules(patches.__path__):
        if info.name.startswith("_"):
            continue
        spec = importlib.import_module(f"{patches.__name__}.{info.name}").SPEC
        if spec.id != info.name or spec.id in specs:
            raise RuntimeError(f"patch module {info.name} declares id {spec.id!r}")
        specs[spec.id] = spec
    specs.update(_plugins(set(specs)))
    return tuple(_ordered(specs))


_origins: dict[str, str] = {}
_problems: list[str] = []


def origin(patch_id: str) -> str:
    """`built-in`, or `plugin <distribution> <version>` for a patch another package ships."""
    all_specs()
    return _origins.get(patch_id, BUILT_IN)


def plugin_problems() -> tuple[str, ...]:
    """One line per plugin entry point that was left out, and why."""
    all_specs()
    return tuple(_problems)


def _plugins(builtin: set[str]) -> dict[str, PatchSpec]:
    found: dict[str, PatchSpec] = {}
    for name, value, where in _entry_points():
        try:
            spec = getattr(importlib.import_module(value.partition(":")[0].strip()), "SPEC", None)
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not hide the others
            _problems.append(f"{where}: patch {name!r} ({value}) cannot be imported: {type(exc).__name__}: {exc}".splitlines()[0])
            continue
        why = _breaks_contract(name, spec, builtin | set(found))
        if why:
            _problems.append(f"{where}: patch {name!r} ({value}) left out: {why}")
            continue
        assert isinstance(spec, PatchSpec)
        found[spec.id] = spec
        _origins[spec.id] = where
    unknown_after = [s for s in found.values() if any(dep not in builtin | set(found) for dep in s.after)]
    for spec in unknown_after:
        _problems.append(f"{_origins.pop(spec.id)}: patch {spec.id!r} left out: `after=` names an unknown patch")
        del found[spec.id]
    return found


def _entry_points() -> list[tuple[str, str, str]]:
    """(name, module, "plugin <dist> <version>") of the group, read from the entry_points.txt files on sys.path.

    importlib.metadata would do the same, but importing it costs more than `status` itself on a
    patched installation; a directory listing per sys.path entry and a substring test cost next to nothing.
    """
    import os
    import sys

    found: dict[str, tuple[str, str, str]] = {}
    for entry in sys.path:
        try:
            names = sorted(n for n in os.listdir(entry or ".") if n.endswith((".dist-info", ".egg-info")))
        except OSError:
            continue
        for dist in names:
            try:
                with open(os.path.join(entry or ".", dist, "entry_points.txt"), encoding="utf-8") as handle:
                    text = handle.read()
            except OSError:
                continue
            if f"[{ENTRY_POINT_GROUP}]" not in text:
                continue
            from gptoss_patch import distinfo  # only when a plugin is installed: `status` imports nothing more

            where = "plugin " + distinfo.label(os.path.join(entry or ".", dist))
            for name, value in _group(text):
                found.setdefault(name, (name, value, where))  # the first on sys.path wins, as for imports
    return [found[n] for n in sorted(found)]


def _group(text: str) -> list[tuple[str, str]]:
    rows, inside = [], False
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("["):
            inside = line == f"[{ENTRY_POINT_GROUP}]"
        elif inside and "=" in line and not line.startswith(("#", ";")):
            name, _, value = line.partition("=")
            rows.append((name.strip(), value.strip()))
    return rows


def _breaks_contract(name: str, spec: object, taken: set[str]) -> str | None:
    if not isinstance(spec, PatchSpec):
        return "its module has no SPEC = PatchSpec(...)"
    if spec.id != name:
        return f"its SPEC declares id {spec.id!r}, not the entry point's name"
    if spec.id in taken:
        return "a patch with that id exists already"
    if not spec.bands:
        return "its SPEC has no bands"
    if spec.probe is not None and not (os.path.isabs(spec.probe) and spec.probe.endswith(".py") and os.path.isfile(spec.probe)):
        return f"its SPEC's probe {spec.probe!r} is not the absolute path of a .py file"
    return None


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


def selection(
    only: list[str] | None, skip: list[str] | None, with_: list[str] | None = None, extra: tuple[str, ...] = ()
) -> Selection:
    chosen = Selection(only=tuple(only or ()), skip=tuple(skip or ()), with_=tuple(with_ or ()))
    check_ids(chosen.only + chosen.skip, extra)
    check_ids(chosen.with_)
    not_opt_in = [n for n in chosen.with_ if not by_id()[n].opt_in]
    if not_opt_in:
        opt_ins = ", ".join(s.id for s in all_specs() if s.opt_in) or "none"
        raise UsageError(f"--with takes an opt-in patch; {not_opt_in[0]!r} is in the default set (opt-in: {opt_ins})")
    return chosen


def selected(chosen: Selection, *, opt_in: bool = False) -> tuple[PatchSpec, ...]:
    """The patches a command acts on; `opt_in=True` adds every wanted opt-in patch (revert undoes them too)."""
    return tuple(spec for spec in all_specs() if chosen.includes(spec) or (opt_in and chosen.wants(spec.id)))
