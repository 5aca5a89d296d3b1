"""Issue 35: serve, doctor, bench and numerics share one launch path (launcher/prepare.py) and one option group.

The same bad input gives the same exit code and the same lines in all four: a GPU layout the GPUs cannot run, no
virtualenv under a pip-less install, another run's lock. Fast tier: a hand-written fake vLLM (tests/support/fakesite.py)
with the few static files the launcher reads, the fake `vllm` and a fake `nvidia-smi` (tests/support/fakes/).
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import time
from pathlib import Path

import pytest

from gptoss_patch.engine import ledger
from gptoss_patch.errors import TargetError
from gptoss_patch.launcher import prepare as preparing
from gptoss_patch.launcher.prepare import LaunchRequest
from tests.launcher.conftest import free_port
from tests.support import fakesite
from tests.support.cli import CliResult, run
from tests.support.fakes import ENVS, FRONTEND, install_fake_nvidia_smi, install_fake_vllm

COMMANDS = ("serve", "doctor", "bench", "numerics")
# numerics' servers only: its kernel check needs torch (and comes after the launch is prepared: the last test)
ARGS = {"serve": ("serve",), "doctor": ("doctor",), "bench": ("bench",), "numerics": ("numerics", "--level", "servers")}
MODEL = "openai/gpt-oss-120b"

# Hand-written, shaped like the statements the static readers look for (launcher/static.py); nothing from vLLM.
ARG_UTILS = """\
class EngineArgs:
    @staticmethod
    def add_cli_args(parser):
        parser.add_argument("--tensor-parallel-size", "-tp", type=int)
        parser.add_argument("--gpu-memory-utilization", type=float)
        parser.add_argument("--max-num-seqs", type=int)
        parser.add_argument("--cudagraph-capture-sizes", type=int, nargs="+")
        return parser
"""
STATIC = {"vllm/envs.py": ENVS, "vllm/engine/arg_utils.py": ARG_UTILS, "vllm/entrypoints/openai/cli_args.py": FRONTEND}


@pytest.fixture
def venv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake vLLM 0.17.1 venv with a fake `vllm` that records a start; the lock notice as no command has set it yet."""
    fakesite.build(tmp_path / "venv", files=STATIC)
    install_fake_vllm(tmp_path / "venv")
    monkeypatch.setattr(ledger, "on_wait", lambda _notice: None)  # another command run earlier in this process set it
    return tmp_path / "venv"


def run_all(*args: str, env: dict[str, str | None] | None = None) -> dict[str, CliResult]:
    """Each launch command with the same arguments (MODEL first, vLLM's after --)."""
    model, *rest = args
    return {command: run(*ARGS[command], model, *rest, env=env) for command in COMMANDS}


def fake_vllm(tmp_path: Path) -> dict[str, str]:
    return {"GPTOSS_PATCH_TEST_FAKE_VLLM": "exit", "GPTOSS_PATCH_TEST_FAKE_RECORD": str(tmp_path / "started.json")}


def test_a_gpu_layout_the_gpus_cannot_run_exits_4_with_the_same_line_in_every_launch_command(venv, tmp_path):
    """Was: exit 4 in serve and bench, 1 in numerics (a pre-flight table) and doctor (a failed row)."""
    smi = "".join(f"{i}, GPU-{i:04d}aaaa-bbbb, NVIDIA H200, 9.0, 143771\n" for i in range(2))
    install_fake_nvidia_smi(tmp_path / "smi-bin", smi)
    env = {"PATH": f"{tmp_path / 'smi-bin'}:/usr/bin:/bin", **fake_vllm(tmp_path)}
    results = run_all(
        MODEL, "--venv", str(venv), "--gpu", "sm90", "--port", str(free_port()), "--", "-tp", "4", env=env
    )
    assert {name: r.exit_code for name, r in results.items()} == dict.fromkeys(COMMANDS, 4), {
        n: r.output for n, r in results.items()
    }
    stderr = {r.stderr for r in results.values()}
    assert len(stderr) == 1, stderr
    detected, line = stderr.pop().splitlines()
    assert detected.startswith("Detected vllm 0.17.1 at ")
    assert line == (
        "error: TP 4 x DP 1 needs 4 GPUs on this host; nvidia-smi shows 2 (G33); --tensor-parallel-size 2, "
        "or make 4 GPUs visible"
    )
    assert all(r.stdout == "" for r in results.values())
    assert not (tmp_path / "started.json").exists()


def test_no_virtualenv_under_a_pip_less_install_gives_the_same_hint_in_every_launch_command():
    """No VIRTUAL_ENV, no --venv/--python: the target is gptoss-patch's own interpreter, which has no vLLM.
    Was: "vLLM is not installed for ..." with a `pip install vllm` into gptoss-patch's own environment."""
    results = run_all(MODEL, "--gpu", "cpu", env={"VIRTUAL_ENV": None})
    assert {name: r.exit_code for name, r in results.items()} == dict.fromkeys(COMMANDS, 4)
    stderr = {r.stderr for r in results.values()}
    assert len(stderr) == 1, stderr
    line, hint = stderr.pop().splitlines()
    assert line.startswith("error: no virtualenv is active, and the interpreter running gptoss-patch (")
    assert hint.startswith("hint: pass --venv DIR (the virtualenv that has vllm) or --python PATH")
    assert "pip install" not in hint


def test_another_runs_lock_is_waited_for_with_the_same_notice_and_refusal_in_every_launch_command(venv, tmp_path):
    """Another run holds the lock an interrupted apply must be recovered under. Was: a silent wait, then exit 6."""
    dist_info = next((venv / "lib").glob("python3*/site-packages/vllm-0.17.1.dist-info"))
    (dist_info / ledger.DIRNAME).mkdir()  # what an apply in progress (or a killed one) leaves: recovery takes the lock
    env = {"GPTOSS_PATCH_LOCK_TIMEOUT": "1", **fake_vllm(tmp_path)}
    holder = os.open(dist_info, os.O_RDONLY)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        results, waited = {}, {}
        for command in COMMANDS:
            began = time.monotonic()
            args = ("--venv", str(venv), "--gpu", "cpu", "--port", str(free_port()))
            results[command] = run(*ARGS[command], MODEL, *args, env=env)
            waited[command] = time.monotonic() - began
    finally:
        os.close(holder)
    assert {name: r.exit_code for name, r in results.items()} == dict.fromkeys(COMMANDS, 6)
    assert all(1 <= seconds < 10 for seconds in waited.values()), waited
    stderr = {r.stderr for r in results.values()}
    assert len(stderr) == 1, stderr
    assert stderr.pop().splitlines()[1:] == [
        f"waiting for another gptoss-patch run (pid {os.getpid()}) to finish with {dist_info} (up to 1 s)",
        f"error: another gptoss-patch run has held the lock on {dist_info} for more than 1s",
        "hint: wait for it to finish, or raise GPTOSS_PATCH_LOCK_TIMEOUT",
    ]
    assert not (tmp_path / "started.json").exists()


def test_every_launch_command_hands_prepare_one_request(monkeypatch):
    """The option group arrives as one LaunchRequest; bench and numerics start servers for themselves. numerics
    (--level all) prepares its servers' launch before the kernel check: bad input stops it before anything runs."""
    asked: dict[str, tuple[LaunchRequest, dict]] = {}

    def recorded(request: LaunchRequest, command: str, **how: object):
        asked[command] = (request, how)
        raise TargetError("stopped by the test")

    args = "--gpu sm90 --port 9000 --allow-unpatched --instructions system --fast-moe --venv /v --vllm 0.17.1 -- -tp 2"
    for command in COMMANDS:
        monkeypatch.setattr(preparing, "prepare", lambda request, _c=command, **how: recorded(request, _c, **how))
        result = run(command, MODEL, *args.split())
        assert (result.exit_code, result.stderr) == (4, "error: stopped by the test\n")
    given = LaunchRequest(
        model=MODEL, extra_args=("-tp", "2"), gpu="sm90", port=9000, allow_unpatched=True, instructions="system",
        fast_moe=True, venv="/v", vllm="0.17.1",
    )  # fmt: skip
    # bench's client and numerics' read no reasoning; both measure the built-in profile, never a tuned one (issue 39)
    servers = dataclasses.replace(given, expect_reasoning=True, tuned=False)
    bench = dataclasses.replace(servers, concurrency="1,2,4,5,8,10,16,32,64")  # its --capture defaults to --concurrency
    assert {name: request for name, (request, _) in asked.items()} == {
        "serve": given, "doctor": given, "bench": bench, "numerics": servers,
    }  # fmt: skip
    assert asked["doctor"][1]["starts"] is False and "starts" not in asked["serve"][1]
