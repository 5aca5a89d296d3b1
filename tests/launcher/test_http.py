"""Loopback never goes through a proxy (launcher/http.py): bench's health wait, the runner's health probe and the
smoke canary reach a server on 127.0.0.1 with every proxy variable pointing at a dead proxy and no no_proxy.

The server is a tiny http.server in a thread of the test (nothing to download): /health, /v1/models, the two
chat completions the canary sends and /detokenize.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gptoss_patch import bench
from gptoss_patch.launcher import runner, smoke
from gptoss_patch.launcher.results import Status

DEAD_PROXY = "http://127.0.0.1:9"  # the discard port: nothing listens, a proxied request fails at once
PROXY_VARIABLES = ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY")
SLEEPER = (sys.executable, "-c", "import time; time.sleep(120)")  # a child that stays alive: the "server" process


class _Handler(BaseHTTPRequestHandler):
    system = ""  # the system and developer messages the canary sent: /detokenize renders them as harmony instructions

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path == "/health":
            self._reply(200, None)
        elif self.path == "/v1/models":
            self._reply(200, {"data": [{"id": "tiny"}]})
        else:
            self._reply(404, {"error": "not found"})

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if self.path == "/detokenize":
            prompt = (f"<|start|>system<|message|>You are ChatGPT.<|end|><|start|>developer<|message|># Instructions\n\n"
                      f"{_Handler.system}<|end|><|start|>user<|message|>hi<|end|>")
            self._reply(200, {"prompt": prompt})
        elif self.path == "/v1/chat/completions" and body.get("return_token_ids"):
            _Handler.system = "\n\n".join(m["content"] for m in body["messages"] if m["role"] in ("system", "developer"))
            self._reply(200, {"prompt_token_ids": [1, 2, 3], "choices": [{"logprobs": {"content": [{"logprob": -0.01}]}}]})
        elif self.path == "/v1/chat/completions":
            message = {"role": "assistant", "content": f"The capital of France is Paris. {smoke.MARKER}"}
            self._reply(200, {"choices": [{"message": message, "finish_reason": "stop"}], "usage": {"completion_tokens": 9}})
        else:
            self._reply(404, {"error": "not found"})

    def _reply(self, status: int, payload: Any) -> None:
        data = b"" if payload is None else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def loopback(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A server on 127.0.0.1 (its base URL), with every proxy variable at a dead proxy and no no_proxy."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    for name in PROXY_VARIABLES:
        monkeypatch.setenv(name, DEAD_PROXY)
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    # The trap is real: urllib's default opener, as urlopen builds it on its first use in a process, sends
    # loopback to the proxy. (Built here, not urlopen's: urlopen keeps the opener of its first call, so an earlier
    # test's call in the same process would hide the trap.)
    with pytest.raises(OSError):
        urllib.request.build_opener().open(url + "/health", timeout=5)
    try:
        yield url
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_bench_health_wait_reaches_loopback_past_a_dead_proxy(loopback: str, tmp_path: Path) -> None:
    port = int(loopback.rsplit(":", 1)[1])
    spec = bench.ServerSpec("profile", SLEEPER, dict(os.environ), port, "tiny")
    server = bench.RunningServer(spec, tmp_path / "profile.log")
    notes: list[str] = []
    try:
        bench.wait_ready([server], 20.0, notes.append)
    finally:
        server.stop()
    assert server.ready_after is not None
    assert notes and notes[0].startswith("profile server ready after")


def test_runner_health_probe_reaches_loopback_past_a_dead_proxy(loopback: str) -> None:
    child = runner.start(SLEEPER, os.environ, stdout=subprocess.DEVNULL)
    try:
        waited = runner.wait_healthy(loopback + "/health", child, timeout=20.0, interval=0.1)
        assert child.poll() is None
    finally:
        runner.stop(child, grace=5.0)
    assert waited is not None


def test_smoke_reaches_loopback_past_a_dead_proxy(loopback: str) -> None:
    report = smoke.run_smoke(loopback, timeout=20.0)
    verdicts = {check.name: check.status for check in report.checks}
    assert report.model == "tiny"
    assert verdicts["http"] is Status.PASS and verdicts["rendering"] is Status.PASS, report.checks
    assert report.ok, report.checks


def test_a_process_the_tool_starts_reaches_loopback_past_a_dead_proxy_keeping_the_users_no_proxy(
    loopback: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # bench's driver (vLLM's own benchmark client) and vLLM run through runner.start and honour http_proxy
    monkeypatch.setenv("NO_PROXY", "corp.example")
    client = "import os, sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=5).status, os.environ['no_proxy'])"
    child = runner.start([sys.executable, "-c", client, loopback + "/health"], os.environ)
    out, _ = child.communicate(timeout=30)
    assert child.returncode == 0, out.decode()
    assert out.decode().split() == ["200", "corp.example,127.0.0.1,localhost"]


def time_wait_port() -> int:
    """A port whose only trace is a connection in TIME_WAIT: the server side closed first, as a stopped vLLM does."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn's (asyncio's) listener does
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            accepted, _ = listener.accept()
            accepted.close()  # the active close: this end goes to TIME_WAIT
            client.recv(1)
    with socket.socket() as plain, pytest.raises(OSError):  # the trap is real: a bind without SO_REUSEADDR fails
        plain.bind(("127.0.0.1", port))
    return port


def test_a_port_in_time_wait_is_free_and_a_listening_port_is_not() -> None:
    port = time_wait_port()
    assert bench.port_free(port) and runner.bind_problem("127.0.0.1", port) is None
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        busy = listener.getsockname()[1]
        assert not bench.port_free(busy)
        assert runner.bind_problem("127.0.0.1", busy) == "the port is in use"
