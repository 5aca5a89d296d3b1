"""Install, inspect and remove the runtime guard (plugin.py) in a vLLM environment.

What `install` puts into the target's site-packages, every file listed in our own RECORD:
  gptoss_patch_hook.py                 a verbatim copy of gptoss_patch/hook/plugin.py (stdlib only)
  gptoss_patch_hook.json               the expectation: vLLM version, patch ids, file hashes, mode
  gptoss_patch_hook-<ver>.dist-info/   METADATA, INSTALLER, WHEEL, entry_points.txt ([vllm.general_plugins]), RECORD
and, once Python has imported the module, __pycache__/gptoss_patch_hook.<tag>.pyc.

The expectation lives with the hook, not in vLLM's .dist-info: a reinstall of vLLM removes the
ledger (on purpose, see engine/record.py) but must not remove what the hook expects to find.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gptoss_patch import __version__, distinfo, engine, registry, userpatches
from gptoss_patch.engine import record
from gptoss_patch.engine.ledger import Store
from gptoss_patch.errors import Conflict, InterpreterFailed, PatchFailed, UsageError, WriteFailed
from gptoss_patch.fsutil import atomic_write, sha256, write_failed
from gptoss_patch.hook import plugin
from gptoss_patch.spec import Report, Selection, State
from gptoss_patch.target import Installation, answer_line, call

MODULE = "gptoss_patch_hook"
DIST_NAME = "gptoss-patch-hook"
ENTRY_POINT = f"[vllm.general_plugins]\ngptoss_patch = {MODULE}:check\n"
EXPECTED_STATES = (State.APPLIED, State.PENDING)  # what the installed vLLM should carry


@dataclass(frozen=True)
class Layout:
    """Where the hook's files are in one site-packages directory."""

    site: Path

    @property
    def module(self) -> Path:
        return self.site / f"{MODULE}.py"

    @property
    def state(self) -> Path:
        return self.site / f"{MODULE}.json"

    def dist_info(self, version: str = __version__) -> Path:
        return self.site / f"{MODULE}-{version}.dist-info"

    def installed_dist_infos(self) -> list[Path]:
        return sorted(self.site.glob(f"{MODULE}-*.dist-info"))

    def bytecode(self) -> list[Path]:
        return sorted((self.site / "__pycache__").glob(f"{MODULE}.*.pyc"))

    def traces(self) -> list[Path]:
        """Everything of ours that exists now (uninstall removes exactly this)."""
        files = [p for p in (self.module, self.state) if p.is_file()]
        return [*self.installed_dist_infos(), *files, *self.bytecode()]


@dataclass(frozen=True)
class HookStatus:
    """`hook status`: is the hook there, is its code current, and what would it decide right now."""

    layout: Layout
    installed: bool
    version: str | None  # gptoss-patch version that installed it
    current_code: bool  # the installed module is byte-identical to this gptoss-patch's plugin.py
    state: dict[str, Any] | None
    state_problem: str | None
    verdict: plugin.Verdict | None

    @property
    def ok(self) -> bool:
        return self.installed and self.current_code and not self.state_problem and not (self.verdict and self.verdict.problems)

    def to_json(self) -> dict[str, Any]:
        state = self.state or {}
        return {
            "installed": self.installed, "site_packages": str(self.layout.site), "hook_version": self.version,
            "current_code": self.current_code, "mode": state.get("mode"), "expected_vllm": state.get("vllm"),
            "expected_patches": sorted(state.get("patches", {})), "state_problem": self.state_problem,
            "check": self.verdict.to_json() if self.verdict else None, "ok": self.ok,
        }


# -- install -------------------------------------------------------------------------------------


def check_mode(mode: str | None) -> None:
    """Bad input before any lookup: `--mode bogus` is a usage error (2), whatever the target."""
    if mode is not None and mode not in plugin.MODES:
        raise UsageError(f"--mode {mode}: expected one of {', '.join(plugin.MODES)}")


def install(
    inst: Installation, *, mode: str | None = None, selection: Selection | None = None, tool: str | None = None,
    patch_dirs: tuple[Path, ...] | None = None,
) -> HookStatus:
    """Install or refresh the hook: copy the guard, record what this vLLM should carry, register it.

    `patch_dirs` (None: those of the installed expectation) hold the user patches it expects too; they
    are recorded so that mode apply and the fix line pass them to `gptoss-patch apply --patch-dir`.
    """
    check_mode(mode)
    layout = Layout(inst.site_packages)
    previous, _ = plugin.read_state(layout.state)
    dirs = patch_dirs if patch_dirs is not None else tuple(Path(d) for d in (previous or {}).get("patch_dirs", ()))
    user = userpatches.load_dirs(dirs, registry.ids())
    with Store(inst).locked():
        engine.recover(inst, locked=True)  # status must not take the lock we hold
        chosen = selection if selection is not None else _stored_selection(previous)
        registry.check_ids(chosen.only + chosen.skip, tuple(u.name for u in user))
        report = engine.status(inst, chosen, user)
        _refuse_unfixable(report, installed=previous is not None)
        state = expectation(report, mode or (previous or {}).get("mode") or "fail", chosen, tool or sys.executable)
        state["patch_dirs"] = [str(d) for d in dirs]
        _write_all(layout, _files(layout, state))
    _precompile(inst.python, layout)
    return status(inst)


def _precompile(python: str, layout: Layout) -> None:
    """Bytecode now, by the target interpreter: every vLLM process then skips compiling the guard,
    also where it could not write bytecode (PYTHONDONTWRITEBYTECODE, a read-only image). Best effort."""
    code = "import py_compile, sys\npy_compile.compile(sys.argv[1], doraise=True)\n" + answer_line("True")
    try:
        call(python, code, str(layout.module), what="compiling the hook")
    except InterpreterFailed:
        pass  # vLLM compiles it at its first start instead


def _stored_selection(previous: dict[str, Any] | None) -> Selection:
    chosen = (previous or {}).get("selection") or {}
    return Selection(
        only=tuple(chosen.get("only", ())), skip=tuple(chosen.get("skip", ())), with_=tuple(chosen.get("with", ()))
    )


def _refuse_unfixable(report: Report, *, installed: bool = False) -> None:
    """A damaged, drifted, hand-edited or conflicting patch would make every vLLM start refuse, and an orphaned one
    (its plugin removed) is a patch the hook could neither check nor re-apply: say so now, with the advice apply and
    status give (reinstall a damaged file, `revert --force --only` a modified patch, `revert --only` an orphaned one).
    `installed`: a hook is there already, and is left as it was."""
    from gptoss_patch.engine.apply import builtin_fix, refuse_damaged
    from gptoss_patch.engine.context import open_context
    from gptoss_patch.engine.status import orphan_fix

    inst = report.installation
    kept = "the installed hook was left as it was" if installed else "the hook was not installed"
    not_installed = f"{kept} (it would refuse every vLLM start over it)"
    try:
        refuse_damaged(open_context(inst), list(report.results))
    except PatchFailed as exc:
        raise PatchFailed(f"{str(exc).removesuffix('; nothing was written')}; {not_installed}", hint=exc.hint) from None
    bad = [r for r in report.results if r.state in (State.DRIFTED, State.MODIFIED, State.CONFLICT, State.ORPHANED)]
    if not bad:
        return
    first = bad[0]
    error = PatchFailed if first.state is State.DRIFTED else Conflict
    if first.state is State.ORPHANED:
        fix = orphan_fix(inst, first.id, force="changed since" in first.reason)
        raise Conflict(f"patch {first.id} is orphaned: gptoss-patch applied it, but no installed patch set provides it any "
                       f"more (a plugin removed?); {kept}: it could neither check nor re-apply that patch",
                       hint=f"take it out first: {fix} (the ledger has the original bytes), or reinstall the plugin that provides it")
    if first.origin:
        hint = f"fix it first (gptoss-patch status), or leave it out with --skip {first.id}"
    else:
        same_file = [r.id for r in bad if r.file == first.file and r.state is first.state]
        hint = builtin_fix(first, same_file, inst)
    raise error(f"{'user patch' if first.origin else 'patch'} {first.id} is {first.state.value}: {first.reason}; {not_installed}",
              hint=hint)


def expectation(report: Report, mode: str, chosen: Selection, tool: str) -> dict[str, Any]:
    """What every vLLM process will check: patch ids (applied or still pending) and proven file hashes."""
    inst = report.installation
    wanted = [r for r in report.results if r.state in EXPECTED_STATES and r.file]
    files: dict[str, dict[str, Any]] = {}
    for r in wanted:
        for rel in r.files or (r.file,) if r.state is State.APPLIED else ():
            if rel:
                entry = files.setdefault(rel, {"sha256": sha256((inst.site_packages / rel).read_bytes()), "patches": []})
                entry["patches"].append(r.id)
    return {
        "format": plugin.FORMAT, "mode": mode, "vllm": str(inst.version), "distribution": inst.distribution,
        "gptoss_patch": __version__,
        "patches": {r.id: r.file for r in wanted}, "files": files, "tool": tool,
        "selection": {"only": list(chosen.only), "skip": list(chosen.skip), "with": list(chosen.with_)},
    }


def _files(layout: Layout, state: dict[str, Any]) -> dict[Path, bytes]:
    """Every file install writes, in order: the module first, the entry point (RECORD) last."""
    info = layout.dist_info()
    files = {
        layout.module: Path(plugin.__file__).read_bytes(),
        layout.state: (json.dumps(state, indent=1, sort_keys=True) + "\n").encode(),
        info / "METADATA": _metadata().encode(),
        info / "INSTALLER": b"gptoss-patch\n",
        info / "WHEEL": _wheel().encode(),  # pip and uv treat a dist-info without it as broken
        info / "entry_points.txt": ENTRY_POINT.encode(),
    }
    files[info / "RECORD"] = _record(layout, files).encode()
    return files


def _metadata() -> str:
    return (
        f"Metadata-Version: 2.1\nName: {DIST_NAME}\nVersion: {__version__}\n"
        "Summary: gptoss-patch's guard in every vLLM process (installed by `gptoss-patch hook install`; "
        "remove with `gptoss-patch hook uninstall`)\n"
    )


def _wheel() -> str:
    """The WHEEL file of a pure-Python wheel, as installers leave it (PEP 427)."""
    return f"Wheel-Version: 1.0\nGenerator: gptoss-patch ({__version__})\nRoot-Is-Purelib: true\nTag: py3-none-any\n"


def _record(layout: Layout, files: dict[Path, bytes]) -> str:
    """A RECORD like pip's, so `pip uninstall gptoss-patch-hook` removes us cleanly too."""
    rows = [record.row(p.relative_to(layout.site).as_posix(), data) for p, data in files.items()]
    tag = _cache_tag(layout.site)
    if tag:
        rows.append(f"__pycache__/{MODULE}.{tag}.pyc,,")
    rows.append(f"{layout.dist_info().name}/RECORD,,")
    return "\n".join(rows) + "\n"


def _cache_tag(site: Path) -> str | None:
    """lib/python3.11/site-packages -> cpython-311 (the bytecode name the target interpreter uses)."""
    found = next((m for part in site.parts if (m := re.fullmatch(r"python(\d)\.(\d+)", part))), None)
    return f"cpython-{found[1]}{found[2]}" if found else None


def _write_all(layout: Layout, files: dict[Path, bytes]) -> None:
    """Write every file or none: on any failure, put back exactly what was there before."""
    undo: list[tuple[Path, bytes | None]] = []
    created_dir = not layout.dist_info().exists()
    try:
        for path, data in files.items():
            old = path.read_bytes() if path.exists() else None
            path.parent.mkdir(exist_ok=True)
            atomic_write(path, data, 0o644)
            undo.append((path, old))  # only what was written: a read-only tree refuses even unlinks
        _drop_other_dist_infos(layout)
    except (OSError, WriteFailed) as exc:
        _undo(undo, layout.dist_info() if created_dir else None)
        if isinstance(exc, WriteFailed):
            raise
        raise write_failed(Path(exc.filename or layout.site), exc) from None


def _undo(undo: list[tuple[Path, bytes | None]], created_dir: Path | None) -> None:
    for path, old in reversed(undo):
        if old is None:
            path.unlink(missing_ok=True)
        else:
            atomic_write(path, old)
    if created_dir is not None:
        shutil.rmtree(created_dir, ignore_errors=True)


def _drop_other_dist_infos(layout: Layout) -> None:
    """An upgrade of gptoss-patch renames our dist-info; the old one must not stay registered."""
    for other in layout.installed_dist_infos():
        if other != layout.dist_info():
            shutil.rmtree(other)


# -- uninstall -----------------------------------------------------------------------------------


def uninstall(site: Path) -> list[Path]:
    """Remove every file of the hook; returns what was removed (empty: it was not installed)."""
    layout = Layout(site)
    removed = layout.traces()
    try:
        for info in layout.installed_dist_infos():  # first: vLLM stops finding the entry point
            shutil.rmtree(info)
        for path in (layout.module, layout.state, *layout.bytecode()):
            if path.is_file() or path.is_symlink():  # only files: a directory of that name is not ours
                path.unlink()
        _remove_if_empty(site / "__pycache__")
    except OSError as exc:
        raise write_failed(Path(exc.filename or site), exc) from None
    return removed


def _remove_if_empty(directory: Path) -> None:
    """Our import may have created site-packages/__pycache__; leave it only if others use it."""
    try:
        directory.rmdir()
    except OSError:
        pass


# -- status --------------------------------------------------------------------------------------


def status(inst: Installation) -> HookStatus:
    layout = Layout(inst.site_packages)
    infos = layout.installed_dist_infos()
    installed = bool(infos) and layout.module.exists()
    if not installed:
        return HookStatus(layout, False, None, False, None, None, None)
    state, problem = plugin.read_state(layout.state)
    current = layout.module.read_bytes() == Path(plugin.__file__).read_bytes()
    verdict = plugin.evaluate(layout.site, state)
    version = distinfo.version(infos[-1])  # our METADATA's Version (the folder's name if it has none)
    return HookStatus(layout, True, version, current, state, problem, verdict)


def fix_command(hook: HookStatus, python: str) -> str:
    """The one command that makes `hook status` clean again."""
    if not hook.installed or not hook.current_code or hook.state_problem:
        return f"gptoss-patch hook install --python {python}"
    assert hook.verdict is not None
    return plugin.fix_command(hook.verdict, hook.state, python)


def purelib(python: str) -> Path:
    """The interpreter's own site-packages (for uninstall when vLLM is no longer there)."""
    code = "import sysconfig\n" + answer_line("sysconfig.get_paths()['purelib']")
    return Path(call(python, code, what=f"{python} is not a usable Python interpreter").answer)
