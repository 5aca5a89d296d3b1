"""`make demo`: the main job on a real vLLM 0.17.1 in a fresh venv, on CPU.

1. builds (once, cached in ~/.cache/gptoss-patch/venvs) a CPU venv that imports vLLM 0.17.1's API
   layer, and gives this run its own fresh copy of it;
2. installs the offline harmony vocabulary;
3. status -> verify --behaviour (shows the stock bug: the rendered prompt before the patch)
   -> apply --vllm 0.17.1 -> verify -> verify --behaviour --verbose (the prompt after) -> status.

Exits non-zero unless the patched tree verifies and status is clean.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.harness import clone_venv, cpu_venv  # noqa: E402

VERSION = "0.17.1"
TOOL = [sys.executable, "-m", "gptoss_patch"]


def step(title: str, *args: str, expect: tuple[int, ...] = (0,)) -> None:
    print(f"\n\033[1m== {title}\033[0m\n$ gptoss-patch {shlex.join(args)}", flush=True)
    code = subprocess.run([*TOOL, *args]).returncode
    if code not in expect:
        raise SystemExit(f"demo failed: `gptoss-patch {shlex.join(args)}` exited {code}")


def main() -> int:
    print(f"Preparing a CPU venv with vLLM {VERSION} (first run: a few minutes; cached afterwards)...", flush=True)
    venv = Path(tempfile.mkdtemp(prefix="gptoss-patch-demo-")) / "venv"
    clone_venv(cpu_venv(VERSION), venv)
    target = ("--venv", str(venv))
    print(f"Fresh venv for this run: {venv}")
    step("Offline harmony vocabulary (G01)", "vocab", "install")
    step("State of the stock install", "status", *target, expect=(1,))
    step("Stock behaviour: the client's system prompt is a raw second system message (G02)",
         "verify", *target, "--behaviour", "--verbose", "--only", "harmony_instructions", expect=(1,))
    step("Apply the patch set", "apply", *target, "--vllm", VERSION)
    step("Verify: compile with the target interpreter, check each patch's shape", "verify", *target)
    step("Behaviour after the patch: the prompt as the model sees it", "verify", *target, "--behaviour", "--verbose")
    step("Final state", "status", *target)
    print(f"\nDone. The patched venv is {venv}; `gptoss-patch revert --venv {venv}` restores it offline.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
