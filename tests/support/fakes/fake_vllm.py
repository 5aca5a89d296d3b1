"""A fake `vllm` executable for the launcher tests (our own code; nothing here comes from vLLM).

`vllm serve MODEL [flags]` prints a start-up log shaped like vLLM's (including the MXFP4 MoE backend line),
then serves `/health`, `/v1/models` and `/v1/chat/completions` on --host/--port until SIGTERM/SIGINT.

Behaviour switches, comma-separated in GPTOSS_PATCH_TEST_FAKE_VLLM:
  crash           die during start-up with an unrecognised error (exit 1)
  crash-vocab     die with the harmony vocabulary error (known issue G01)
  wrong-backend   announce a CUTLASS MXFP4 backend whatever was pinned
  fork-log        announce the backend the way fork patch sets do ("[MXFP4] Auto-selected: ...")
  null-content    answer with content null, the text in `reasoning`, finish_reason length
  repetition      answer with a repetition loop
  ignore-system   answer without obeying the system prompt
  ignore-sigterm  keep running on SIGTERM (only SIGKILL stops it)
  grandchild      start a child process in the same group, like vLLM's engine core
  exit            print the log and exit 0 at once (for time-to-exec benchmarks)
Other variables: GPTOSS_PATCH_TEST_FAKE_RECORD (write argv and VLLM_*/TIKTOKEN_* env as JSON there),
GPTOSS_PATCH_TEST_FAKE_STAMP (write time.time() at start there), GPTOSS_PATCH_TEST_FAKE_PIDFILE (the
grandchild's pid), GPTOSS_PATCH_TEST_FAKE_DELAY (seconds before the server answers, default 0.2).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

START = time.time()
MODES = set(filter(None, os.environ.get("GPTOSS_PATCH_TEST_FAKE_VLLM", "").split(",")))
PID = os.getpid()


def main(argv: list[str]) -> int:
    _stamp()
    if argv[:1] != ["serve"] or len(argv) < 2:
        print("usage: vllm serve MODEL [options]", file=sys.stderr)
        return 2
    args = _parse(argv[2:])
    _record(argv)
    _startup_log(argv[1], args)
    if "exit" in MODES:
        return 0
    return _serve(argv[1], args)


def _stamp() -> None:
    path = os.environ.get("GPTOSS_PATCH_TEST_FAKE_STAMP")
    if path:
        Path(path).write_text(repr(START))


def _parse(rest: list[str]) -> dict[str, str]:
    """--flag value / --flag=value pairs (switches map to ""); the last occurrence wins, as in argparse."""
    args: dict[str, str] = {}
    key = None
    for item in rest:
        if item.startswith("--"):
            key, _, value = item.partition("=")
            args[key] = value
            key = None if value else key
        elif key is not None and not args[key]:
            args[key] = item
    return args


def _record(argv: list[str]) -> None:
    path = os.environ.get("GPTOSS_PATCH_TEST_FAKE_RECORD")
    if path:
        env = {k: v for k, v in os.environ.items() if k.startswith(("VLLM_", "TIKTOKEN_"))}
        Path(path).write_text(json.dumps({"argv": argv, "env": env, "pid": PID, "pgid": os.getpgid(0)}))


def _version() -> tuple[int, int]:
    """The version of the (fake) install this executable sits in (the wrapper names its venv)."""
    here = Path(os.environ.get("GPTOSS_PATCH_TEST_FAKE_PREFIX", "/nonexistent"))
    for dist_info in here.glob("lib/python3*/site-packages/vllm-*.dist-info"):
        match = re.match(r"vllm-(\d+)\.(\d+)", dist_info.name)
        if match:
            return int(match[1]), int(match[2])
    return (0, 17)


def _log(source: str, text: str, proc: str = "APIServer") -> None:
    stamp = time.strftime("%m-%d %H:%M:%S")
    print(f"({proc} pid={PID}) INFO {stamp} [{source}] {text}", flush=True)


def _startup_log(model: str, args: dict[str, str]) -> None:
    version = _version()
    host, port = args.get("--host", "0.0.0.0"), args.get("--port", "8000")
    print(f"INFO {time.strftime('%m-%d %H:%M:%S')} [__init__.py:216] Automatically detected platform cuda.", flush=True)
    _log("api_server.py:1896", f"vLLM API server version {version[0]}.{version[1]}.0")
    _log("utils.py:328", f"non-default args: {{'model_tag': {model!r}, 'host': {host!r}, 'port': {port}}}")
    _log("core.py:93", f"Initializing a V1 LLM engine with config: model={model!r}, quantization=mxfp4", "EngineCore_DP0")
    if "grandchild" in MODES:
        _start_grandchild()
    if "crash" in MODES or "crash-vocab" in MODES:
        _crash()
    print(_backend_line(version, args), flush=True)
    _log("default_loader.py:267", "Loading weights took 0.01 seconds", "EngineCore_DP0")
    _log("gpu_model_runner.py:3480", "Graph capturing finished in 0 secs, took 0.00 GiB", "EngineCore_DP0")
    _log("api_server.py:1948", f"Starting vLLM API server 0 on http://{host}:{port}")


def _backend_line(version: tuple[int, int], args: dict[str, str]) -> str:
    pinned = args.get("--moe-backend") == "marlin" or os.environ.get("VLLM_MXFP4_USE_MARLIN") == "1"
    prefix = f"(EngineCore_DP0 pid={PID}) INFO {time.strftime('%m-%d %H:%M:%S')}"
    if "fork-log" in MODES:
        if "wrong-backend" in MODES or not pinned:
            return f"{prefix} [mxfp4.py:212] [MXFP4] Auto-selected: CUTLASS_FP4 (native SM120 FP4 grouped GEMM for SM12x)"
        return f"{prefix} [mxfp4.py:212] [MXFP4] Using backend: marlin (pinned)"
    if "wrong-backend" in MODES:
        return f"{prefix} [mxfp4.py:547] Using 'FLASHINFER_CUTLASS_MXFP4_MXFP8' Mxfp4 MoE backend."
    if version < (0, 19):  # before the MoE oracle (docs/vllm-layouts.md#mxfp4-moe-backend-selection)
        return f"{prefix} [mxfp4.py:165] Using Marlin backend"
    return f"{prefix} [mxfp4.py:547] Using 'MARLIN' Mxfp4 MoE backend."


def _start_grandchild() -> None:
    # Like a stuck engine process: it ignores SIGTERM, so only the launcher's SIGKILL of the group ends it.
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    child = subprocess.Popen([sys.executable, "-c", code])
    path = os.environ.get("GPTOSS_PATCH_TEST_FAKE_PIDFILE")
    if path:
        Path(path).write_text(str(child.pid))


def _crash() -> None:
    print("Traceback (most recent call last):", flush=True)
    print('  File "/fake/vllm/entrypoints/openai/api_server.py", line 1, in init_app_state', flush=True)
    if "crash-vocab" in MODES:
        print("openai_harmony.HarmonyError: error downloading or loading vocab file: failed to download or load vocab file", flush=True)
    else:
        print("RuntimeError: something unexpected broke inside the fake engine", flush=True)
    sys.exit(1)


# -- the server ----------------------------------------------------------------------------------


def _serve(model: str, args: dict[str, str]) -> int:
    served = args.get("--served-model-name") or model
    api_key = args.get("--api-key") or os.environ.get("VLLM_API_KEY")
    host, port = args.get("--host", "0.0.0.0"), int(args.get("--port", "8000"))
    time.sleep(float(os.environ.get("GPTOSS_PATCH_TEST_FAKE_DELAY", "0.2")))
    server = ThreadingHTTPServer((host, port), _handler(served, api_key))
    _install_signal_handlers(server)
    print("INFO:     Application startup complete.", flush=True)
    server.serve_forever(poll_interval=0.05)
    print("INFO:     Shutting down", flush=True)
    return 0


def _install_signal_handlers(server: ThreadingHTTPServer) -> None:
    def stop(signum: int, _frame: object) -> None:
        if signum == signal.SIGTERM and "ignore-sigterm" in MODES:
            print("ignoring SIGTERM", flush=True)
            return
        import threading

        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)


def _handler(served: str, api_key: str | None) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt: str, *values: object) -> None:
            print(f"INFO:     {self.address_string()} - {fmt % values}", flush=True)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(200, None)
            elif self.path == "/v1/models" and self._authorised():
                self._send(200, {"object": "list", "data": [{"id": served, "object": "model"}]})

        def do_POST(self) -> None:
            if self.path != "/v1/chat/completions" or not self._authorised():
                return
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
            if body.get("model") != served:
                self._send(404, {"error": {"message": f"The model `{body.get('model')}` does not exist."}})
                return
            self._send(200, _completion(body))

        def _authorised(self) -> bool:
            if api_key and self.headers.get("Authorization") != f"Bearer {api_key}":
                self._send(401, {"error": "Unauthorized"})
                return False
            return True

        def _send(self, status: int, payload: object) -> None:
            data = json.dumps(payload).encode() if payload is not None else b""
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


def _completion(body: dict) -> dict:
    system = " ".join(m.get("content", "") for m in body.get("messages", []) if m.get("role") == "system")
    code = re.search(r"code word (\S+?)\.?$", system)
    content: str | None = "The capital of France is Paris."
    reasoning, finish = "The user asks for the capital of France. Simple.", "stop"
    if code and "ignore-system" not in MODES:
        content += f" {code[1]}"
    if "repetition" in MODES:
        content, finish = "The user is asking about France. " * 60, "length"
    if "null-content" in MODES:
        content, finish = None, "length"
        reasoning = "The user asks for the capital of France; answer Paris in one sentence, then the code word."
    tokens = len(((content or "") + reasoning).split())
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "model": body.get("model"),
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content, "reasoning": reasoning}, "finish_reason": finish}],
        "usage": {"prompt_tokens": 80, "completion_tokens": tokens, "total_tokens": 80 + tokens},
    }


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
