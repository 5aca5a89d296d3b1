"""Behavioural verification: exercise the patched code paths in the target interpreter.

All probes run in one subprocess of the target interpreter (`probes/run.py`), so vLLM's import
(about 8 s on 2 cores) is paid once. gptoss-patch itself never imports vllm. Results are returned,
never printed: `verify --behaviour` renders them.

A probe passes only on positive evidence. `passed=None` means it could not run (a package or the
harmony vocabulary is missing, no probe exists, the process timed out); a crash inside vLLM is a
failure carrying the exception's last line.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gptoss_patch import target, vocab
from gptoss_patch.errors import last_line
from gptoss_patch.registry import by_id
from gptoss_patch.verify.probes import RUNNER, probe_ids

START_DATE = "2026-01-01"  # VLLM_SYSTEM_START_DATE: a pinned date makes the rendered prompt reproducible
SET_BY_PROBES = ("VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS", "VLLM_MARLIN_USE_ATOMIC_ADD")
TIMEOUT = 600.0  # seconds for the probe process (vLLM's import, about 8 s on 2 cores, and every probe)
NO_PROBE = "no behaviour probe for this patch"
VOCAB_MISSING = "the harmony vocabulary (o200k_base.tiktoken): run `gptoss-patch vocab install`"


@dataclass(frozen=True)
class ProbeResult:
    id: str
    passed: bool | None  # None: could not run
    evidence: str
    detail: str = ""  # e.g. the rendered prompts; shown on --verbose
    missing: tuple[str, ...] = ()  # what the target environment lacks for this probe
    fix: str = ""  # the command that lets a probe that could not run run next time

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "passed": self.passed, "evidence": self.evidence}
        if self.missing:
            out["missing"] = list(self.missing)
        if self.fix:
            out["fix"] = self.fix
        if self.detail:
            out["detail"] = self.detail
        return out


def run(
    python: str, patch_ids: Sequence[str], *, verbose: bool, on_start: Callable[[str], None] | None = None,
    vocabulary: Path | None = None,
) -> list[ProbeResult]:
    """One ProbeResult per id, in order; ids without a probe come back with passed=None.

    `on_start(id)` is called as each probe starts in the target process (progress for the caller);
    `vocabulary` is --vocab (vocab.choose: else the environment, the tool's root, the target's own copy).
    """
    ids = list(dict.fromkeys(patch_ids))
    env, vocab_problem = probe_environment(os.environ, python=python, vocabulary=vocabulary)
    blocked = {pid: _vocab_blocked(pid, vocab_problem) for pid in ids if vocab_problem and needs_vocabulary(pid)}
    files = plugin_probes()
    probed = probe_ids() | set(files)
    runnable = [pid for pid in ids if pid in probed and pid not in blocked]
    ran = _run_probes(python, runnable, env, verbose, on_start, {p: files[p] for p in runnable if p in files}) if runnable else {}
    return [blocked.get(pid) or ran.get(pid) or ProbeResult(pid, None, NO_PROBE) for pid in ids]


def plugin_probes() -> dict[str, str]:
    """id -> probe script of each plugin patch that ships one (PatchSpec.probe); a built-in's probe is
    verify/probes/probe_<id>.py, which a plugin cannot shadow."""
    builtin = probe_ids()
    return {spec.id: spec.probe for spec in by_id().values() if spec.probe and spec.id not in builtin}


def probed_ids() -> frozenset[str]:
    """Every patch id with a behaviour probe, built-in or plugin."""
    return probe_ids() | frozenset(plugin_probes())


def needs_vocabulary(patch_id: str) -> bool:
    """Whether the patch's probe renders through harmony, which must load its vocabulary (its SPEC says)."""
    spec = by_id().get(patch_id)
    return spec is not None and spec.probe_needs_vocabulary


def probe_environment(
    environ: Mapping[str, str], *, python: str | None = None, vocabulary: Path | None = None
) -> tuple[dict[str, str], str | None]:
    """The probe process's environment, and why harmony could not load its vocabulary (or None).

    The vocabulary comes from the one lookup (vocab.choose) that serve uses too, so harmony never tries
    a download from inside a probe, and a probe finds what a server would.
    """
    env = dict(environ)
    env["VLLM_SYSTEM_START_DATE"] = START_DATE
    env.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    for name in SET_BY_PROBES:
        env.pop(name, None)
    chosen = vocab.choose(env, explicit=vocabulary, prefix=Path(python).parent.parent if python else None)
    env.update(chosen.exports)
    return env, None if chosen.ok else chosen.status.reason


def _vocab_blocked(probe_id: str, reason: str | None) -> ProbeResult:
    return ProbeResult(probe_id, None, f"cannot load the harmony vocabulary: {reason}", missing=(VOCAB_MISSING,), fix=vocab.FIX)


def _run_probes(
    python: str, ids: list[str], env: dict[str, str], verbose: bool, on_start: Callable[[str], None] | None = None,
    files: Mapping[str, str] | None = None,
) -> dict[str, ProbeResult]:
    """Every probe in one target.call (answers: a `start` and a `result` event per probe, as they come); killed
    after TIMEOUT. A process that died or was killed still gives the results that came before."""

    def started(event: Any) -> None:
        if on_start is not None and isinstance(event, dict) and event.get("event") == "start":
            on_start(str(event.get("id")))

    payload = json.dumps({"probes": ids, "verbose": verbose, "files": dict(files or {})})
    # -B: the probe process writes nothing, not even bytecode (into the target or into our package).
    ran = target.call(
        python, RUNNER, payload, what="the behaviour probes", flags=("-B",), env=env, timeout=TIMEOUT, on_answer=started,
        check=False,
    )  # fmt: skip
    events = [e for e in ran.answers if isinstance(e, dict)]
    if ran.failure is not None and ran.returncode is None and not ran.timed_out:  # it never started
        return {pid: ProbeResult(pid, None, ran.failure.reason) for pid in ids}
    why = f"timed out after {TIMEOUT:.0f} s" if ran.timed_out else last_line(ran.stderr, default=f"exit code {ran.returncode}")
    return _collect(python, ids, events, why, ran.returncode)


def _collect(
    python: str, ids: list[str], events: list[dict[str, Any]], why: str, code: int | None
) -> dict[str, ProbeResult]:
    """Results by id; a probe that started but never reported took the process down with it (`why`: its last line)."""
    pins = vllm_pins(python) if any(e.get("missing") for e in events) else {}
    results = {e["id"]: _result(python, e, pins) for e in events if e.get("event") == "result"}
    started = [e["id"] for e in events if e.get("event") == "start"]
    for pid in ids:
        if pid in results:
            continue
        if pid in started and code is not None:
            results[pid] = ProbeResult(pid, False, f"crashed: the probe process died (exit code {code}): {why}")
        elif pid in started:
            results[pid] = ProbeResult(pid, None, f"did not finish: {why}")
        else:
            results[pid] = ProbeResult(pid, None, f"not run: the probe process stopped before it ({why})")
    return results


def _result(python: str, event: dict[str, Any], pins: Mapping[str, str]) -> ProbeResult:
    missing = tuple(event.get("missing") or ())
    evidence = event.get("evidence", "")
    if missing:
        evidence += f"; install with: {install_missing(python, missing, pins)}"
    return ProbeResult(event["id"], event.get("passed"), evidence, event.get("detail", ""), missing)


def install_missing(python: str, missing: Sequence[str], pins: Mapping[str, str]) -> str:
    """The install line for the missing distributions, each as the installed vLLM requires it (`torch==2.11.0`):
    an unpinned `pip install torch` would take the newest torch and break that vLLM."""
    from packaging.utils import canonicalize_name

    from gptoss_patch.target import pip_command

    return pip_command(python, "install", *(pins.get(canonicalize_name(m), m) for m in missing))


def vllm_pins(python: str) -> dict[str, str]:
    """The installed vLLM's Requires-Dist with a version specifier, by canonical name (`torch` -> `torch==2.11.0`),
    read statically from its METADATA (distinfo.py; vLLM is never imported). Requirements of an extra, or whose
    marker does not hold here, are left out; {} when `python` has no vLLM."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    from gptoss_patch import distinfo, target
    from gptoss_patch.errors import TargetError

    try:
        inst = target.find(python)
        values = distinfo.requires(inst.dist_info) if inst is not None else []
    except (TargetError, OSError):
        return {}
    pins: dict[str, str] = {}
    for value in values:
        try:
            req = Requirement(value)
        except InvalidRequirement:
            continue
        if req.specifier and not (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            pins.setdefault(canonicalize_name(req.name), f"{req.name}{req.specifier}")
    return pins
