"""Runs inside a vLLM venv and loads vLLM's general plugins the way vLLM does, once per request.

tests/hook/test_hook.py starts it once (importing vllm takes seconds) and sends JSON requests on stdin;
each answer is one stdout line starting with MARK (vLLM logs to stdout too). Requests:
  {"op": "load", "env": {...}, "imported": [module, ...]}  reset vLLM's once-per-process flag and the
      hook's, set the environment, pretend `imported` modules were already imported, then call
      vllm.plugins.load_general_plugins() in this process (process0, as `vllm serve` does);
  {"op": "child"}  the same in a multiprocessing "spawn" child, as vLLM starts engine cores and
      workers (it inherits this process's environment);
  {"op": "shell", "argv": [...]}  run a command in this process's mount namespace (read-only mounts).
Standard library and vllm only: gptoss-patch is not installed here, on purpose.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import multiprocessing
import os
import subprocess
import sys
import types

MARK = "@@ "


class Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[list[str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append([record.levelname, record.getMessage()])


def load(request: dict) -> dict:
    import vllm.plugins

    capture = Capture()
    logging.getLogger("vllm").addHandler(capture)
    if not request.get("inherit"):
        for name in [n for n in os.environ if n.startswith("GPTOSS_PATCH_") or n == "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY"]:
            del os.environ[name]
        os.environ.update(request.get("env", {}))
    fakes = [n for n in request.get("imported", []) if n not in sys.modules]
    for name in fakes:
        sys.modules[name] = types.ModuleType(name)
    hook = sys.modules.get("gptoss_patch_hook")
    if hook is not None:
        hook._checked = False
    vllm.plugins.plugins_loaded = False
    try:
        vllm.plugins.load_general_plugins()
        outcome: dict = {"outcome": "ok"}
    except SystemExit as exc:
        outcome = {"outcome": "exit", "code": exc.code}
    except Exception as exc:  # noqa: BLE001 - reported to the test, as vLLM would report it
        outcome = {"outcome": "raised", "type": type(exc).__name__, "error": str(exc)}
    finally:
        for name in fakes:
            sys.modules.pop(name, None)
        logging.getLogger("vllm").removeHandler(capture)
    env = {n: os.environ[n] for n in os.environ if n.startswith("GPTOSS_PATCH_") or n == "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY"}
    return {
        **outcome, "logs": [r for r in capture.records if "gptoss-patch" in r[1]], "env": env, "pid": os.getpid(),
        "libcst_imported": "libcst" in sys.modules, "gptoss_patch_importable": importlib.util.find_spec("gptoss_patch") is not None,
    }


def child_main(queue) -> None:  # noqa: ANN001 - a multiprocessing queue
    queue.put(load({"inherit": True}))


def spawn_child() -> dict:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=child_main, args=(queue,))
    proc.start()
    result = queue.get(timeout=300)
    proc.join()
    return {**result, "exitcode": proc.exitcode, "parent_pid": os.getpid()}


def shell(argv: list[str]) -> dict:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    return {"returncode": proc.returncode, "stderr": proc.stderr[-2000:]}


def main() -> None:
    import vllm.plugins  # noqa: F401 - pay the import once, before the first request

    print(MARK + json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        op = request.get("op", "load")
        answer = spawn_child() if op == "child" else shell(request["argv"]) if op == "shell" else load(request)
        print(MARK + json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
