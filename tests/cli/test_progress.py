"""Issue 12: progress on long work. One line per step when stderr is not a terminal, a spinner when it is;
`venv create` says how much it may download before it starts; behaviour probes report each start.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from packaging.version import Version
from rich.console import Console

from gptoss_patch import provision as venv_create, registry, render
from gptoss_patch.spec import Selection
from gptoss_patch.verify import behaviour
from gptoss_patch.verify.probes import MARKER
from tests.support import fakesite
from tests.support.cli import run


def fake_python(tmp_path: Path, body: str) -> str:
    """An 'interpreter' that ignores its arguments and runs `body` (sh): a stand-in for the probe process."""
    path = tmp_path / "python"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def event(**fields: object) -> str:
    return f"echo '{MARKER}{json.dumps(fields)}'"


def test_each_probe_start_is_reported_as_it_happens(tmp_path: Path) -> None:
    body = "\n".join([
        event(event="start", id="harmony_instructions"),
        event(event="result", id="harmony_instructions", passed=True, evidence="ok"),
        event(event="start", id="marlin_atomic_add_sm121"),
        "echo 'lots of log' >&2",
        event(event="result", id="marlin_atomic_add_sm121", passed=True, evidence="ok"),
    ])  # fmt: skip
    started: list[str] = []
    results = behaviour._run_probes(fake_python(tmp_path, body), ["harmony_instructions", "marlin_atomic_add_sm121"], {}, False, started.append)
    assert started == ["harmony_instructions", "marlin_atomic_add_sm121"]
    assert [r.passed for r in results.values()] == [True, True]


def test_a_probe_process_past_its_time_is_killed_and_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(behaviour, "TIMEOUT", 1.0)
    body = event(event="start", id="harmony_instructions") + "\nexec sleep 30"
    results = behaviour._run_probes(fake_python(tmp_path, body), ["harmony_instructions"], {}, False)
    assert results["harmony_instructions"].passed is False or results["harmony_instructions"].passed is None
    assert "timed out after 1 s" in results["harmony_instructions"].evidence


def test_verify_behaviour_prints_one_line_per_probe_on_a_pipe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No vocabulary anywhere: the probes that need it are reported "not run" before they start, on any machine.
    (tmp_path / "no-vocabulary").mkdir()
    monkeypatch.setenv("TIKTOKEN_ENCODINGS_BASE", str(tmp_path / "no-vocabulary"))
    fakesite.build(tmp_path / "venv")
    assert run("apply", "--venv", str(tmp_path / "venv")).exit_code == 0
    result = run("verify", "--behaviour", "--venv", str(tmp_path / "venv"))
    probing = [line for line in result.stderr.splitlines() if line.startswith("  probing ")]
    installed = Version("0.17.1")  # fakesite.build's default: a patch out of its range is not probed there
    started = [s.id for s in registry.selected(Selection())
               if s.id in behaviour.probe_ids() and not s.probe_needs_vocabulary and s.band_for(installed) is not None]
    assert started, "no probe runs without the vocabulary: the test would prove nothing"
    assert probing == [f"  probing {pid}" for pid in started]


def test_the_spinner_shows_on_a_terminal_only(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = io.StringIO()
    monkeypatch.setattr(render, "err", Console(file=terminal, force_terminal=True, width=80))
    with render.spinner("vllm==0.17.1"):
        pass
    assert "vllm==0.17.1" in terminal.getvalue()
    pipe = io.StringIO()
    monkeypatch.setattr(render, "err", Console(file=pipe, width=80))
    with render.spinner("vllm==0.17.1"):
        pass
    assert pipe.getvalue() == ""


def test_venv_create_states_the_download_size_first(tmp_path: Path) -> None:
    plan = venv_create.Plan(tmp_path / "new", "0.17.1")
    assert venv_create.download_notice(plan) == (
        "Downloads vllm==0.17.1 (250-510 MB), vLLM's dependencies (about 4 GB: torch, the CUDA libraries), "
        "gptoss-patch's dependencies (a few MB), unless pip's or uv's cache has them."
    )
    (tmp_path / "wheels").mkdir()
    wheel = tmp_path / "wheels" / "vllm-0.17.1-cp38-abi3-manylinux_2_31_x86_64.whl"
    wheel.write_bytes(b"x" * 2_000_000)
    local = venv_create.Plan(tmp_path / "new", "0.17.1", no_deps=True, find_links=(tmp_path / "wheels",))
    assert venv_create.download_notice(local) == f"Uses {wheel} (2 MB). Downloads gptoss-patch's dependencies (a few MB), unless pip's or uv's cache has them."


def test_a_refused_directory_gets_its_error_first_and_no_download_notice(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    refused = run("venv", "create", str(tmp_path / "file"), "--install-vllm", "0.17.1", "--no-deps")
    assert refused.exit_code == 4
    assert refused.stderr.startswith("error: ") and "Downloads" not in refused.stderr
