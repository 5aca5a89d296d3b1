"""`gptoss-patch hook install|uninstall|status`: the guard vLLM runs in every process (vllm.general_plugins)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gptoss_patch import clikit
from gptoss_patch.errors import ExitCode
from gptoss_patch.options import (
    HookModeOption,
    JsonOption,
    OnlyOption,
    PatchDirOption,
    PythonOption,
    SkipOption,
    VenvOption,
    VerboseOption,
    VllmOption,
    WithOption,
    handles_errors,
    installation,
    pyproject_problems,
    selection,
)

if TYPE_CHECKING:  # imported when a command runs
    from pathlib import Path

    from gptoss_patch.hook.installer import HookStatus

hook_app = clikit.App()

@hook_app.command("install")
@handles_errors
def install(
    python: PythonOption = None, venv: VenvOption = None, vllm: VllmOption = None, mode: HookModeOption = None,
    only: OnlyOption = None, skip: SkipOption = None, with_: WithOption = None, patch_dir: PatchDirOption = None,
    json: JsonOption = False, verbose: VerboseOption = False,
) -> None:
    """Install (or refresh) the hook: every vLLM process checks its patches before the model loads.

    Records the patches this vLLM should carry (applied or pending now, minus --skip) with the hashes
    of the patched files, beside the hook and outside vLLM's .dist-info, so a reinstall of vLLM cannot
    erase the expectation. Re-run it after changing the patch set; it keeps the mode unless --mode is given.
    Your own patches (--patch-dir, GPTOSS_PATCH_DIRS or pyproject.toml; default: the directories recorded
    before) are expected too, and mode apply re-applies them from those directories.
    """
    from pathlib import Path

    from gptoss_patch import userpatches
    from gptoss_patch.hook import installer

    installer.check_mode(mode)
    dirs = userpatches.patch_dirs(patch_dir, Path.cwd())
    pyproject_problems()
    user = userpatches.load_dirs(dirs) if dirs else ()
    chosen = selection(only, skip, with_, user=user) if (only or skip or with_) else None
    inst = installation(python, venv, vllm)
    result = installer.install(inst, mode=mode, selection=chosen, patch_dirs=dirs or None)
    _show(result, inst.python, json, verb="Installed")


@hook_app.command("uninstall")
@handles_errors
def uninstall(python: PythonOption = None, venv: VenvOption = None, json: JsonOption = False, verbose: VerboseOption = False) -> None:
    """Remove every file the hook installed; vLLM starts as if it had never been there."""
    from gptoss_patch import render
    from gptoss_patch.hook import installer

    site = _site_packages(python, venv)
    removed = installer.uninstall(site)
    if json:
        render.json_out({"site_packages": str(site), "removed": [str(p) for p in removed]})
        return
    for path in removed:
        render.info(f"Removed {path}")
    render.info(f"Done: the hook is not installed in {site}" + ("" if removed else " (it was not)"))


@hook_app.command("status")
@handles_errors
def status(python: PythonOption = None, venv: VenvOption = None, json: JsonOption = False, verbose: VerboseOption = False) -> None:
    """Whether the hook is installed, its mode, and what it would decide in a vLLM process now (exit 1 if not ok)."""
    from gptoss_patch.hook import installer

    inst = installation(python, venv)
    _show(installer.status(inst), inst.python, json)


def _show(result: HookStatus, python: str, json: bool, verb: str | None = None) -> None:
    from gptoss_patch import render
    from gptoss_patch.hook import installer

    if json:
        render.json_out(result.to_json())
    else:
        if verb:
            render.info(f"{verb} the gptoss-patch hook in {result.layout.site}")
        _table(result)
        if verb and not result.ok and (result.state or {}).get("mode") == "fail" and result.verdict is not None:
            render.warn(f"vLLM in {result.layout.site} now refuses to start (hook mode fail) until the fix below is run; "
                        "`hook install --mode warn` only logs instead")
        if not result.ok:
            render.info(f"fix: {installer.fix_command(result, python)}")
    raise clikit.Exit(int(ExitCode.OK if result.ok else ExitCode.ACTION_NEEDED))


def _table(result: HookStatus) -> None:
    from gptoss_patch import render

    state, verdict = result.state or {}, result.verdict
    rows = [("installed", f"yes ({result.version}{'' if result.current_code else ', older code: re-run hook install'})"
             if result.installed else "no"), ("site-packages", str(result.layout.site))]
    if result.installed:
        rows += [
            ("mode", str(state.get("mode", "-"))),
            ("expects", f"{state.get('distribution') or 'vllm'} {state.get('vllm', '?')}: "
                        f"{', '.join(sorted(state.get('patches', {}))) or 'no patches'}"),
        ]
    if verdict is not None:
        rows += [("fingerprint", verdict.fingerprint), ("check", "; ".join(t for _, t in verdict.problems) or "ok")]
    if result.state_problem:
        rows.append(("problem", result.state_problem))
    render.table(None, ("hook", "value"), [(k, render.escape(v)) for k, v in rows])


def _site_packages(python: str | None, venv: str | None) -> Path:
    """vLLM's site-packages, else the interpreter's own: uninstall works after vLLM is gone too."""
    from gptoss_patch import target
    from gptoss_patch.errors import TargetError
    from gptoss_patch.hook import installer

    interpreter = target.interpreter_for(python, venv)
    try:
        return target.discover(interpreter).site_packages
    except TargetError:
        return installer.purelib(interpreter)


def register(app: clikit.App) -> None:
    app.add_app(hook_app, name="hook", help="Guard every vLLM process: check (or re-apply) the patches at start-up.")
