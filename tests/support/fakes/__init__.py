"""Test doubles (our own code): for the launcher, a fake `vllm` executable, a fake `nvidia-smi` and files of a fake
vLLM for its static readers; for the model builder, a fake target interpreter."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

FAKE_VLLM = Path(__file__).with_name("fake_vllm.py")

# Hand-written, shaped like the statements the static readers look for (launcher/static.py); nothing from vLLM.
# vllm/envs.py:
ENVS = """\
import os

environment_variables: dict = {
    "VLLM_MXFP4_USE_MARLIN": lambda: os.environ.get("VLLM_MXFP4_USE_MARLIN"),
}
"""
# vllm/entrypoints/openai/cli_args.py:
FRONTEND = """\
class FrontendArgs:
    host: str = None
    port: int = 8000
"""


def install_fake_vllm(venv: Path, python: str | None = None) -> Path:
    """Write `<venv>/bin/vllm`: a /bin/sh wrapper (a short shebang, whatever tmp_path's length) that
    execs the fake with the venv's interpreter, so the fake keeps the pid the launcher started."""
    interpreter = python or str(venv / "bin" / "python")
    exe = venv / "bin" / "vllm"
    exe.parent.mkdir(parents=True, exist_ok=True)
    if exe.exists() or exe.is_symlink():
        exe.unlink()  # never write through a hardlinked file of a cloned venv
    prefix = shlex.quote(str(venv))
    exe.write_text(
        "#!/bin/sh\n"
        f"GPTOSS_PATCH_TEST_FAKE_PREFIX={prefix} exec {shlex.quote(interpreter)} {shlex.quote(str(FAKE_VLLM))} \"$@\"\n"
    )
    exe.chmod(0o755)
    return exe


def install_fake_nvidia_smi(bin_dir: Path, output: str, returncode: int = 0) -> Path:
    """A `nvidia-smi` that prints `output` for any query (e.g. "12.1\\n") and exits with `returncode`."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    exe = bin_dir / "nvidia-smi"
    exe.write_text(f"#!/bin/sh\nprintf %s {shlex.quote(output)}\nexit {returncode}\n")
    exe.chmod(0o755)
    return exe


def fake_interpreter(tmp_path: Path, body: str) -> Path:
    """An executable that runs `body` with this Python whatever script it is handed (argv is ignored)."""
    script = tmp_path / "fake_builder.py"
    script.write_text(body, encoding="utf-8")
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} {script}\n", encoding="utf-8")
    python.chmod(0o755)
    return python
