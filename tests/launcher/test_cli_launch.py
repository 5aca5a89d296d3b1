"""`serve`, `doctor` and `smoke` at the CLI boundary: exit codes, exact stderr lines, --json, nothing started."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
from pathlib import Path

import pytest

from tests.launcher.conftest import MODEL, free_port, pending_summary, read_record
from tests.support import measured
from tests.support.cli import run


def venv_of(inst) -> str:
    return str(Path(inst.python).parent.parent)


def fake(tmp_path: Path, *modes: str) -> dict[str, str]:
    return {"GPTOSS_PATCH_TEST_FAKE_VLLM": ",".join(modes), "GPTOSS_PATCH_TEST_FAKE_RECORD": str(tmp_path / "record.json")}


def serve(inst, tmp_path: Path, *args: str, modes: tuple[str, ...] = ("exit",), env: dict[str, str] | None = None):
    port = str(free_port())
    return run("serve", MODEL, "--venv", venv_of(inst), "--port", port, *args, env={**fake(tmp_path, *modes), **(env or {})})


def detected(inst) -> str:
    return f"Detected vllm {inst.version} at {inst.site_packages} (python {inst.python})"


# -- doctor --------------------------------------------------------------------------------------


def test_doctor_prints_every_check_and_exits_0_when_nothing_fails(installs):
    inst = installs["0.17.1"]
    result = run("doctor", MODEL, "--venv", venv_of(inst), "--gpu", "sm121", "--port", str(free_port()))
    assert result.exit_code == 0, result.stderr
    assert result.stderr.splitlines()[0] == detected(inst)
    for name in ("gpu", "patches", "env", "flags", "vocab", "security", "capture-sizes", "moe-backend", "executable", "model", "port"):
        assert f"│ {name} " in result.stdout


def test_doctor_json_has_checks_settings_and_the_command(installs):
    inst = installs["0.33.0"]
    result = run("doctor", "--venv", venv_of(inst), "--gpu", "sm121", "--concurrency", "5,10", "--json", "--port", str(free_port()))
    payload = json.loads(result.stdout)
    assert result.exit_code == 0 and payload["ok"] is True
    assert payload["vllm"]["version"] == "0.33.0" and payload["profile"] == {"name": "sm121", "source": "--gpu"}
    assert {c["name"] for c in payload["checks"]} >= {"patches", "env", "flags", "vocab", "security"}
    assert "--moe-backend" in payload["command"] and "--cudagraph-capture-sizes" in payload["command"]
    assert payload["env"] == {}  # --instructions developer, upstream's default: the variable unset
    assert next(c for c in payload["checks"] if c["name"] == "instructions")["status"] == "pass"


def test_doctor_says_which_instructions_placement_the_server_uses_and_what_system_drops(installs):
    inst = installs["0.17.1"]
    base = ("doctor", "--venv", venv_of(inst), "--port", str(free_port()))
    plain = run(*base)
    assert "│ instructions " in plain.stdout and "developer (VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS unset" in plain.stdout
    chosen = run(*base, "--instructions", "system", "--json")
    payload = json.loads(chosen.stdout)
    row = next(c for c in payload["checks"] if c["name"] == "instructions")
    assert chosen.exit_code == 0 and payload["env"]["VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS"] == "1"
    assert row["status"] == "warn" and "a developer message after a system message) is rendered empty" in row["message"]
    bad = run(*base, "--instructions", "user")
    assert bad.exit_code == 2 and bad.stderr.startswith("error: --instructions user: expected one of developer, system")


def test_doctor_exits_1_on_a_variable_vllm_does_not_read(installs):
    inst = installs["0.17.1"]
    result = run("doctor", "--venv", venv_of(inst), "--json", "--port", str(free_port()), env={"VLLM_MXFP4_BACKEND": "marlin"})
    assert result.exit_code == 1
    failed = [c for c in json.loads(result.stdout)["checks"] if c["status"] == "fail"]
    assert [(c["name"], c["fix"]) for c in failed] == [("env", "use VLLM_MXFP4_USE_MARLIN=1 instead")]


def doctor_json(inst, *args: str, port: int | None = None) -> dict:
    result = run("doctor", "openai/gpt-oss-120b", "--venv", venv_of(inst), "--json", "--port", str(port or free_port()), *args)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_doctor_sm90_leaves_the_moe_kernel_to_vllm_and_fast_moe_pins_marlin_with_a_warning(installs):
    default = doctor_json(installs["0.33.0"], "--gpu", "sm90")
    assert "--moe-backend" not in default["command"] and "reproducibility" not in {c["name"] for c in default["checks"]}
    (note,) = [n for n in default["notes"] if n.startswith("MXFP4 MoE kernel left to vLLM (Triton on Hopper)")]
    # the figures docs/performance.md measured, as doctor prints them
    assert f"--fast-moe pins Marlin: faster ({measured.one_stream_speedup_20b()}× generation at one stream" in note, note
    assert f"{measured.one_stream_speedup_120b()}× on 120b" in note, note
    assert f"{measured.marlin_error_ratio()}× the kernel error against float64" in note, note
    fast = doctor_json(installs["0.33.0"], "--gpu", "sm90", "--fast-moe")
    assert fast["command"][fast["command"].index("--moe-backend") + 1] == "marlin"
    (row,) = [c for c in fast["checks"] if c["name"] == "reproducibility"]
    assert row["status"] == "warn" and row["message"].startswith("--fast-moe (Marlin's MoE kernel) gives up accuracy")


def test_doctor_fast_moe_on_sm121_changes_nothing_and_says_so(installs):
    port = free_port()
    plain = doctor_json(installs["0.33.0"], "--gpu", "sm121", port=port)
    fast = doctor_json(installs["0.33.0"], "--gpu", "sm121", "--fast-moe", port=port)
    assert fast["settings"] == plain["settings"] and fast["checks"] == plain["checks"]
    assert [n for n in fast["notes"] if n not in plain["notes"]] == [
        "--fast-moe changes nothing on sm121: Marlin is already pinned, the only MXFP4 MoE kernel stock vLLM has on SM12x"
    ]
    (row,) = [c for c in fast["checks"] if c["name"] == "reproducibility"]
    assert row["status"] == "warn" and row["fix"].startswith("-- --max-num-seqs 1")


@pytest.mark.parametrize("command", ["serve", "doctor", "bench", "numerics"])
def test_deterministic_is_gone(command):
    result = run(command, MODEL, "--deterministic")
    assert result.exit_code == 2 and "No such option '--deterministic'" in result.stderr


# -- serve: bad input stops with one line, nothing started ---------------------------------------


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (("--gpu", "sm999"), "error: unknown GPU profile 'sm999'; choose one of sm90, sm100, sm120, sm121, cpu"),
        (("--concurrency", "5,x"), "error: --concurrency '5,x': expected comma-separated batch sizes from 1 to 1024, e.g. 1,5,10"),
    ],
)
def test_bad_options_are_one_line_before_the_target_is_even_reported(installs, tmp_path, args, line):
    result = serve(installs["0.17.1"], tmp_path, *args)
    assert (result.exit_code, result.stderr) == (2, line + "\n")
    assert not (tmp_path / "record.json").exists()


def test_port_in_use_is_one_error_line_and_nothing_starts(installs, tmp_path):
    inst = installs["0.17.1"]
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = run("serve", MODEL, "--venv", venv_of(inst), "--port", str(port), env=fake(tmp_path, "exit"))
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        detected(inst),
        f"error: cannot listen on 127.0.0.1:{port}: the port is in use; pick another --port, or stop what holds it",
    ]
    assert not (tmp_path / "record.json").exists()


def test_a_missing_model_path_is_one_error_line(installs, tmp_path):
    result = run("serve", "./models/nope", "--venv", venv_of(installs["0.17.1"]), env=fake(tmp_path, "exit"))
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1].startswith("error: model path ./models/nope does not exist; check the path")


def test_a_missing_vllm_executable_is_one_error_line(tmp_path, own_install):
    inst = own_install(tmp_path / "venv", "0.17.1")
    (tmp_path / "venv" / "bin" / "vllm").unlink()
    result = serve(inst, tmp_path)
    assert result.exit_code == 4
    assert result.stderr.splitlines()[-1].startswith(f"error: no vllm executable at {tmp_path / 'venv' / 'bin' / 'vllm'}; reinstall vLLM")


def test_unpatched_refuses_to_start_and_allow_unpatched_says_so_loudly(tmp_path, own_install):
    inst = own_install(tmp_path / "venv", "0.17.1", patched=False)
    refused = serve(inst, tmp_path)
    assert refused.exit_code == 1
    assert refused.stderr.splitlines()[-2:] == [
        "error: pre-flight failed (patches); nothing was started",
        "hint: gptoss-patch doctor shows every check",
    ]
    assert not (tmp_path / "record.json").exists()
    allowed = serve(inst, tmp_path, "--allow-unpatched")
    assert allowed.exit_code == 0
    assert f"warning: STARTING UNPATCHED ({pending_summary(inst)}) because of --allow-unpatched" in allowed.stderr


# -- serve: what it starts -----------------------------------------------------------------------


def test_dry_run_prints_environment_and_command_and_starts_nothing(installs, tmp_path):
    result = serve(installs["0.17.1"], tmp_path, "--gpu", "sm121", "--dry-run")
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[0] == "export VLLM_MXFP4_USE_MARLIN=1"
    assert not any("VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS" in line for line in lines)  # upstream's default
    command = shlex.split(lines[-1])
    assert command[1:3] == ["serve", MODEL] and command[command.index("--host") + 1] == "127.0.0.1"
    assert not (tmp_path / "record.json").exists()


def test_serve_instructions_system_exports_the_variable_and_warns_what_it_drops(installs, tmp_path):
    result = serve(installs["0.17.1"], tmp_path, "--instructions", "system", "--dry-run")
    assert result.exit_code == 0, result.stderr
    assert "export VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS=1" in result.stdout.splitlines()
    words = set(result.stderr.replace("│", " ").split())  # the pre-flight table wraps its cells
    assert "│ instructions │ warn" in result.stderr and {"rendered", "empty:", "lost", "developer", "G02"} <= words


def test_serve_allow_unpatched_tells_a_fail_hook_to_warn_for_that_start(tmp_path, own_install):
    from gptoss_patch.hook import installer

    inst = own_install(tmp_path / "venv", "0.17.1", patched=False)
    installer.install(inst, mode="fail")
    refused = serve(inst, tmp_path, "--dry-run")
    assert refused.exit_code == 1 and "GPTOSS_PATCH_HOOK_MODE" not in refused.stdout
    allowed = serve(inst, tmp_path, "--allow-unpatched", "--dry-run")
    assert allowed.exit_code == 0, allowed.stderr
    assert "export GPTOSS_PATCH_HOOK_MODE=warn" in allowed.stdout.splitlines()
    assert (f"warning: STARTING UNPATCHED ({pending_summary(inst)}) because of --allow-unpatched; "
            "the installed hook is told GPTOSS_PATCH_HOOK_MODE=warn for this start only") in allowed.stderr


def test_print_script_is_valid_bash_that_starts_what_serve_would(installs, tmp_path):
    inst = installs["0.17.1"]
    args = ("--gpu", "sm121", "--concurrency", "5,10", "--", "--served-model-name", "gpt oss")
    port = str(free_port())
    script = run("serve", MODEL, "--venv", venv_of(inst), "--port", port, *args[:4], "--print-script", *args[4:], env=fake(tmp_path))
    assert script.exit_code == 0, script.stderr
    text = script.stdout
    assert text.startswith("#!/usr/bin/env bash\n") and "# SM12x: pin the MXFP4 MoE kernel to Marlin" in text
    (tmp_path / "serve.sh").write_text(text)
    subprocess.run(["bash", "-n", str(tmp_path / "serve.sh")], check=True)
    env = {**os.environ, **fake(tmp_path, "exit")}
    subprocess.run(["bash", str(tmp_path / "serve.sh")], env=env, check=True, capture_output=True)
    dry = run("serve", MODEL, "--venv", venv_of(inst), "--port", port, *args[:4], "--dry-run", *args[4:], env=fake(tmp_path))
    assert read_record(tmp_path / "record.json")["argv"] == shlex.split(dry.stdout.splitlines()[-1])[1:]
    assert read_record(tmp_path / "record.json")["env"]["VLLM_MXFP4_USE_MARLIN"] == "1"


def test_serve_runs_vllm_with_its_log_on_stdout_and_its_exit_code(installs, tmp_path):
    result = serve(installs["0.17.1"], tmp_path, "--gpu", "cpu")
    assert result.exit_code == 0, result.stderr
    assert "Starting vLLM API server 0 on http://127.0.0.1:" in result.stdout
    stderr = result.stderr.splitlines()
    assert "pre-flight" not in result.stderr  # every check passed: no table before the start
    assert stderr[-1].startswith("vLLM exited with code 0; log: ")
    assert "MoE backend: MARLIN" in stderr


def test_a_crash_shows_the_last_lines_and_the_known_issue(installs, tmp_path):
    result = serve(installs["0.17.1"], tmp_path, "--gpu", "cpu", modes=("crash-vocab",))
    assert result.exit_code == 1
    assert "error: vLLM crashed (exit code 1); its last lines:" in result.stderr
    assert "warning: this matches known issue G01: the harmony vocabulary could not be loaded (no network, or a wrong file)" in result.stderr


def test_a_contradicted_pin_stops_vllm_and_exits_1(installs, tmp_path):
    result = serve(installs["0.33.0"], tmp_path, "--gpu", "sm121", modes=("wrong-backend",))
    assert result.exit_code == 1
    assert (
        "error: vLLM selected the FLASHINFER_CUTLASS_MXFP4_MXFP8 MXFP4 MoE backend, but the sm121 profile pinned MARLIN (G14)"
        in result.stderr
    )


def test_serve_smoke_failure_stops_vllm_and_exits_1(installs, tmp_path):
    result = serve(installs["0.17.1"], tmp_path, "--gpu", "cpu", "--smoke", modes=("repetition",))
    assert result.exit_code == 1
    assert "error: the smoke canary failed" in result.stderr
    assert "degenerate repetition" in result.stderr


# -- smoke ---------------------------------------------------------------------------------------


def test_smoke_passes_against_a_healthy_server(fake_server):
    url = fake_server()
    result = run("smoke", url)
    assert result.exit_code == 0, result.stdout
    assert result.stderr.splitlines()[0] == f"Smoke canary: {url} (model {MODEL})"
    for name in ("http", "content", "finish_reason", "repetition", "instruction", "throughput"):
        assert f"│ {name} " in result.stdout


@pytest.mark.parametrize(("mode", "failing"), [
    ("null-content", {"content", "finish_reason", "instruction"}), ("repetition", {"finish_reason", "repetition", "instruction"}),
    ("ignore-system", {"instruction"}),
])  # fmt: skip
def test_smoke_fails_on_each_bad_behaviour(fake_server, mode, failing):
    result = run("smoke", fake_server(mode), "--json")
    payload = json.loads(result.stdout)
    assert result.exit_code == 1 and payload["ok"] is False
    assert {c["name"] for c in payload["checks"] if c["status"] == "fail"} == failing


def test_smoke_uses_the_api_key_from_the_environment(fake_server):
    url = fake_server(extra=("--api-key", "k1"))
    assert run("smoke", url).exit_code == 1  # 401 without it
    assert run("smoke", url, env={"VLLM_API_KEY": "k1"}).exit_code == 0


def test_smoke_rejects_a_non_url_in_one_line():
    result = run("smoke", "localhost:8000")
    assert (result.exit_code, result.stderr) == (
        2, "error: 'localhost:8000' is not an http(s) URL; give the server's base URL, e.g. http://127.0.0.1:8000\n",
    )  # fmt: skip


def test_smoke_reports_an_unreachable_server_as_a_failed_check():
    result = run("smoke", f"http://127.0.0.1:{free_port()}", "--json")
    payload = json.loads(result.stdout)
    assert result.exit_code == 1 and payload["checks"][0]["name"] == "http"
    assert payload["checks"][0]["message"].startswith("cannot reach http://127.0.0.1:")
