"""`serve --print-script` and `--dry-run`: the resolved launch as a standalone bash script or as plain lines."""

from __future__ import annotations

import shlex

from gptoss_patch import __version__
from gptoss_patch.launcher.results import LaunchPlan

# Inherited variables that change how vLLM or harmony behave; copied so the script is self-contained.
INHERITED_PREFIXES = ("VLLM_", "TIKTOKEN_")
SECRETS = ("VLLM_API_KEY",)  # never written into a file; the script demands it instead


def render_script(plan: LaunchPlan) -> str:
    inst = plan.installation
    lines = [
        "#!/usr/bin/env bash",
        f"# Serve gpt-oss with vLLM {inst.version}; written by gptoss-patch {__version__} (`gptoss-patch serve --print-script`).",
        f"# Target: {inst.site_packages} (python {inst.python}); GPU profile {plan.profile} ({plan.profile_source}).",
        "# The pre-flight checks passed when this was written; run `gptoss-patch doctor` again after changing anything.",
        "set -euo pipefail",
        *_note_lines(plan),
        *_inherited_lines(plan),
        *_env_lines(plan),
        "",
        "args=(",
        f"  {shlex.join(plan.entry)}",
        *_flag_lines(plan),
        ")",
        f'exec {shlex.quote(str(plan.executable))} "${{args[@]}}"',
    ]
    return "\n".join(lines) + "\n"


def _inherited_lines(plan: LaunchPlan) -> list[str]:
    own = plan.env_additions
    names = sorted(n for n in plan.base_env if n.startswith(INHERITED_PREFIXES) and n not in own)
    if not names:
        return []
    lines = ["", "# From the environment gptoss-patch checked:"]
    for name in names:
        if name in SECRETS:
            lines.append(f': "${{{name}:?export {name} before running this script}}"')
        else:
            lines.append(f"export {name}={shlex.quote(plan.base_env[name])}")
    return lines


def _note_lines(plan: LaunchPlan) -> list[str]:
    return ["", *(f"# note: {note}" for note in plan.notes)] if plan.notes else []


def _env_lines(plan: LaunchPlan) -> list[str]:
    lines: list[str] = []
    previous_why = None
    for setting in (s for s in plan.settings if s.kind == "env"):
        if setting.why != previous_why:  # one comment for a group of variables set for one reason
            lines += ["", f"# {setting.why}"]
            previous_why = setting.why
        lines.append(f"export {setting.name}={shlex.quote(setting.values[0])}")
    return lines


def _flag_lines(plan: LaunchPlan) -> list[str]:
    lines: list[str] = []
    for setting in (s for s in plan.settings if s.kind == "flag"):
        lines += [f"  # {setting.why}", "  " + shlex.join(setting.argv)]
    if plan.extra_args:
        lines += ["  # given after -- on the gptoss-patch command line", "  " + shlex.join(plan.extra_args)]
    return lines


def render_dry_run(plan: LaunchPlan) -> str:
    """The environment added and the exact command, pasteable into a shell."""
    exports = [f"export {name}={shlex.quote(value)}" for name, value in plan.env_additions.items()]
    return "\n".join([*exports, plan.command_line]) + "\n"
