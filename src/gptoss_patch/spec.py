"""All data types: patch specs, states and results (frozen; the engine returns them, the CLI prints them)."""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from packaging.version import Version

from gptoss_patch.versions import in_range


def module_id(module_name: str) -> str:
    """A patch's id is its module's name, never typed twice (django-upgrade's Fixer(__name__))."""
    return module_name.rpartition(".")[2]


@dataclass(frozen=True)
class Band:
    """Where the patch target lives for a range of vLLM versions."""

    versions: str  # PEP 440 specifiers, pre-releases allowed
    target: str  # path relative to the installed `vllm` package


class State(str, enum.Enum):
    APPLIED = "applied"
    PENDING = "pending"
    NOT_NEEDED = "not-needed"
    FIXED_UPSTREAM = "fixed-upstream"
    OUT_OF_RANGE = "out-of-range"
    DRIFTED = "drifted"
    MODIFIED = "modified"
    OPT_IN = "opt-in"  # an opt-in patch nobody asked for: left as upstream has it
    CONFLICT = "conflict"  # a user patch that no longer applies here (or clashes with a built-in)
    ORPHANED = "orphaned"  # the ledger names it, but no installed patch set has it (a plugin removed): revert it

    @property
    def needs_action(self) -> bool:
        return self in (State.PENDING, State.DRIFTED, State.MODIFIED, State.CONFLICT, State.ORPHANED)


class PackageView:
    """Read-only access to files of the installed vLLM package, for detectors."""

    def __init__(self, package_root: Path) -> None:
        self.root = package_root

    def read_text(self, relpath: str) -> str | None:
        try:
            return (self.root / relpath).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None

    def defines(self, relpath: str, name: str) -> bool:
        """Whether the module file defines `name` at top level (a def or an assignment)."""
        text = self.read_text(relpath)
        if text is None:
            return False
        return any(line.startswith((f"def {name}(", f"{name} =", f"{name}:")) for line in text.splitlines())


class Codemod(Protocol):
    """What the engine asks of a patch's codemod: rewrite a parsed libcst module (or raise Drift).

    patches/_base.PatchCodemod is the implementation; this protocol lets the spec name it without
    importing it (that module imports libcst, and imports this one)."""

    def rewrite(self, tree: Any) -> Any: ...


@dataclass(frozen=True)
class ServeEnv:
    """An environment variable `gptoss-patch serve` sets while a patch is in effect (applied or fixed upstream)."""

    name: str
    value: str
    effect: str  # what it makes vLLM do: the plan says why it is set
    unset_why: str  # why it stays unset while the patch is not in effect (a note of the plan)
    # The launcher option that asks for it, as typed ("--instructions system"); "" = whenever the patch is in effect.
    choice: str = ""


# With this variable on, `vllm serve` (0.22.0+) answers HTTP with vllm-rs: a patch of the Python chat path
# (PatchSpec.python_frontend) is bypassed. Read by `status` and by the launcher's pre-flight (G27).
RUST_FRONTEND = "VLLM_USE_RUST_FRONTEND"


def rust_frontend_on(environ: Mapping[str, str]) -> bool:
    """Whether the variable is on: a non-zero integer, as vLLM parses it."""
    try:
        return int(environ.get(RUST_FRONTEND, "0")) != 0
    except ValueError:
        return False


@dataclass(frozen=True)
class PatchSpec:
    """Everything about one patch, declared beside its codemod in patches/<id>.py.

    Nothing else lists patches: the registry finds the modules, `verify --behaviour` finds the probe
    verify/probes/probe_<id>.py by id (a plugin's at its `probe` path), and the tests read the stock facts below (docs/adding-a-patch.md).
    """

    id: str
    summary: str
    upstream: tuple[str, ...]
    bands: tuple[Band, ...]
    # Builds the codemod class (called with the package view); a function so that `status` need not import libcst.
    codemod: Callable[[], Callable[[PackageView], Codemod]]
    # Detector of the patched shape: (module source, package) -> bool. Text in, so no libcst needed.
    is_applied: Callable[[str, PackageView], bool]
    # Detector of the upstream fix in the installed code: package -> reason, or None.
    fixed_upstream: Callable[[PackageView], str | None] = lambda _pkg: None
    # Why the patch has nothing to do on this source, or None: (source, package) -> reason.
    not_needed: Callable[[str, PackageView], str | None] = lambda _src, _pkg: None
    fixed_in: str | None = None  # first upstream release with the fix
    note: str = ""  # the truth users must hear in `list`
    after: tuple[str, ...] = ()
    # Other files of the vllm package its detectors read besides the bands' targets (the golden tests extract them).
    reads: tuple[str, ...] = ()
    # Releases (PEP 440 specifiers) whose stock code already behaves: `status` says not-needed there.
    stock_not_needed: str | None = None
    # Its behaviour probe renders through harmony, which must load the vocabulary (o200k_base).
    probe_needs_vocabulary: bool = False
    # Releases whose code the probe can exercise once patched; elsewhere it reports that it cannot run.
    probe_runs_on: str | None = None  # None: every release
    # A plugin's behaviour probe: the path of a script with REQUIRES and run(verbose), run in the target
    # interpreter like verify/probes/probe_<id>.py, which is where a built-in's probe is found instead.
    probe: str | None = None
    serve_env: tuple[ServeEnv, ...] = ()
    # Non-empty: the patch departs from upstream's behaviour on purpose, so it is left out of the default
    # set and applied only when named (--only, --with, or the hook's stored selection); the text says why.
    opt_in: str = ""
    # Something the installed code says that changes what the patch means (package -> text, or None): `status`
    # adds it to the verdict of an applied or pending patch as a warning.
    watch: Callable[[PackageView], str | None] = lambda _pkg: None
    # It changes the Python chat path (rendering, parsing): with VLLM_USE_RUST_FRONTEND=1 `vllm serve` bypasses it.
    python_frontend: bool = False

    def band_for(self, version: Version) -> Band | None:
        return next((b for b in self.bands if in_range(version, b.versions)), None)

    @property
    def versions(self) -> str:
        """All bands' ranges, for display."""
        return " | ".join(b.versions for b in self.bands)


@dataclass(frozen=True)
class PatchResult:
    """The verdict for one patch on one installation."""

    id: str
    state: State
    reason: str
    file: str | None = None  # relative to site-packages, e.g. vllm/envs.py
    changed: bool = False  # apply/revert wrote this patch's file in this run
    diff: str = ""
    warnings: tuple[str, ...] = ()
    error: str | None = None  # last line of an unexpected exception
    files: tuple[str, ...] = ()  # a user patch: every file it changes (`file` is the first)
    origin: str = ""  # "user: <patch file>" for a user patch; "" for a built-in

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "state": self.state.value, "file": self.file or "", "reason": self.reason}
        if self.origin:
            out["origin"] = self.origin
            out["files"] = list(self.files)
        if self.changed:
            out["changed"] = True
        if self.warnings:
            out["warnings"] = list(self.warnings)
        if self.error:
            out["error"] = self.error
        return out


@dataclass(frozen=True)
class Selection:
    """Which patches a command acts on (django-upgrade's Settings(only, skip))."""

    only: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()
    with_: tuple[str, ...] = ()  # opt-in patches added to the default set (--with)

    def wants(self, patch_id: str) -> bool:
        if self.only and patch_id not in self.only:
            return False
        return patch_id not in self.skip

    def includes(self, spec: PatchSpec) -> bool:
        """Whether a command acts on `spec`: wanted, and for an opt-in patch also named (--only or --with)."""
        if not self.wants(spec.id):
            return False
        return not spec.opt_in or spec.id in self.only or spec.id in self.with_

    def left_out(self, spec: PatchSpec) -> bool:
        """An opt-in patch that is wanted but not named: `status` shows it as opt-in."""
        return bool(spec.opt_in) and self.wants(spec.id) and not self.includes(spec)


@dataclass(frozen=True)
class Report:
    """What a command did: the installation it looked at and one result per patch."""

    installation: Any  # target.Installation
    results: tuple[PatchResult, ...]
    notices: tuple[str, ...] = field(default=())  # e.g. "recovered an interrupted apply"
    identity: Any = None  # releases.Identity: which checked release the installation is judged as, and why
