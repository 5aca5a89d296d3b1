"""Supervising the fake `vllm serve`: log tee, sentinel, readiness, canary, signals, and no process left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gptoss_patch.launcher import plan as planning, runner, smoke
from tests.launcher.conftest import MODEL, free_port, healthy, pid_alive, read_record, resolve
from tests.launcher.recorded import facts
from tests.support.servers import wait_until
from tests.support.terminal import default_signals


class Recorder:
    """Hooks that keep what the runner reports; `then` runs once vLLM is ready (in a thread)."""

    def __init__(self, then=None, canary=None) -> None:
        self.lines: list[str] = []
        self.notes: list[str] = []
        self.then = then
        self.canary = canary

    def hooks(self) -> runner.Hooks:
        return runner.Hooks(echo=self.lines.append, notify=self._notify, smoke=self.canary)

    def _notify(self, message: str) -> None:
        self.notes.append(message)
        if message.startswith("Ready") and self.then:
            threading.Thread(target=self.then, daemon=True).start()


def fake_env(tmp_path: Path, *modes: str) -> dict[str, str]:
    return {
        "GPTOSS_PATCH_TEST_FAKE_VLLM": ",".join(modes),
        "GPTOSS_PATCH_TEST_FAKE_RECORD": str(tmp_path / "record.json"),
        "GPTOSS_PATCH_TEST_FAKE_PIDFILE": str(tmp_path / "grandchild.pid"),
    }


def run(plan, tmp_path: Path, recorder: Recorder):
    return runner.run(plan, log_file=tmp_path / "logs" / "serve.log", health_url=planning.health_url(plan), hooks=recorder.hooks())


def terminate_me() -> None:
    """What a user's `kill <launcher>` does; the runner's handler forwards it to vLLM's group."""
    os.kill(os.getpid(), signal.SIGTERM)


def test_a_clean_run_tees_the_log_reports_backend_and_readiness_and_forwards_sigterm(installs, tmp_path):
    plan = resolve(installs["0.17.1"], fake_env(tmp_path), gpu="sm121")
    recorder = Recorder(then=terminate_me)
    outcome = run(plan, tmp_path, recorder)
    assert outcome.exit_code == 0 and outcome.stopped_for is None and outcome.signal == signal.SIGTERM
    assert outcome.moe_backend == "MARLIN" and outcome.ready_after is not None
    assert "MoE backend: MARLIN (as pinned by the sm121 profile)" in recorder.notes
    log = (tmp_path / "logs" / "serve.log").read_text()
    assert log == "".join(recorder.lines) and "Application startup complete." in log
    record = read_record(tmp_path / "record.json")
    assert record["argv"] == plan.argv[1:] and record["env"]["VLLM_MXFP4_USE_MARLIN"] == "1"
    assert record["pgid"] == record["pid"]  # its own process group
    assert not pid_alive(record["pid"])


@pytest.mark.parametrize("mode", ["wrong-backend", "fork-log"])
def test_a_backend_that_contradicts_the_pin_stops_vllm(installs, tmp_path, mode):
    plan = resolve(installs["0.17.1"], fake_env(tmp_path, mode, "wrong-backend"), gpu="sm121")
    outcome = run(plan, tmp_path, Recorder())
    assert outcome.stopped_for is not None and outcome.stopped_for.endswith("but the sm121 profile pinned MARLIN (G14)")
    assert outcome.ready_after is None or outcome.moe_backend != "MARLIN"
    assert not pid_alive(read_record(tmp_path / "record.json")["pid"])


def test_a_crash_keeps_the_last_lines_and_names_the_known_issue(installs, tmp_path):
    outcome = run(resolve(installs["0.17.1"], fake_env(tmp_path, "crash-vocab")), tmp_path, Recorder())
    assert outcome.exit_code == 1 and outcome.stopped_for is None
    assert outcome.last_lines[-1].startswith("openai_harmony.HarmonyError: error downloading or loading vocab file")
    assert outcome.known_issue is not None and outcome.known_issue.id == "G01"


def test_an_unknown_crash_has_last_lines_but_no_known_issue(installs, tmp_path):
    outcome = run(resolve(installs["0.17.1"], fake_env(tmp_path, "crash")), tmp_path, Recorder())
    assert outcome.exit_code == 1 and outcome.known_issue is None and outcome.last_lines


def canary_for(plan, then=None):
    def canary():
        report = smoke.run_smoke(planning.server_url(plan), model=planning.served_model(plan), api_key=planning.api_key(plan))
        if then:
            then()
        return report

    return canary


def test_a_passing_canary_keeps_vllm_serving(installs, tmp_path):
    plan = resolve(installs["0.17.1"], fake_env(tmp_path), extra_args=("--served-model-name", "gpt-oss"))
    outcome = run(plan, tmp_path, Recorder(canary=canary_for(plan, then=terminate_me)))
    assert outcome.smoke is not None and outcome.smoke.ok and outcome.smoke.model == "gpt-oss"
    assert outcome.stopped_for is None and outcome.exit_code == 0


def test_a_failing_canary_stops_vllm(installs, tmp_path):
    plan = resolve(installs["0.17.1"], fake_env(tmp_path, "null-content"))
    outcome = run(plan, tmp_path, Recorder(canary=canary_for(plan)))
    assert outcome.stopped_for == "the smoke canary failed" and not outcome.smoke.ok
    assert not pid_alive(read_record(tmp_path / "record.json")["pid"])


def test_the_canary_sends_the_api_key(installs, tmp_path):
    plan = resolve(installs["0.17.1"], {**fake_env(tmp_path), "VLLM_API_KEY": "sekret"})
    outcome = run(plan, tmp_path, Recorder(canary=canary_for(plan, then=terminate_me)))
    assert outcome.smoke.ok


def test_leftover_processes_in_the_group_are_killed(installs, tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "STOP_GRACE", 1.0)
    monkeypatch.setattr(runner, "ORPHAN_GRACE", 0.5)
    plan = resolve(installs["0.17.1"], fake_env(tmp_path, "grandchild"))
    run(plan, tmp_path, Recorder(then=terminate_me))
    grandchild = int((tmp_path / "grandchild.pid").read_text())
    assert wait_until(lambda: not pid_alive(grandchild), timeout=5)


def test_a_second_signal_kills_a_vllm_that_ignores_the_first(installs, tmp_path):
    def twice() -> None:
        terminate_me()
        wait_until(lambda: "ignoring SIGTERM\n" in recorder.lines, timeout=5)
        terminate_me()

    recorder = Recorder(then=twice)
    outcome = run(resolve(installs["0.17.1"], fake_env(tmp_path, "ignore-sigterm")), tmp_path, recorder)
    assert outcome.exit_code == 128 + signal.SIGKILL


# -- the launcher as a process: what a terminal and a supervisor do to it ------------------------


def launch(installs, tmp_path: Path, *modes: str) -> tuple[subprocess.Popen, str]:
    venv = Path(installs["0.17.1"].python).parent.parent
    env = {**os.environ, **fake_env(tmp_path, *modes)}
    port = free_port()
    cmd = [sys.executable, "-m", "gptoss_patch", "serve", MODEL, "--venv", str(venv), "--gpu", "cpu", "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_signals)  # Ctrl-C must reach it, however the suite was started
    return proc, f"http://127.0.0.1:{port}"


def serving(tmp_path: Path, url: str) -> int:
    """Wait until vLLM answers /health (its signal handlers are installed then); returns its pid."""
    assert wait_until(lambda: healthy(url), timeout=30), "vllm did not come up"
    return read_record(tmp_path / "record.json")["pid"]


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_forwarded_signal_stops_vllm_and_serve_exits_128_plus_n(installs, tmp_path, signum, code):
    proc, url = launch(installs, tmp_path)
    pid = serving(tmp_path, url)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == code, err  # vLLM shuts down cleanly (0); the user stopped it: README's 128+N
    assert f"error: interrupted by {signal.Signals(signum).name}; vLLM was stopped" in err
    if signum != signal.SIGHUP:  # uvicorn logs its shutdown on SIGINT and SIGTERM; SIGHUP just ends the process
        assert "INFO:     Shutting down" in out  # vLLM's own log went to stdout, verbatim
    assert not pid_alive(pid)


def test_killing_the_launcher_takes_vllm_down_with_it(installs, tmp_path):
    proc, url = launch(installs, tmp_path)
    pid = serving(tmp_path, url)
    proc.kill()
    proc.communicate(timeout=10)
    assert wait_until(lambda: not pid_alive(pid), timeout=10), "vllm outlived a SIGKILLed launcher"


def test_a_closed_terminal_does_not_stall_vllm_and_the_log_file_keeps_everything(installs, tmp_path):
    def closed(_line: str) -> None:
        raise BrokenPipeError("stdout closed")

    recorder = Recorder(then=terminate_me)
    hooks = runner.Hooks(echo=closed, notify=recorder.hooks().notify)
    plan = resolve(installs["0.17.1"], fake_env(tmp_path))
    outcome = runner.run(plan, log_file=tmp_path / "serve.log", health_url=planning.health_url(plan), hooks=hooks)
    assert outcome.exit_code == 0
    assert "INFO:     Shutting down" in (tmp_path / "serve.log").read_text()


# -- without a wheel: a stand-in server that shuts down cleanly (exit 0) on SIGINT, as vLLM does ---------

GRACEFUL_SERVER = """
import signal, sys, time
signal.signal(signal.SIGINT, lambda *_: (print("Shutting down", flush=True), sys.exit(0)))
print("up", flush=True)
time.sleep(60)
"""


def test_ctrl_c_forwarded_to_a_cleanly_exiting_vllm_makes_serve_exit_130(tmp_path, capsys):
    from gptoss_patch import clikit
    from gptoss_patch.commands import serve
    from gptoss_patch.launcher.results import LaunchPlan

    (tmp_path / "graceful_server.py").write_text(GRACEFUL_SERVER)
    plan = LaunchPlan(installation=None, executable=Path(sys.executable), model="m", profile="cpu", profile_source="test",
                      settings=(), notes=(), extra_args=(), base_env={**os.environ, "PYTHONPATH": str(tmp_path)},
                      server_module="graceful_server", patch_report=None, capabilities=facts("0.20.2").capabilities,
                      options=None, vocabulary=None, parallel=None)

    def echo(line: str) -> None:
        if line == "up\n":  # the forwarding handler is installed by then (or a moment later: the timer waits)
            threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()

    hooks = runner.Hooks(echo=echo, notify=lambda _message: None)
    outcome = runner.run(plan, log_file=tmp_path / "serve.log", health_url="http://127.0.0.1:9/health", hooks=hooks)
    assert outcome.exit_code == 0 and outcome.signal == signal.SIGINT and not outcome.last_lines
    with pytest.raises(clikit.Exit) as stopped:
        serve._finish(outcome)
    assert stopped.value.exit_code == 130
    assert "interrupted by SIGINT; vLLM was stopped" in capsys.readouterr().err
